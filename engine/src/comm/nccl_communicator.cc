// The `nccl` backend: one rank per GPU, collectives through NCCL on a CUDA
// stream of the communicator's own.
//
// Sums do not use NCCL's reductions, whose order depends on the algorithm
// and topology NCCL picks: a reduce-scatter is an all-to-all of blocks
// (ncclSend/ncclRecv in one group; per rank the traffic of a ring
// reduce-scatter) into a staging buffer, then one kernel adds the size()
// blocks in rank order (kernels/cuda/rank_order_sum.cu, the element rule of
// kernels/common/rank_order_sum.h, which is the host reduction's), so every
// backend gives the same bits. An all-reduce is that reduce-scatter plus an
// ncclAllGather.
//
// Every collective starts with an all-gather of a small descriptor (kind,
// count, dtype, root, tag, sequence number) that the host compares before any
// data moves: ranks that issued different collectives fail with
// FailedPrecondition instead of handing NCCL mismatched sizes (which would
// hang or corrupt memory). The exchange is also the Barrier. Its price is one
// small all-gather and one host round trip per collective.
//
// The communicator is NCCL-nonblocking (ncclConfig_t::blocking = 0): no NCCL
// call waits for a peer, so the progress thread polls the enqueued work
// (cudaEventQuery) and ncclCommGetAsyncError until done or the deadline; on a
// timeout or an asynchronous error it aborts the NCCL communicator
// (ncclCommAbort, which also ends NCCL's kernels) and the communicator is
// poisoned. One collective (or batch) is in flight at a time: the next is
// enqueued once the previous one finished.
//
// Small collectives issued back to back are batched (collective_batch.h):
// one descriptor exchange for up to kMaxBatchOps of them, their transfers in
// one NCCL group (the reduce-scatters' sends and receives), their sums, then
// their all-gathers and broadcasts in a second group, and one wait. The
// ranks agree on the batch in the descriptor exchange itself: every rank
// sends the descriptors of the collectives it has queued, and the batch is
// the shortest of the offers.
#include "engine/src/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/src/comm/async_communicator.h"
#include "engine/src/comm/collective_batch.h"
#include "engine/src/comm/comm_op.h"
#include "engine/src/comm/reduce.h"
#include "kernels/cuda/rank_order_sum.cuh"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {

absl::Status CudaError(const std::string& where, const char* call, cudaError_t code) {
  cudaGetLastError();  // clear a non-sticky error: a later launch check must not report it
  return absl::InternalError(absl::StrFormat("%s: %s failed: %s (CUDA error %d)", where, call,
                                             cudaGetErrorString(code), static_cast<int>(code)));
}

absl::Status NcclError(const std::string& where, const char* call, ncclResult_t code) {
  const std::string text = absl::StrFormat("%s: %s failed: %s (NCCL error %d)", where, call,
                                           ncclGetErrorString(code), static_cast<int>(code));
  if (code == ncclRemoteError || code == ncclSystemError) {
    return absl::AbortedError(
        absl::StrCat(text, "; a peer or the network between the GPUs failed"));
  }
  return absl::InternalError(text);
}

absl::StatusOr<int> CudaOrdinalOf(const Device& device, const std::string& where) {
  const std::string name = device.name();
  const absl::StatusOr<int> parsed = CudaOrdinal(device);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: device '%s' is not a CUDA device; the nccl backend needs one GPU "
                        "per rank (CreateCudaDevice), or use the local or mpi backend on the CPU",
                        where, name));
  }
  const int ordinal = *parsed;
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || ordinal >= count) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: device %s: this machine has %d CUDA device(s)%s; check the driver and "
        "CUDA_VISIBLE_DEVICES, and give each rank a GPU that exists",
        where, name, rc == cudaSuccess ? count : 0,
        rc == cudaSuccess ? ""
                          : absl::StrCat(" (cudaGetDeviceCount: ", cudaGetErrorString(rc), ")")));
  }
  return ordinal;
}

