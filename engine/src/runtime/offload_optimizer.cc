#include "engine/src/runtime/offload_optimizer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

// Times the host thread's waits into `into`.
class WaitTimer {
 public:
  explicit WaitTimer(absl::Duration& into) : into_(into), begin_(absl::Now()) {}
  ~WaitTimer() { into_ += absl::Now() - begin_; }

 private:
  absl::Duration& into_;
  absl::Time begin_;
};

}  // namespace

OffloadOptimizer::OffloadOptimizer(const FlatLayout& layout, const BufferPlan& plan,
                                   const ShardBuffers& buffers, bool mixed, DType param_dtype,
                                   DType grad_dtype, Device& device, Device& host,
                                   std::unique_ptr<SwapFiles> swap)
    : layout_(layout),
      plan_(plan),
      buffers_(buffers),
      mixed_(mixed),
      param_dtype_(param_dtype),
      grad_dtype_(grad_dtype),
      device_(device),
      host_(host),
      swap_(std::move(swap)),
      chunk_numel_(plan.offload_chunk_numel),
      grads_on_host_(plan.Find(kOffloadGradShardBuffer) != nullptr),
      params_on_nvme_(plan.Find(kOffloadParamShardBuffer) != nullptr &&
                      plan.Find(kOffloadParamShardBuffer)->tier == MemoryTier::kNvme) {
  const PlannedBuffer* m = plan.Find(kAdamMBuffer);
  state_numel_ = m != nullptr ? m->numel : 0;
}

OffloadOptimizer::~OffloadOptimizer() {
  // Nothing may still read or write the buffers: finish the streams and the
  // I/O (their errors were reported by the Apply that issued them).
  if (copy_ != nullptr) copy_->Synchronize().IgnoreError();
  if (fetch_ != nullptr) fetch_->Synchronize().IgnoreError();
  if (host_stream_ != nullptr) host_stream_->Synchronize().IgnoreError();
  if (swap_ != nullptr) swap_->WaitAll().IgnoreError();
}

absl::Status OffloadOptimizer::Init() {
  ZS_ASSIGN_OR_RETURN(copy_, device_.CreateStream());
  ZS_ASSIGN_OR_RETURN(fetch_, device_.CreateStream());
  ZS_ASSIGN_OR_RETURN(host_stream_, host_.CreateStream());
  ZS_ASSIGN_OR_RETURN(host_ops_, CreateDeviceOps(host_, *host_stream_));
  for (int s = 0; s < 2; ++s) {
    ZS_ASSIGN_OR_RETURN(copied_in_[s], device_.CreateEvent());
    ZS_ASSIGN_OR_RETURN(updated_[s], host_.CreateEvent());
  }
  return absl::OkStatus();
}

std::vector<StateTensor> OffloadOptimizer::SwappedTensors() const {
  std::vector<StateTensor> out;
  if (mixed_) out.push_back(StateTensor::kMaster);
  out.push_back(StateTensor::kAdamM);
  out.push_back(StateTensor::kAdamV);
  if (params_on_nvme_) out.push_back(StateTensor::kParams);
  return out;
}

int OffloadOptimizer::FileOf(StateTensor tensor) const {
  // The order of SwappedTensors (the plan's NVMe buffers).
  const int base = mixed_ ? 0 : -1;
  return base + static_cast<int>(tensor);
}

int64_t OffloadOptimizer::ElementSize(StateTensor tensor) const {
  return tensor == StateTensor::kParams ? static_cast<int64_t>(DTypeSize(param_dtype_))
                                        : static_cast<int64_t>(sizeof(float));
}

float* OffloadOptimizer::HostState(StateTensor tensor) const {
  switch (tensor) {
    case StateTensor::kMaster:
      return buffers_.master.as<float>();
    case StateTensor::kAdamM:
      return buffers_.adam_m.as<float>();
    case StateTensor::kAdamV:
      return buffers_.adam_v.as<float>();
    case StateTensor::kParams:
      break;  // on the host tier the params are ShardBuffers::ParamsAt
  }
  return nullptr;
}

