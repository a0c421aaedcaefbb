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
// poisoned. One collective is in flight at a time: the next is enqueued once
// the previous one finished.
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
// AsyncCommunicator::SetGroupName.
absl::StatusOr<std::unique_ptr<Communicator>> WrapNcclComm(int ordinal, int rank, int size,
                                                           ncclComm_t comm, CommOptions options,
                                                           std::string group_name);

namespace {

class NcclCommunicator final : public AsyncCommunicator {
 public:
  NcclCommunicator(int ordinal, int rank, int size, ncclComm_t comm, cudaStream_t stream,
                   cudaEvent_t done, Descriptor* host_descriptors, CommOptions options,
                   std::string group_name = "")
      : AsyncCommunicator(rank, size, options),
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
  absl::Status RunCollective(const CollectiveArgs& args, absl::Time deadline) override;
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

  absl::Status ExchangeDescriptors(const CollectiveArgs& args, absl::Time deadline);

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
  // Enqueues the reduce-scatter of `send` (size() blocks of `count`
  // elements) into `recv` (count elements; may be block rank() of send).
  absl::Status EnqueueReduceScatter(const CollectiveArgs& args, const char* send, char* recv,
                                    size_t count, absl::Time deadline);
  absl::Status EnqueueAllReduce(const CollectiveArgs& args, absl::Time deadline);

  const int ordinal_;
  ncclComm_t comm_;
  const cudaStream_t stream_;
  const cudaEvent_t done_;
  // Pinned: size() descriptors, read by the host after the exchange.
  Descriptor* const host_descriptors_;
  ScratchBuffer descriptors_;  // size() descriptors on the device
  ScratchBuffer staging_;      // the blocks a reduce-scatter receives
  ScratchBuffer padded_;       // an all-reduce whose count size() does not divide
  std::atomic<bool> abort_requested_{false};
};

absl::Status NcclCommunicator::TimedOut(const CollectiveArgs& args) const {
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s: a peer of %s did not arrive within %s (NCCL cannot tell which; a rank died, is stuck "
      "or issued fewer collectives); the NCCL communicator was aborted, end the job with "
      "AbortJob",
      Where(args), PeersOf(rank(), size()), absl::FormatDuration(options().timeout)));
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

absl::Status NcclCommunicator::ExchangeDescriptors(const CollectiveArgs& args,
                                                   absl::Time deadline) {
  const size_t bytes = sizeof(Descriptor);
  ZS_RETURN_IF_ERROR(Cuda(args, "cudaMalloc", descriptors_.Reserve(bytes * size())));
  char* mine = descriptors_.data() + bytes * rank();
  host_descriptors_[rank()] = ToDescriptor(args);
  ZS_RETURN_IF_ERROR(Cuda(
      args, "cudaMemcpyAsync(descriptor)",
      cudaMemcpyAsync(mine, &host_descriptors_[rank()], bytes, cudaMemcpyHostToDevice, stream_)));
  ZS_RETURN_IF_ERROR(
      Nccl(args, "ncclAllGather(descriptors)",
           ncclAllGather(mine, descriptors_.data(), bytes, ncclUint8, comm_, stream_), deadline));
  ZS_RETURN_IF_ERROR(Cuda(args, "cudaMemcpyAsync(descriptors)",
                          cudaMemcpyAsync(host_descriptors_, descriptors_.data(), bytes * size(),
                                          cudaMemcpyDeviceToHost, stream_)));
  ZS_RETURN_IF_ERROR(WaitForStream(args, deadline));
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    const CollectiveArgs theirs = FromDescriptor(host_descriptors_[peer]);
    std::string mismatch = DescribeMismatch(args, theirs);
    if (mismatch.empty() && theirs.seq != args.seq) {
      mismatch = absl::StrFormat("sequence number %d vs %d", args.seq, theirs.seq);
    }
    if (!mismatch.empty()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: rank %d issued %s instead (%s); every rank must issue the same collectives in "
          "the same order",
          Where(args), peer, DescribeCollective(theirs), mismatch));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::EnqueueReduceScatter(const CollectiveArgs& args, const char* send,
                                                    char* recv, size_t count, absl::Time deadline) {
  const size_t block = count * DTypeSize(args.dtype);
  ZS_RETURN_IF_ERROR(Cuda(args, "cudaMalloc(staging)", staging_.Reserve(block * size())));
  char* staging = staging_.data();
  // Our own block needs no transfer. It is copied before the sum runs (same
  // stream), so `recv` may be block rank() of `send`.
  ZS_RETURN_IF_ERROR(Cuda(args, "cudaMemcpyAsync(own block)",
                          cudaMemcpyAsync(staging + block * rank(), send + block * rank(), block,
                                          cudaMemcpyDeviceToDevice, stream_)));
  if (size() > 1) {
    ZS_RETURN_IF_ERROR(Nccl(args, "ncclGroupStart", ncclGroupStart(), deadline));
    ncclResult_t rc = ncclSuccess;
    const char* failed = "ncclSend/ncclRecv";
    for (int peer = 0; peer < size() && (rc == ncclSuccess || rc == ncclInProgress); ++peer) {
      if (peer == rank()) continue;
      rc = ncclSend(send + block * peer, block, ncclUint8, peer, comm_, stream_);
      if (rc == ncclSuccess || rc == ncclInProgress) {
        rc = ncclRecv(staging + block * peer, block, ncclUint8, peer, comm_, stream_);
      }
    }
    // The group is closed even after a failed call, so NCCL's group state is
    // left consistent; the first failure is what is reported.
    const ncclResult_t end = ncclGroupEnd();
    if (rc != ncclSuccess && rc != ncclInProgress) return NcclError(Where(args), failed, rc);
    ZS_RETURN_IF_ERROR(
        Nccl(args, "ncclGroupEnd(reduce-scatter sends and receives)", end, deadline));
  }
  kernels::SumType type = kernels::SumType::kFp32;
  ToSumType(args.dtype, &type);  // summable: CheckArguments refused the others
  return Cuda(args, "LaunchRankOrderSum",
              kernels::cuda::LaunchRankOrderSum(staging, size(), count, type, recv, stream_));
}

absl::Status NcclCommunicator::EnqueueAllReduce(const CollectiveArgs& args, absl::Time deadline) {
  const size_t element = DTypeSize(args.dtype);
  const size_t count = static_cast<size_t>(args.count);
  const size_t shard = (count + size() - 1) / size();
  const size_t shard_bytes = shard * element;
  const char* send = static_cast<const char*>(args.send);
  char* recv = static_cast<char*>(args.recv);
  // Reduce-scatter needs size() equal blocks: when size() does not divide
  // count, the data goes through a buffer padded with zeros to size() * shard
  // elements (the padding's sums are computed and dropped).
  char* work = recv;
  if (shard * size() != count) {
    ZS_RETURN_IF_ERROR(Cuda(args, "cudaMalloc(padded)", padded_.Reserve(shard_bytes * size())));
    work = padded_.data();
    ZS_RETURN_IF_ERROR(Cuda(
        args, "cudaMemsetAsync(padding)",
        cudaMemsetAsync(work + count * element, 0, (shard * size() - count) * element, stream_)));
    send = work;
    ZS_RETURN_IF_ERROR(
        Cuda(args, "cudaMemcpyAsync(into padded)",
             cudaMemcpyAsync(work, args.send, count * element, cudaMemcpyDeviceToDevice, stream_)));
  }
  char* my_shard = work + shard_bytes * rank();
  ZS_RETURN_IF_ERROR(EnqueueReduceScatter(args, send, my_shard, shard, deadline));
  if (size() > 1) {
    ZS_RETURN_IF_ERROR(Nccl(args, "ncclAllGather",
                            ncclAllGather(my_shard, work, shard_bytes, ncclUint8, comm_, stream_),
                            deadline));
  }
  if (work != recv) {
    ZS_RETURN_IF_ERROR(
        Cuda(args, "cudaMemcpyAsync(out of padded)",
             cudaMemcpyAsync(recv, work, count * element, cudaMemcpyDeviceToDevice, stream_)));
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
      absl::StrFormat(" of group %d (parent rank %d%s)", color, rank(), group_name()));
}

absl::Status NcclCommunicator::RunCollective(const CollectiveArgs& args, absl::Time deadline) {
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: the NCCL communicator was aborted", Where(args)));
  }
  // The progress thread's current device; cheap when it is already set.
  ScopedCudaDevice on_device(ordinal_);
  if (!on_device.status().ok()) {
    return absl::Status(on_device.status().code(),
                        absl::StrCat(Where(args), ": ", on_device.status().message()));
  }
  if (args.kind != CollectiveKind::kBarrier && args.count > 0) {
    ZS_RETURN_IF_ERROR(CheckDeviceBuffer(
        args, args.send, args.kind == CollectiveKind::kBroadcast ? "broadcast" : "send"));
    if (args.recv != args.send) ZS_RETURN_IF_ERROR(CheckDeviceBuffer(args, args.recv, "recv"));
  }
  // Doubles as the Barrier: every rank must have issued this collective.
  ZS_RETURN_IF_ERROR(ExchangeDescriptors(args, deadline));
  if (args.kind == CollectiveKind::kBarrier || args.count == 0) return absl::OkStatus();