namespace {

using Descriptor = CollectiveDescriptor;

// "ranks 1, 2, 3" (all but `self`), shortened for large groups.
std::string PeersOf(int self, int size) {
  if (size <= 9) {
    std::vector<int> peers;
    for (int r = 0; r < size; ++r) {
      if (r != self) peers.push_back(r);
    }
    return absl::StrFormat("rank%s %s", peers.size() == 1 ? "" : "s", absl::StrJoin(peers, ", "));
  }
  return absl::StrFormat("ranks 0..%d except %d", size - 1, self);
}

// Polling: spin briefly (a collective of a few kB finishes in microseconds),
// then check about once per millisecond.
class Poller {
 public:
  void Pause() {
    if (++polls_ < 200) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  int polls_ = 0;
};

// A device allocation that grows and is reused across collectives (only one
// collective runs at a time).
class ScratchBuffer {
 public:
  ~ScratchBuffer() { Release(); }
  // Frees the memory now (with the owning GPU current, so that no context is
  // created on another one).
  void Release() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  cudaError_t Reserve(size_t bytes) {
    if (bytes <= bytes_) return cudaSuccess;
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
    const cudaError_t rc = cudaMalloc(&data_, bytes);
    if (rc == cudaSuccess) bytes_ = bytes;
    return rc;
  }
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

// Wraps a joined NCCL communicator (owned from now on; aborted on failure)
// with its stream, event and descriptor buffers. `group_name` as for
// AsyncCommunicator::SetGroupName; `peers` as for NewNcclCommunicator.
absl::StatusOr<std::unique_ptr<Communicator>> WrapNcclComm(int ordinal, int rank, int size,
                                                           ncclComm_t comm, CommOptions options,
                                                           PeerWatch peers, std::string group_name);

namespace {

class NcclCommunicator final : public AsyncCommunicator {
 public:
  NcclCommunicator(int ordinal, int rank, int size, ncclComm_t comm, cudaStream_t stream,
                   cudaEvent_t done, Descriptor* host_descriptors, CommOptions options,
                   PeerWatch peers, std::string group_name = "")
      : AsyncCommunicator(rank, size, options),
        peers_(std::move(peers)),
        ordinal_(ordinal),
        comm_(comm),
        stream_(stream),
        done_(done),
        host_descriptors_(host_descriptors) {
    SetGroupName(std::move(group_name));
    StartProgressThread();
  }