float* OffloadOptimizer::SlotState(int slot, StateTensor tensor) const {
  return buffers_.offload_state.as<float>() +
         (static_cast<int64_t>(slot) * num_tensors() + FileOf(tensor)) * chunk_numel_;
}

template <typename Fn>
absl::Status OffloadOptimizer::ForEachWindow(StateTensor tensor, int64_t index, int64_t n, Fn fn) {
  const int64_t esize = ElementSize(tensor);
  const int64_t begin = index * esize;
  const int64_t end = (index + n) * esize;
  const int64_t max_window = chunk_numel_ * static_cast<int64_t>(sizeof(float));
  for (int64_t at = begin / kSwapAlignment * kSwapAlignment; at < end;) {
    const int64_t rounded_end = (end + kSwapAlignment - 1) / kSwapAlignment * kSwapAlignment;
    const int64_t window = std::min(max_window, rounded_end - at);
    const int64_t from = std::max(at, begin);
    const int64_t to = std::min(at + window, end);
    ZS_RETURN_IF_ERROR(fn(at, window, from - at, (from - begin) / esize, (to - from) / esize));
    at += window;
  }
  return absl::OkStatus();
}

template <typename Sink>
absl::Status OffloadOptimizer::ReadWindows(StateTensor tensor, int64_t index, int64_t n,
                                           Sink sink) {
  // Whole aligned blocks through the first state slot (free outside Apply).
  const int64_t esize = ElementSize(tensor);
  char* bounce = reinterpret_cast<char*>(SlotState(0, StateTensor::kAdamM));
  return ForEachWindow(tensor, index, n,
                       [&](int64_t offset, int64_t bytes, int64_t skip, int64_t first,
                           int64_t count) -> absl::Status {
                         ZS_RETURN_IF_ERROR(swap_->Read(FileOf(tensor), offset, bounce, bytes));
                         return sink(first * esize, bounce + skip, count * esize);
                       });
}

