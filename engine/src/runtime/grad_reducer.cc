#include "engine/src/runtime/grad_reducer.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

GradReducer::GradReducer(const ModelSpec& model, const FlatLayout& layout, const BufferPlan& plan,
                         int rank, DType grad_dtype, int accum_steps, const ShardBuffers& buffers,
                         RuntimeServices& services)
    : model_(model),
      layout_(layout),
      plan_(plan),
      rank_(rank),
      world_(services.comm().size()),
      grad_dtype_(grad_dtype),
      accum_steps_(accum_steps),
      buffers_(buffers),
      services_(services) {
  reduced_count_.assign(layout_.num_units(), 0);
  open_view_.assign(layout_.num_units(), kNoView);
  for (int s = 0; s < plan_.grad_staging_slots; ++s) free_slots_.push_back(s);
}

GradReducer::~GradReducer() {
  for (Reduction& r : queue_) r.handle.Wait().IgnoreError();
}

void GradReducer::BeginNextStep() {
  for (int& count : reduced_count_) count = 0;
}

absl::Status GradReducer::GradFinal(int unit) { return hook_ ? hook_(unit) : absl::OkStatus(); }

absl::StatusOr<int> GradReducer::AcquireSlot() {
  if (free_slots_.empty()) {
    // Only a stage-2 reduction holds a slot until it retires; stages 0-1
    // free theirs at once, so no wait gives one back.
    if (queue_.empty() || queue_.front().slot < 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "GradView: all %d gradient staging buffers are held by open GradViews; reduce a unit "
          "before opening more, or raise TrainSpec::num_grad_buffers",
          plan_.grad_staging_slots));
    }
    ZS_RETURN_IF_ERROR(RetireOldest(WaitSite::kGradViewSlot));
  }
  const int slot = free_slots_.front();
  free_slots_.pop_front();
  return slot;
}

absl::Status GradReducer::RetireOldest(WaitSite site) {
  Reduction r = std::move(queue_.front());
  queue_.pop_front();
  ZS_RETURN_IF_ERROR(services_.WaitComm(r.handle, site));
  if (r.slot >= 0) {
    if (r.micro > 0) {
      // Stage 2, later micro-batch: the reduce-scatter left this rank's
      // summed block in place in the slot; add it to the gradient shard.
      // Reductions retire in issue order, so micro-batches add in order.
      const UnitSegment& seg = layout_.unit(r.unit);
      const ElementRange shard = layout_.ShardRange(r.unit, rank_);
      const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
      ZS_RETURN_IF_ERROR(services_.ops().Accumulate(
          buffers_.GradsAt(r.unit, shard.begin),
          static_cast<char*>(buffers_.StagingSlotData(r.slot)) + shard.begin * elem,
          seg.shard_numel, grad_dtype_));
    }
    free_slots_.push_back(r.slot);
  }
  // In issue order: the unit's last micro-batch completes its gradient.
  if (r.micro == accum_steps_ - 1) ZS_RETURN_IF_ERROR(GradFinal(r.unit));
  return absl::OkStatus();
}

absl::Status GradReducer::Poll() {
  while (!queue_.empty() && queue_.front().handle.Ready()) {
    ZS_RETURN_IF_ERROR(RetireOldest(WaitSite::kStepReductions));
  }
  return absl::OkStatus();
}

absl::Status GradReducer::Drain() {
  // In issue order, so that each unit's norm runs on the compute stream
  // while the host waits for the next unit's reduction.
  while (!queue_.empty()) ZS_RETURN_IF_ERROR(RetireOldest(WaitSite::kStepReductions));
  return absl::OkStatus();
}