  ~NcclCommunicator() override {
    Shutdown();
    ScopedCudaDevice on_device(ordinal_);
    if (comm_ != nullptr) {
      // Finalize flushes NCCL's pending work, waiting for peers; a peer that
      // is gone must not make destruction hang, so it is bounded like a
      // collective, then Abort.
      bool finalized = false;
      ncclResult_t rc = ncclCommFinalize(comm_);
      const absl::Time deadline = absl::Now() + options().timeout;
      Poller poller;
      while (rc == ncclInProgress && absl::Now() < deadline) {
        poller.Pause();
        if (ncclCommGetAsyncError(comm_, &rc) != ncclSuccess) break;
      }
      finalized = rc == ncclSuccess;
      if (finalized) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    cudaStreamSynchronize(stream_);
    descriptors_.Release();
    staging_.Release();
    padded_.Release();
    cudaStreamDestroy(stream_);
    cudaEventDestroy(done_);
    cudaFreeHost(host_descriptors_);
  }

  std::string backend() const override { return "nccl"; }
  DeviceKind memory_kind() const override { return DeviceKind::kCuda; }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

 protected:
  // NCCL calls on one communicator must come from one thread: sends and
  // receives run on the progress thread, in issue order with the
  // collectives (docs/communicator.md: no deadlock guarantee on nccl yet).
  void StartPointToPoint(const PointToPointArgs& args,
                         std::shared_ptr<CommOpState> state) override {
    IssueOnProgressThread(
        std::move(state), DescribePointToPoint(args),
        [this, args](absl::Time deadline) { return RunPointToPoint(args, deadline); });
  }
  absl::Status RunCollective(const CollectiveArgs& args, absl::Time deadline) override {
    return RunBatch(absl::MakeConstSpan(&args, 1), deadline).status();
  }
  int max_batch() const override { return kMaxBatchOps; }
  absl::StatusOr<int> RunBatch(absl::Span<const CollectiveArgs> offered,
                               absl::Time deadline) override;
  void OnPoisoned(const absl::Status& error) override { AbortNccl(); }
  void RequestAbort() override { abort_requested_.store(true); }

 private:
  // "nccl comm rank 2: AllReduce #5 (count 10, fp32)".
  std::string Where(const CollectiveArgs& args) const {
    return absl::StrFormat("%s: %s", ErrorPrefix(), DescribeCollective(args));
  }

  absl::Status CheckDeviceBuffer(const CollectiveArgs& args, const void* ptr,
                                 const char* which) const;
  // Turns the return code of an NCCL call into a Status; for ncclInProgress
  // (the nonblocking communicator's "enqueueing") polls until NCCL finished
  // enqueueing or the deadline passed.
  absl::Status Nccl(const CollectiveArgs& args, const char* call, ncclResult_t rc,
                    absl::Time deadline);
  absl::Status Cuda(const CollectiveArgs& args, const char* call, cudaError_t rc) const {
    return rc == cudaSuccess ? absl::OkStatus() : CudaError(Where(args), call, rc);
  }
  // Waits for everything enqueued on the stream so far.
  absl::Status WaitForStream(const CollectiveArgs& args, absl::Time deadline);
  // One poll of NCCL's asynchronous error and of the deadline.
  absl::Status CheckProgress(const CollectiveArgs& args, absl::Time deadline);
  absl::Status TimedOut(const CollectiveArgs& args) const;
  void AbortNccl() {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Sends this rank's offer, receives every rank's, and returns how many of
  // `offered` every rank runs now (AgreeOnBatch).
  absl::StatusOr<int> ExchangeDescriptors(absl::Span<const CollectiveArgs> offered,
                                          absl::Time deadline);
  // Enqueues `ops` (agreed, buffers independent) on the stream.
  absl::Status EnqueueBatch(absl::Span<const CollectiveArgs> ops, absl::Time deadline);
  // Calls `post(i)` for each i inside one NCCL group; the group is closed
  // even after a failed call, so NCCL's group state stays consistent, and
  // the first failure is what is reported.
  template <typename Post>
  absl::Status NcclGroup(const CollectiveArgs& args, const char* what, int n, Post post,
                         absl::Time deadline);

  // Send and Recv (progress thread): both ranks swap a descriptor of their
  // operation and compare it, then move the data.
  absl::Status RunPointToPoint(const PointToPointArgs& args, absl::Time deadline);
  // The polling helpers above for an operation named by `where` (the peer
  // is known, so a timeout names it).
  absl::Status NcclAt(const std::string& where, int peer, const char* call, ncclResult_t rc,
                      absl::Time deadline);
  absl::Status CheckProgressAt(const std::string& where, int peer, absl::Time deadline);
  absl::Status WaitForStreamAt(const std::string& where, int peer, absl::Time deadline);
  // ncclCommSplit on the progress thread; *child null for color < 0.
  absl::Status RunSplit(int color, int key, absl::Time deadline, ncclComm_t* child);

  // Only the progress thread uses it (CheckProgress, TimedOut).
  PeerWatch peers_;
  const int ordinal_;
  ncclComm_t comm_;
  const cudaStream_t stream_;
  const cudaEvent_t done_;
  // Pinned: size() descriptors, read by the host after the exchange.
  Descriptor* const host_descriptors_;  // size() * kBatchSlots
  ScratchBuffer descriptors_;           // size() * kBatchSlots descriptors on the device
  ScratchBuffer staging_;               // the blocks the batch's reduce-scatters receive
  ScratchBuffer padded_;  // the batch's all-reduces whose count size() does not divide
  std::atomic<bool> abort_requested_{false};
};

absl::Status NcclCommunicator::TimedOut(const CollectiveArgs& args) const {
  const std::string known = peers_.DescribePeers();
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s: a peer of %s did not arrive within %s (NCCL cannot tell which; a rank died, is stuck "
      "or issued fewer collectives)%s; the NCCL communicator was aborted, end the job with "
      "AbortJob",
      Where(args), PeersOf(rank(), size()), absl::FormatDuration(options().timeout),
      known.empty() ? "" : absl::StrCat("; of the peers: ", known)));
}

absl::Status NcclCommunicator::CheckProgress(const CollectiveArgs& args, absl::Time deadline) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
  if (rc != ncclSuccess) return NcclError(Where(args), "ncclCommGetAsyncError", rc);
  if (async != ncclSuccess && async != ncclInProgress) {
    return NcclError(Where(args), "NCCL (asynchronous error)", async);
  }
  if (abort_requested_.load()) {
    return absl::CancelledError(absl::StrFormat(
        "%s: the communicator was destroyed while the collective waited", Where(args)));
  }
  // A peer known gone will never arrive: fail now, naming it.
  ZS_RETURN_IF_ERROR(peers_.CheckPeers(Where(args)));
  if (absl::Now() >= deadline) return TimedOut(args);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Nccl(const CollectiveArgs& args, const char* call, ncclResult_t rc,
                                    absl::Time deadline) {
  Poller poller;
  while (rc == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) return NcclError(Where(args), "ncclCommGetAsyncError", query);
    rc = state;
    if (rc != ncclInProgress) break;
    ZS_RETURN_IF_ERROR(CheckProgress(args, deadline));
    poller.Pause();
  }
  return rc == ncclSuccess ? absl::OkStatus() : NcclError(Where(args), call, rc);
}

absl::Status NcclCommunicator::WaitForStream(const CollectiveArgs& args, absl::Time deadline) {
  ZS_RETURN_IF_ERROR(Cuda(args, "cudaEventRecord", cudaEventRecord(done_, stream_)));
  Poller poller;
  while (true) {
    const cudaError_t rc = cudaEventQuery(done_);
    if (rc == cudaSuccess) return absl::OkStatus();
    if (rc != cudaErrorNotReady) return Cuda(args, "cudaEventQuery", rc);
    ZS_RETURN_IF_ERROR(CheckProgress(args, deadline));
    poller.Pause();
  }
}

absl::Status NcclCommunicator::CheckDeviceBuffer(const CollectiveArgs& args, const void* ptr,
                                                 const char* which) const {
  cudaPointerAttributes attributes;
  const cudaError_t rc = cudaPointerGetAttributes(&attributes, ptr);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of a bad pointer
    return CudaError(Where(args), "cudaPointerGetAttributes", rc);
  }
  const bool on_device =
      attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  if (!on_device || attributes.device != ordinal_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the %s buffer is %s; the nccl backend needs device memory of cuda:%d "
                        "(Device::Allocate on this rank's CUDA device)",
                        Where(args), which,
                        on_device ? absl::StrFormat("memory of cuda:%d", attributes.device)
                                  : std::string("host memory"),
                        ordinal_));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> NcclCommunicator::ExchangeDescriptors(absl::Span<const CollectiveArgs> offered,
                                                          absl::Time deadline) {
  const CollectiveArgs& first = offered[0];
  const size_t bytes = sizeof(Descriptor) * kBatchSlots;
  ZS_RETURN_IF_ERROR(Cuda(first, "cudaMalloc", descriptors_.Reserve(bytes * size())));
  char* mine = descriptors_.data() + bytes * rank();
  Descriptor* my_slots = host_descriptors_ + static_cast<size_t>(kBatchSlots) * rank();
  PackBatchOffer(offered, my_slots);
  ZS_RETURN_IF_ERROR(Cuda(first, "cudaMemcpyAsync(descriptors)",
                          cudaMemcpyAsync(mine, my_slots, bytes, cudaMemcpyHostToDevice, stream_)));
  ZS_RETURN_IF_ERROR(
      Nccl(first, "ncclAllGather(descriptors)",
           ncclAllGather(mine, descriptors_.data(), bytes, ncclUint8, comm_, stream_), deadline));
  ZS_RETURN_IF_ERROR(Cuda(first, "cudaMemcpyAsync(descriptors)",
                          cudaMemcpyAsync(host_descriptors_, descriptors_.data(), bytes * size(),
                                          cudaMemcpyDeviceToHost, stream_)));
  ZS_RETURN_IF_ERROR(WaitForStream(first, deadline));
  return AgreeOnBatch(host_descriptors_, size(), rank(), offered, ErrorPrefix());
}

template <typename Post>
absl::Status NcclCommunicator::NcclGroup(const CollectiveArgs& args, const char* what, int n,
                                         Post post, absl::Time deadline) {
  ZS_RETURN_IF_ERROR(Nccl(args, "ncclGroupStart", ncclGroupStart(), deadline));
  ncclResult_t rc = ncclSuccess;
  const char* failed = what;
  for (int i = 0; i < n && (rc == ncclSuccess || rc == ncclInProgress); ++i) {
    rc = post(i, &failed);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (rc != ncclSuccess && rc != ncclInProgress) return NcclError(Where(args), failed, rc);
  return Nccl(args, "ncclGroupEnd", end, deadline);
}

absl::Status NcclCommunicator::EnqueueBatch(absl::Span<const CollectiveArgs> ops,
                                            absl::Time deadline) {
  // Per collective: where its reduce-scatter (all-reduces and
  // reduce-scatters) reads, sums into and stages, and for an all-reduce the
  // buffer it works in (recv, or a zero-padded copy when size() does not
  // divide count: the padding's sums are computed and dropped).
  struct Work {
    bool sums = false;
    const char* rs_send = nullptr;
    char* rs_recv = nullptr;
    size_t rs_count = 0;  // elements per block
    size_t block = 0;     // bytes per block
    size_t staging = 0;   // offset into staging_
    char* work = nullptr;
    size_t padded = 0;  // offset into padded_ (all-reduce with padding)
    bool uses_padding = false;
  };
  std::vector<Work> work(ops.size());
  size_t staging_bytes = 0, padded_bytes = 0;
  const auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveArgs& a = ops[i];
    Work& w = work[i];
    if (a.count == 0) continue;
    const size_t element = DTypeSize(a.dtype);
    const size_t count = static_cast<size_t>(a.count);
    if (a.kind == CollectiveKind::kReduceScatter) {
      w.sums = true;
      w.rs_count = count;
    } else if (a.kind == CollectiveKind::kAllReduce) {
      w.sums = true;
      w.rs_count = (count + size() - 1) / size();
      w.uses_padding = w.rs_count * size() != count;
      if (w.uses_padding) {
        w.padded = padded_bytes;
        padded_bytes += align(w.rs_count * size() * element);
      }
    }
    if (w.sums) {
      w.block = w.rs_count * element;
      w.staging = staging_bytes;
      staging_bytes += align(w.block * size());
    }
  }
  const CollectiveArgs& first = ops[0];
  if (staging_bytes > 0) {
    ZS_RETURN_IF_ERROR(Cuda(first, "cudaMalloc(staging)", staging_.Reserve(staging_bytes)));
  }
  if (padded_bytes > 0) {
    ZS_RETURN_IF_ERROR(Cuda(first, "cudaMalloc(padded)", padded_.Reserve(padded_bytes)));
  }
  // Inputs in place: padded copies, and each reduce-scatter's own block into
  // its staging (copied before the sum runs, on the same stream, so `recv`
  // may be block rank() of `send`).
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveArgs& a = ops[i];
    Work& w = work[i];
    if (!w.sums) continue;
    const size_t element = DTypeSize(a.dtype);
    const size_t count = static_cast<size_t>(a.count);
    if (a.kind == CollectiveKind::kReduceScatter) {
      w.rs_send = static_cast<const char*>(a.send);
      w.rs_recv = static_cast<char*>(a.recv);
    } else {
      w.work = static_cast<char*>(a.recv);
      if (w.uses_padding) {
        w.work = padded_.data() + w.padded;
        ZS_RETURN_IF_ERROR(Cuda(a, "cudaMemsetAsync(padding)",
                                cudaMemsetAsync(w.work + count * element, 0,
                                                (w.rs_count * size() - count) * element, stream_)));
        ZS_RETURN_IF_ERROR(Cuda(
            a, "cudaMemcpyAsync(into padded)",
            cudaMemcpyAsync(w.work, a.send, count * element, cudaMemcpyDeviceToDevice, stream_)));
      }
      w.rs_send = w.uses_padding ? w.work : static_cast<const char*>(a.send);
      w.rs_recv = w.work + w.block * rank();
    }
    char* staging = staging_.data() + w.staging;
    ZS_RETURN_IF_ERROR(
        Cuda(a, "cudaMemcpyAsync(own block)",
             cudaMemcpyAsync(staging + w.block * rank(), w.rs_send + w.block * rank(), w.block,
                             cudaMemcpyDeviceToDevice, stream_)));
  }
  // Group 1: every reduce-scatter's blocks to their owners.
  std::vector<int> sums;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (work[i].sums) sums.push_back(static_cast<int>(i));
  }
  if (size() > 1 && !sums.empty()) {
    ZS_RETURN_IF_ERROR(NcclGroup(
        first, "ncclSend/ncclRecv", static_cast<int>(sums.size()),
        [&](int k, const char** failed) {
          const Work& w = work[sums[k]];
          char* staging = staging_.data() + w.staging;
          ncclResult_t rc = ncclSuccess;
          for (int peer = 0; peer < size() && (rc == ncclSuccess || rc == ncclInProgress); ++peer) {
            if (peer == rank()) continue;
            *failed = "ncclSend";
            rc = ncclSend(w.rs_send + w.block * peer, w.block, ncclUint8, peer, comm_, stream_);
            if (rc == ncclSuccess || rc == ncclInProgress) {
              *failed = "ncclRecv";
              rc = ncclRecv(staging + w.block * peer, w.block, ncclUint8, peer, comm_, stream_);
            }
          }
          return rc;
        },
        deadline));
  }
  // The sums, in rank order.
  for (int i : sums) {
    const Work& w = work[i];
    kernels::SumType type = kernels::SumType::kFp32;
    ToSumType(ops[i].dtype, &type);  // summable: CheckArguments refused the others
    ZS_RETURN_IF_ERROR(
        Cuda(ops[i], "LaunchRankOrderSum",
             kernels::cuda::LaunchRankOrderSum(staging_.data() + w.staging, size(), w.rs_count,
                                               type, w.rs_recv, stream_)));
  }
  // Group 2: the all-reduces' all-gathers, the all-gathers and broadcasts.
  std::vector<int> gathers;
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveArgs& a = ops[i];
    if (a.count == 0) continue;
    if (a.kind == CollectiveKind::kAllGather || a.kind == CollectiveKind::kBroadcast ||
        (a.kind == CollectiveKind::kAllReduce && size() > 1)) {
      gathers.push_back(static_cast<int>(i));
    }
  }
  if (!gathers.empty()) {
    ZS_RETURN_IF_ERROR(NcclGroup(
        first, "ncclAllGather/ncclBroadcast", static_cast<int>(gathers.size()),
        [&](int k, const char** failed) {
          const CollectiveArgs& a = ops[gathers[k]];
          const Work& w = work[gathers[k]];
          const size_t bytes = static_cast<size_t>(a.count) * DTypeSize(a.dtype);
          switch (a.kind) {
            case CollectiveKind::kAllReduce:
              *failed = "ncclAllGather(all-reduce)";
              return ncclAllGather(w.rs_recv, w.work, w.block, ncclUint8, comm_, stream_);
            case CollectiveKind::kAllGather:
              // Data movement only: bytes, whatever the dtype.
              *failed = "ncclAllGather";
              return ncclAllGather(a.send, a.recv, bytes, ncclUint8, comm_, stream_);
            default:
              *failed = "ncclBroadcast";
              return ncclBroadcast(a.send, a.recv, bytes, ncclUint8, a.root, comm_, stream_);
          }
        },
        deadline));
  }
  // Out of the padded buffers.
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveArgs& a = ops[i];
    if (!work[i].uses_padding) continue;
    ZS_RETURN_IF_ERROR(Cuda(
        a, "cudaMemcpyAsync(out of padded)",
        cudaMemcpyAsync(a.recv, work[i].work, static_cast<size_t>(a.count) * DTypeSize(a.dtype),
                        cudaMemcpyDeviceToDevice, stream_)));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::CheckProgressAt(const std::string& where, int peer,
                                               absl::Time deadline) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
  if (rc != ncclSuccess) return NcclError(where, "ncclCommGetAsyncError", rc);
  if (async != ncclSuccess && async != ncclInProgress) {
    return NcclError(where, "NCCL (asynchronous error)", async);
  }
  if (abort_requested_.load()) {
    return absl::CancelledError(
        absl::StrFormat("%s: the communicator was destroyed while it waited", where));
  }
  ZS_RETURN_IF_ERROR(peers_.CheckPeers(where));
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s: timed out after %s waiting for rank %d (it did not issue the matching operation, "
        "issued its sends and receives with this rank in another order, died or is stuck); the "
        "NCCL communicator was aborted, end the job with AbortJob",
        where, absl::FormatDuration(options().timeout), peer));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::NcclAt(const std::string& where, int peer, const char* call,
                                      ncclResult_t rc, absl::Time deadline) {
  Poller poller;
  while (rc == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) return NcclError(where, "ncclCommGetAsyncError", query);
    rc = state;
    if (rc != ncclInProgress) break;
    ZS_RETURN_IF_ERROR(CheckProgressAt(where, peer, deadline));
    poller.Pause();
  }
  return rc == ncclSuccess ? absl::OkStatus() : NcclError(where, call, rc);
}