absl::Status OffloadOptimizer::Read(StateTensor tensor, int64_t index, int64_t n, void* data) {
  if (n <= 0) return absl::OkStatus();
  char* out = static_cast<char*>(data);
  if (!swap_) {
    std::memcpy(out, HostState(tensor) + index, static_cast<size_t>(n * ElementSize(tensor)));
    return absl::OkStatus();
  }
  return ReadWindows(tensor, index, n, [out](int64_t at, const char* src, int64_t bytes) {
    std::memcpy(out + at, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  });
}

absl::Status OffloadOptimizer::ReadToDevice(StateTensor tensor, int64_t index, int64_t n,
                                            void* device) {
  if (n <= 0) return absl::OkStatus();
  char* out = static_cast<char*>(device);
  return ReadWindows(tensor, index, n, [this, out](int64_t at, const char* src, int64_t bytes) {
    return FetchShard(out + at, src, bytes);
  });
}

absl::StatusOr<std::unique_ptr<SwapFiles>> OffloadOptimizer::CreateSwapFiles(const BufferPlan& plan,
                                                                             const std::string& dir,
                                                                             int rank) {
  std::vector<SwapTensor> tensors;
  for (const PlannedBuffer& b : plan.buffers) {
    if (b.tier == MemoryTier::kNvme) tensors.push_back({b.name, b.bytes()});
  }
  SwapOptions options;
  options.dir = dir;
  options.rank = rank;
  return SwapFiles::Create(options, tensors);
}

absl::Status OffloadOptimizer::Write(StateTensor tensor, int64_t index, int64_t n,
                                     const void* data) {
  if (n <= 0) return absl::OkStatus();
  const int64_t esize = ElementSize(tensor);
  if (!swap_) {
    std::memcpy(HostState(tensor) + index, data, static_cast<size_t>(n * esize));
    return absl::OkStatus();
  }
  // Read, modify and write whole aligned blocks (the read is skipped when
  // the window is covered).
  char* bounce = reinterpret_cast<char*>(SlotState(0, StateTensor::kAdamM));
  const char* in = static_cast<const char*>(data);
  return ForEachWindow(tensor, index, n,
                       [&](int64_t offset, int64_t bytes, int64_t skip, int64_t first,
                           int64_t count) -> absl::Status {
                         if (skip > 0 || count * esize < bytes) {
                           ZS_RETURN_IF_ERROR(swap_->Read(FileOf(tensor), offset, bounce, bytes));
                         }
                         std::memcpy(bounce + skip, in + first * esize,
                                     static_cast<size_t>(count * esize));
                         return swap_->Write(FileOf(tensor), offset, bounce, bytes);
                       });
}

void OffloadOptimizer::BuildChunks(const std::vector<UpdateRun>& runs) {
  // Each run is contiguous in the flat space; cut it at chunk boundaries.
  chunks_.clear();
  for (size_t k = 0; k < runs.size(); ++k) {
    const UpdateRun& run = runs[k];
    int64_t seg = run.range.begin;
    while (seg < run.range.end) {
      const int64_t flat = buffers_.OptimizerIndex(run.unit, seg);
      const int64_t c = flat / chunk_numel_;
      const int64_t chunk_begin = c * chunk_numel_;
      const int64_t n = std::min(run.range.end - seg, chunk_begin + chunk_numel_ - flat);
      if (chunks_.empty() || chunks_.back().index != chunk_begin) {
        chunks_.push_back({chunk_begin, std::min(chunk_numel_, state_numel_ - chunk_begin), {}});
      }
      chunks_.back().pieces.push_back({k, run.unit, seg, n, flat - chunk_begin});
      seg += n;
    }
  }
}

absl::Status OffloadOptimizer::OnGradFinal(int unit, const std::shared_ptr<Event>& after) {
  if (!grads_on_host_) return absl::OkStatus();
  const ElementRange owned = buffers_.OwnedRange(unit);
  if (owned.size() <= 0) return absl::OkStatus();
  const int64_t gsize = static_cast<int64_t>(DTypeSize(grad_dtype_));
  if (after != nullptr) ZS_RETURN_IF_ERROR(after->MakeStreamWait(*copy_));
  char* dst =
      buffers_.offload_grad_shard.as<char>() + buffers_.OptimizerIndex(unit, owned.begin) * gsize;
  ZS_RETURN_IF_ERROR(
      device_.CopyAsync(dst, buffers_.GradsAt(unit, owned.begin), owned.size() * gsize, *copy_));
  backward_grad_bytes_ += owned.size() * gsize;
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::FetchShard(void* device, const void* host, int64_t bytes) {
  ZS_RETURN_IF_ERROR(device_.CopyAsync(device, host, bytes, *fetch_));
  return fetch_->Synchronize();
}

absl::Status OffloadOptimizer::Quiesce() {
  backward_grad_bytes_ = 0;
  return copy_->Synchronize();
}

absl::Status OffloadOptimizer::CopyIn(const Chunk& chunk, int slot) {
  const int64_t gsize = static_cast<int64_t>(DTypeSize(grad_dtype_));
  const int64_t psize = static_cast<int64_t>(DTypeSize(param_dtype_));
  // The slots exist only where they are used: gradients not copied during
  // the backward, fp32 params not streamed with the state.
  char* grads =
      grads_on_host_ ? nullptr : buffers_.offload_grads.as<char>() + slot * chunk_numel_ * gsize;
  char* params = mixed_ || params_on_nvme_
                     ? nullptr
                     : buffers_.offload_params.as<char>() + slot * chunk_numel_ * psize;
  for (const Piece& p : chunk.pieces) {
    if (!grads_on_host_) {  // else copied during the backward (OnGradFinal)
      ZS_RETURN_IF_ERROR(device_.CopyAsync(
          grads + p.at * gsize, buffers_.GradsAt(p.unit, p.seg_begin), p.n * gsize, *copy_));
      stats_.bytes_to_host += p.n * gsize;
    }
    if (!mixed_ && !params_on_nvme_) {
      // fp32: the params are the master the update reads and writes.
      ZS_RETURN_IF_ERROR(device_.CopyAsync(
          params + p.at * psize, buffers_.ParamsAt(p.unit, p.seg_begin), p.n * psize, *copy_));
      stats_.bytes_to_host += p.n * psize;
    }
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::CopyOut(const Chunk& chunk, int slot) {
  const int64_t psize = static_cast<int64_t>(DTypeSize(param_dtype_));
  if (params_on_nvme_) return absl::OkStatus();  // written to the swap file with the state
  const char* params = buffers_.offload_params.as<char>() + slot * chunk_numel_ * psize;
  for (const Piece& p : chunk.pieces) {
    ZS_RETURN_IF_ERROR(device_.CopyAsync(buffers_.ParamsAt(p.unit, p.seg_begin),
                                         params + p.at * psize, p.n * psize, *copy_));
    stats_.bytes_to_device += p.n * psize;
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::Update(const ShardOptimizer& optimizer, const Chunk& chunk, int slot,
                                      int state_slot) {
  const int64_t gsize = static_cast<int64_t>(DTypeSize(grad_dtype_));
  const int64_t psize = static_cast<int64_t>(DTypeSize(param_dtype_));
  // The chunk's gradient: its slot, or its place in the host shard.
  const char* grads = grads_on_host_
                          ? buffers_.offload_grad_shard.as<char>() + chunk.index * gsize
                          : buffers_.offload_grads.as<char>() + slot * chunk_numel_ * gsize;
  // The chunk's params: their slot, or with the state on NVMe.
  char* params = params_on_nvme_
                     ? reinterpret_cast<char*>(SlotState(state_slot, StateTensor::kParams))
                     : buffers_.offload_params.as<char>() + slot * chunk_numel_ * psize;
  // The chunk's state: in place on the host tier, its slot on NVMe.
  auto state = [&](StateTensor t) -> float* {
    return swap_ ? SlotState(state_slot, t) : HostState(t) + chunk.index;
  };
  for (const Piece& p : chunk.pieces) {
    AdamArgs args;
    args.variant = optimizer.variant();
    args.grad = grads + p.at * gsize;
    args.m = state(StateTensor::kAdamM) + p.at;
    args.v = state(StateTensor::kAdamV) + p.at;
    args.n = p.n;
    if (mixed_) {
      args.master = state(StateTensor::kMaster) + p.at;
      args.param_out = reinterpret_cast<uint16_t*>(params + p.at * psize);
    } else {
      args.master = reinterpret_cast<float*>(params + p.at * psize);
    }
    ZS_RETURN_IF_ERROR(host_ops_->Adam(args, optimizer.run_constants(p.run)));
  }
  return absl::OkStatus();
}

int64_t OffloadOptimizer::ChunkIoBytes(const Chunk& chunk, StateTensor tensor) const {
  return RoundUpToSwapAlignment(chunk.numel * ElementSize(tensor));
}

absl::Status OffloadOptimizer::IssueIo(const Chunk& chunk, int state_slot, bool write) {
  for (StateTensor tensor : SwappedTensors()) {
    const int64_t bytes = ChunkIoBytes(chunk, tensor);
    const int64_t offset = chunk.index * ElementSize(tensor);
    void* data = SlotState(state_slot, tensor);
    ZS_ASSIGN_OR_RETURN(SwapFiles::Ticket ticket,
                        write ? swap_->WriteAsync(FileOf(tensor), offset, data, bytes)
                              : swap_->ReadAsync(FileOf(tensor), offset, data, bytes));
    (write ? writes_ : reads_)[state_slot].push_back(ticket);
    (write ? stats_.bytes_written : stats_.bytes_read) += bytes;
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::WaitTickets(std::vector<SwapFiles::Ticket>& tickets) {
  absl::Status first;
  for (SwapFiles::Ticket t : tickets) first.Update(swap_->Wait(t));
  tickets.clear();
  return first;
}

absl::Status OffloadOptimizer::Apply(ShardOptimizer& optimizer, double grad_scale, double lr,
                                     const OffloadApplyParts& parts) {
  const absl::Time begin = absl::Now();
  stats_ = OffloadStepStats();
  stats_.bytes_to_host = backward_grad_bytes_;
  backward_grad_bytes_ = 0;
  optimizer.BeginStep(grad_scale, lr);
  BuildChunks(optimizer.runs());
  const int n = static_cast<int>(chunks_.size());
  stats_.chunks = n;
  const bool io = swap_ != nullptr && parts.io;
  // The order of one chunk c (slot c % 2, state slot c % S, S =
  // kOffloadStateSlots): its inputs were copied while chunk c-1 was
  // updated, its state read while c-2 and c-1 were (reads run S - 2 chunks
  // ahead); its params go back and its state is written while c+1 is
  // updated. A slot is reused two (S) chunks later, after the copy stream
  // (the I/O) has finished with it: the copy stream runs in order, and the
  // host waits for a slot's writes before reading into it again.
  constexpr int S = kOffloadStateSlots;
  constexpr int kAhead = S - 2;
  absl::Status status;
  auto run = [&]() -> absl::Status {
    if (n == 0) return absl::OkStatus();
    for (int k = 0; io && k < std::min(kAhead, n); ++k) {
      ZS_RETURN_IF_ERROR(IssueIo(chunks_[k], k % S, /*write=*/false));
    }
    if (parts.copies) ZS_RETURN_IF_ERROR(CopyIn(chunks_[0], 0));
    ZS_RETURN_IF_ERROR(copied_in_[0]->Record(*copy_));
    for (int c = 0; c < n; ++c) {
      const int slot = c % 2;
      const int state_slot = c % S;
      if (io && c + kAhead < n) {
        const int ahead = (c + kAhead) % S;
        ZS_RETURN_IF_ERROR(WaitTickets(writes_[ahead]));  // chunk c-2's writes
        ZS_RETURN_IF_ERROR(IssueIo(chunks_[c + kAhead], ahead, /*write=*/false));
      }
      if (io) {
        WaitTimer t(stats_.wait_read);
        ZS_RETURN_IF_ERROR(WaitTickets(reads_[state_slot]));
      }
      {
        WaitTimer t(stats_.wait_copy_in);
        ZS_RETURN_IF_ERROR(copied_in_[slot]->Synchronize());
      }
      if (parts.update) ZS_RETURN_IF_ERROR(Update(optimizer, chunks_[c], slot, state_slot));
      ZS_RETURN_IF_ERROR(updated_[slot]->Record(*host_stream_));
      if (c + 1 < n) {
        if (parts.copies) ZS_RETURN_IF_ERROR(CopyIn(chunks_[c + 1], (c + 1) % 2));
        ZS_RETURN_IF_ERROR(copied_in_[(c + 1) % 2]->Record(*copy_));
      }
      {
        WaitTimer t(stats_.wait_update);
        ZS_RETURN_IF_ERROR(updated_[slot]->Synchronize());
      }
      if (io) ZS_RETURN_IF_ERROR(IssueIo(chunks_[c], state_slot, /*write=*/true));
      if (parts.copies) ZS_RETURN_IF_ERROR(CopyOut(chunks_[c], slot));
    }
    return absl::OkStatus();
  };
  status = run();
  // Drain whatever was issued, failed or not: the buffers must be quiet
  // before anything else touches them.
  {
    WaitTimer t(stats_.wait_drain);
    for (int s = 0; s < S && swap_ != nullptr; ++s) {
      status.Update(WaitTickets(reads_[s]));
      status.Update(WaitTickets(writes_[s]));
    }
    status.Update(copy_->Synchronize());
    status.Update(host_stream_->Synchronize());
  }
  stats_.total = absl::Now() - begin;
  return status;
}

absl::Status OffloadOptimizer::CheckFiles() const {
  return swap_ ? swap_->CheckFiles() : absl::OkStatus();
}

std::string OffloadOptimizer::Describe() const {
  std::string out =
      absl::StrFormat("optimizer state on the %s tier, streamed in chunks of %d elements",
                      MemoryTierName(tier()), chunk_numel_);
  if (swap_) absl::StrAppend(&out, "; swap files: ", swap_->describe());
  return out;
}

}  // namespace zeroshard::internal