  const size_t bytes = static_cast<size_t>(args.count) * DTypeSize(args.dtype);
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
      ZS_RETURN_IF_ERROR(EnqueueAllReduce(args, deadline));
      break;
    case CollectiveKind::kReduceScatter:
      ZS_RETURN_IF_ERROR(EnqueueReduceScatter(args, static_cast<const char*>(args.send),
                                              static_cast<char*>(args.recv),
                                              static_cast<size_t>(args.count), deadline));
      break;
    case CollectiveKind::kAllGather:
      // Data movement only: bytes, whatever the dtype.
      ZS_RETURN_IF_ERROR(Nccl(args, "ncclAllGather",
                              ncclAllGather(args.send, args.recv, bytes, ncclUint8, comm_, stream_),
                              deadline));
      break;
    case CollectiveKind::kBroadcast:
      ZS_RETURN_IF_ERROR(
          Nccl(args, "ncclBroadcast",
               ncclBroadcast(args.send, args.recv, bytes, ncclUint8, args.root, comm_, stream_),
               deadline));
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  return WaitForStream(args, deadline);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(int ordinal, int rank, int size,
                                                                  const ncclUniqueId& id,
                                                                  CommOptions options,
                                                                  absl::Time deadline) {
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

  return WrapNcclComm(ordinal, rank, size, comm, options, "");
}

absl::StatusOr<std::unique_ptr<Communicator>> WrapNcclComm(int ordinal, int rank, int size,
                                                           ncclComm_t comm, CommOptions options,
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
    // At least 2: a Send or Recv swaps two descriptors.
    cuda_rc = cudaMallocHost(&host_descriptors,
                             sizeof(Descriptor) * static_cast<size_t>(std::max(size, 2)));
  }
  if (cuda_rc != cudaSuccess) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (done != nullptr) cudaEventDestroy(done);
    ncclCommAbort(comm);
    return CudaError(where, call, cuda_rc);
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      ordinal, rank, size, comm, stream, done, static_cast<Descriptor*>(host_descriptors), options,
      std::move(group_name)));
}

}  // namespace internal
}  // namespace zeroshard