absl::Status NcclCommunicator::WaitForStreamAt(const std::string& where, int peer,
                                               absl::Time deadline) {
  cudaError_t rc = cudaEventRecord(done_, stream_);
  if (rc != cudaSuccess) return CudaError(where, "cudaEventRecord", rc);
  Poller poller;
  while ((rc = cudaEventQuery(done_)) != cudaSuccess) {
    if (rc != cudaErrorNotReady) return CudaError(where, "cudaEventQuery", rc);
    ZS_RETURN_IF_ERROR(CheckProgressAt(where, peer, deadline));
    poller.Pause();
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::RunPointToPoint(const PointToPointArgs& args, absl::Time deadline) {
  const std::string where = absl::StrFormat("%s: %s", ErrorPrefix(), DescribePointToPoint(args));
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: the NCCL communicator was aborted", where));
  }
  ScopedCudaDevice on_device(ordinal_);
  if (!on_device.status().ok()) {
    return absl::Status(on_device.status().code(),
                        absl::StrCat(where, ": ", on_device.status().message()));
  }
  void* buffer = args.is_send ? const_cast<void*>(args.send) : args.recv;
  if (args.count > 0) {
    cudaPointerAttributes attributes;
    const cudaError_t rc = cudaPointerGetAttributes(&attributes, buffer);
    if (rc != cudaSuccess) return CudaError(where, "cudaPointerGetAttributes", rc);
    const bool on_gpu =
        attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
    if (!on_gpu || attributes.device != ordinal_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the buffer is not device memory of cuda:%d; the nccl backend moves GPU memory",
          where, ordinal_));
    }
  }
  // NCCL pairs a rank's sends and receives with a peer in issue order,
  // without tags: the descriptors catch a count, dtype or tag that differs
  // (or two sends meeting) before any data moves, which NCCL would not.
  const size_t bytes = sizeof(Descriptor);
  cudaError_t crc = descriptors_.Reserve(2 * bytes);
  if (crc != cudaSuccess) return CudaError(where, "cudaMalloc(descriptors)", crc);
  Descriptor& mine = host_descriptors_[0];
  mine = Descriptor{args.is_send ? 1 : 0,
                    args.count,
                    static_cast<int64_t>(args.dtype),
                    0,
                    static_cast<int64_t>(args.index),
                    0,
                    args.tag};
  crc = cudaMemcpyAsync(descriptors_.data(), &mine, bytes, cudaMemcpyHostToDevice, stream_);
  if (crc != cudaSuccess) return CudaError(where, "cudaMemcpyAsync(descriptor)", crc);
  ZS_RETURN_IF_ERROR(NcclAt(where, args.peer, "ncclGroupStart", ncclGroupStart(), deadline));
  ncclResult_t rc = ncclSend(descriptors_.data(), bytes, ncclUint8, args.peer, comm_, stream_);
  if (rc == ncclSuccess || rc == ncclInProgress) {
    rc = ncclRecv(descriptors_.data() + bytes, bytes, ncclUint8, args.peer, comm_, stream_);
  }
  const ncclResult_t end = ncclGroupEnd();  // closed even after a failed call
  if (rc != ncclSuccess && rc != ncclInProgress) {
    return NcclError(where, "ncclSend/ncclRecv(descriptors)", rc);
  }
  ZS_RETURN_IF_ERROR(NcclAt(where, args.peer, "ncclGroupEnd(descriptors)", end, deadline));
  crc = cudaMemcpyAsync(&host_descriptors_[1], descriptors_.data() + bytes, bytes,
                        cudaMemcpyDeviceToHost, stream_);
  if (crc != cudaSuccess) return CudaError(where, "cudaMemcpyAsync(descriptor)", crc);
  ZS_RETURN_IF_ERROR(WaitForStreamAt(where, args.peer, deadline));
  const Descriptor& theirs_raw = host_descriptors_[1];
  PointToPointArgs theirs;
  theirs.is_send = theirs_raw.kind == 1;
  theirs.count = theirs_raw.count;
  theirs.dtype = static_cast<DType>(theirs_raw.dtype);
  theirs.peer = rank();
  theirs.tag = theirs_raw.tag;
  theirs.index = static_cast<uint64_t>(theirs_raw.seq);
  std::string diff;
  if (theirs.is_send == args.is_send) {
    diff = args.is_send ? "both sent" : "both received";
  } else if (theirs.tag != args.tag) {
    diff = absl::StrFormat("tag %d vs %d", args.tag, theirs.tag);
  } else {
    diff = DescribePointToPointMismatch(args, theirs);
  }
  if (!diff.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: does not match rank %d's %s (%s); on nccl two ranks must issue their sends and "
        "receives with each other in the same order, with the same count, dtype and tag",
        where, args.peer, DescribePointToPoint(theirs), diff));
  }
  if (args.count == 0) return absl::OkStatus();
  const size_t data_bytes = static_cast<size_t>(args.count) * DTypeSize(args.dtype);
  rc = args.is_send ? ncclSend(buffer, data_bytes, ncclUint8, args.peer, comm_, stream_)
                    : ncclRecv(buffer, data_bytes, ncclUint8, args.peer, comm_, stream_);
  ZS_RETURN_IF_ERROR(
      NcclAt(where, args.peer, args.is_send ? "ncclSend" : "ncclRecv", rc, deadline));
  return WaitForStreamAt(where, args.peer, deadline);
}