absl::StatusOr<void*> GradReducer::OpenView(int unit) {
  const std::string& name = model_.units[unit].name;
  if (open_view_[unit] != kNoView) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GradView(%s) called twice without ReduceGrads in between", name));
  }
  if (reduced_count_[unit] >= accum_steps_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GradView(%s): the unit already has %d micro-batch gradients this step "
                        "(grad_accum_steps); call Step() first",
                        name, reduced_count_[unit]));
  }
  if (!plan_.stage.grads_sharded && reduced_count_[unit] == 0) {
    // Stages 0-1: the first micro-batch writes straight into the full
    // gradient buffer, whose padding is zero and never written.
    open_view_[unit] = kDirectView;
    return buffers_.GradsAt(unit, 0);
  }
  ZS_ASSIGN_OR_RETURN(int slot, AcquireSlot());
  // The slot held another unit: zero this unit's padding so that it reduces
  // (and stays) zero. The trainer overwrites every param element.
  char* data = static_cast<char*>(buffers_.StagingSlotData(slot));
  const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
  for (const ElementRange& pad : layout_.PaddingRanges(unit)) {
    ZS_RETURN_IF_ERROR(services_.ZeroOnCompute(data + pad.begin * elem, pad.size() * elem));
  }
  // The trainer writes the view from the host: the zeroing, and the
  // accumulation that last read the slot, must be done.
  ZS_RETURN_IF_ERROR(services_.SyncCompute());
  open_view_[unit] = slot;
  return static_cast<void*>(data);
}

absl::Status GradReducer::Reduce(int unit) {
  const int open = open_view_[unit];
  if (open == kNoView) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ReduceGrads(%s) without a GradView: get the view, write the gradient, then reduce",
        model_.units[unit].name));
  }
  open_view_[unit] = kNoView;
  const int micro = reduced_count_[unit]++;
  const UnitSegment& seg = layout_.unit(unit);
  const ElementRange shard = layout_.ShardRange(unit, rank_);
  const uint64_t tag = CollectiveLog::UnitTag(unit);
  Communicator& comm = services_.comm();

  if (!plan_.stage.grads_sharded) {
    if (open >= 0) {
      ZS_RETURN_IF_ERROR(services_.ops().Accumulate(buffers_.GradsAt(unit, 0),
                                                    buffers_.StagingSlotData(open),
                                                    seg.padded_numel, grad_dtype_));
      free_slots_.push_back(open);
    }
    if (micro == accum_steps_ - 1) {
      // Stages 0-1 reduce once per step, when the unit's gradient is summed
      // over this rank's micro-batches; asynchronously, so the reduction
      // overlaps the backward of the units before it. The communicator reads
      // the buffer the accumulation above writes: it waits for that work
      // itself (an event on the compute stream), not this thread.
      void* grads = buffers_.GradsAt(unit, 0);
      void* shard_grads = buffers_.GradsAt(unit, shard.begin);
      // One rank reading and writing the same memory moves nothing: the
      // collective is not issued, and the gradient is final once
      // accumulated (same stream).
      if (world_ == 1 && grads == shard_grads) return GradFinal(unit);
      std::shared_ptr<Event> ready;
      if (open >= 0) {
        ZS_ASSIGN_OR_RETURN(ready, services_.RecordCompute());
      }
      Reduction r;
      r.unit = unit;
      r.micro = micro;
      if (!plan_.stage.optimizer_sharded) {
        r.handle = comm.AllReduceAfter(ready, grads, grads, seg.padded_numel, grad_dtype_, tag);
        services_.log().Note(CollectiveKind::kAllReduceGrads, unit, seg.padded_numel);
      } else {
        r.handle =
            comm.ReduceScatterAfter(ready, grads, shard_grads, seg.shard_numel, grad_dtype_, tag);
        services_.log().Note(CollectiveKind::kReduceScatterGrads, unit, seg.shard_numel);
      }
      queue_.push_back(std::move(r));
    }
    return Poll();
  }

  // Stage 2: reduce-scatter every micro-batch. The first writes straight into
  // the gradient shard; later ones reduce in place in the slot and are added
  // when the slot retires.
  void* data = buffers_.StagingSlotData(open);
  const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
  void* recv = micro == 0 ? buffers_.GradsAt(unit, shard.begin)
                          : static_cast<char*>(data) + shard.begin * elem;
  Reduction r;
  r.unit = unit;
  r.slot = open;
  r.micro = micro;
  r.handle = comm.ReduceScatter(data, recv, seg.shard_numel, grad_dtype_, tag);
  services_.log().Note(CollectiveKind::kReduceScatterGrads, unit, seg.shard_numel);
  queue_.push_back(std::move(r));
  return Poll();
}

}  // namespace zeroshard::internal