absl::Status NcclCommunicator::RunSplit(int color, int key, absl::Time deadline,
                                        ncclComm_t* child) {
  const std::string where =
      absl::StrFormat("%s: Split(color %d, key %d)", ErrorPrefix(), color, key);
  *child = nullptr;
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: the NCCL communicator was aborted", where));
  }
  ScopedCudaDevice on_device(ordinal_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t rc =
      ncclCommSplit(comm_, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, child, &config);
  // The split is collective over this communicator: its progress is this
  // communicator's (and, once made, the child's).
  Poller poller;
  while (rc == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    if (state == ncclSuccess && *child != nullptr) {
      if (ncclCommGetAsyncError(*child, &state) != ncclSuccess) break;
    }
    rc = state;
    if (rc != ncclInProgress) break;
    if (absl::Now() >= deadline) {
      if (*child != nullptr) ncclCommAbort(*child);
      *child = nullptr;
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: ncclCommSplit did not finish within %s (NCCL cannot tell which of %s is missing); "
          "the NCCL communicator was aborted, end the job with AbortJob",
          where, absl::FormatDuration(options().timeout), PeersOf(rank(), size())));
    }
    poller.Pause();
  }
  if (rc != ncclSuccess) {
    if (*child != nullptr) ncclCommAbort(*child);
    *child = nullptr;
    return NcclError(where, "ncclCommSplit", rc);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Split(int color, int key) {
  // The agreement first (a collective: a rank that does not call Split is a
  // timeout here, as for any collective), then NCCL's split.
  ZS_ASSIGN_OR_RETURN(const std::vector<int> members, AgreeOnSplit(color, key));
  ncclComm_t child = nullptr;
  auto state = std::make_shared<CommOpState>();
  IssueOnProgressThread(state, absl::StrFormat("Split(color %d, key %d)", color, key),
                        [this, color, key, &child](absl::Time deadline) {
                          return RunSplit(color, key, deadline, &child);
                        });
  ZS_RETURN_IF_ERROR(state->Wait());
  if (color < 0) return std::unique_ptr<Communicator>();
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  return WrapNcclComm(
      ordinal_, new_rank, static_cast<int>(members.size()), child, options(),
      peers_.Subset(members, new_rank),
      absl::StrFormat(" of group %d (parent rank %d%s)", color, rank(), group_name()));
}

absl::StatusOr<int> NcclCommunicator::RunBatch(absl::Span<const CollectiveArgs> offered,
                                               absl::Time deadline) {
  const CollectiveArgs& first = offered[0];
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: the NCCL communicator was aborted", Where(first)));
  }
  // The progress thread's current device; cheap when it is already set.
  ScopedCudaDevice on_device(ordinal_);
  if (!on_device.status().ok()) {
    return absl::Status(on_device.status().code(),
                        absl::StrCat(Where(first), ": ", on_device.status().message()));
  }
  for (const CollectiveArgs& args : offered) {
    if (args.kind == CollectiveKind::kBarrier || args.count == 0) continue;
    ZS_RETURN_IF_ERROR(CheckDeviceBuffer(
        args, args.send, args.kind == CollectiveKind::kBroadcast ? "broadcast" : "send"));
    if (args.recv != args.send) ZS_RETURN_IF_ERROR(CheckDeviceBuffer(args, args.recv, "recv"));
  }
  // Doubles as the Barrier: every rank must have issued these collectives.
  ZS_ASSIGN_OR_RETURN(const int n, ExchangeDescriptors(offered, deadline));
  const absl::Span<const CollectiveArgs> ops = offered.subspan(0, n);
  ZS_RETURN_IF_ERROR(EnqueueBatch(ops, deadline));
  ZS_RETURN_IF_ERROR(WaitForStream(first, deadline));
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(int ordinal, int rank, int size,
                                                                  const ncclUniqueId& id,
                                                                  CommOptions options,
                                                                  absl::Time deadline,
                                                                  PeerWatch peers) {
  const std::string where = absl::StrFormat("nccl comm rank %d (cuda:%d)", rank, ordinal);
  ScopedCudaDevice on_device(ordinal);
  if (!on_device.status().ok()) {
    return absl::Status(on_device.status().code(),
                        absl::StrCat(where, ": ", on_device.status().message()));
  }

  // Nonblocking, so that joining (which waits for every rank) can time out.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  Poller poller;
  while (rc == ncclInProgress && comm != nullptr) {
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: ncclCommInitRankConfig: not every one of the %d ranks joined within %s (NCCL "
          "cannot tell which of %s is missing); every rank must create its communicator",
          where, size, absl::FormatDuration(options.timeout), PeersOf(rank, size)));
    }
    poller.Pause();
    if (ncclCommGetAsyncError(comm, &rc) != ncclSuccess) break;
  }
  if (rc != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclError(where, "ncclCommInitRankConfig", rc);
  }

  return WrapNcclComm(ordinal, rank, size, comm, options, std::move(peers), "");
}

absl::StatusOr<std::unique_ptr<Communicator>> WrapNcclComm(int ordinal, int rank, int size,
                                                           ncclComm_t comm, CommOptions options,
                                                           PeerWatch peers,
                                                           std::string group_name) {
  const std::string where =
      absl::StrFormat("nccl comm rank %d%s (cuda:%d)", rank, group_name, ordinal);
  ScopedCudaDevice on_device(ordinal);
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  void* host_descriptors = nullptr;
  cudaError_t cuda_rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const char* call = "cudaStreamCreateWithFlags";
  if (cuda_rc == cudaSuccess) {
    call = "cudaEventCreateWithFlags";
    cuda_rc = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  }
  if (cuda_rc == cudaSuccess) {
    call = "cudaMallocHost(descriptors)";
    cuda_rc = cudaMallocHost(&host_descriptors,
                             sizeof(Descriptor) * kBatchSlots * static_cast<size_t>(size));
  }
  if (cuda_rc != cudaSuccess) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (done != nullptr) cudaEventDestroy(done);
    ncclCommAbort(comm);
    return CudaError(where, call, cuda_rc);
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      ordinal, rank, size, comm, stream, done, static_cast<Descriptor*>(host_descriptors), options,
      std::move(peers), std::move(group_name)));
}

}  // namespace internal
}  // namespace zeroshard
