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
  const int units = layout_.num_spec_units();
  grad_segments_.resize(units);
  reduced_count_.assign(units, 0);
  open_view_.resize(units);
  for (int s = 0; s < layout_.num_units(); ++s) {
    for (int u : layout_.UsersOf(s)) grad_segments_[u].push_back(s);
    uses_.push_back(static_cast<int>(layout_.UsersOf(s).size()));
  }
  contributions_.assign(layout_.num_units(), 0);
  open_use_.assign(layout_.num_units(), -1);
  accum_busy_.assign(layout_.num_units(), 0);
  for (int s = 0; s < plan_.grad_staging_slots; ++s) free_slots_.push_back(s);
  if (plan_.quantized_grad_bits != 0) {
    quant_ranks_per_node_ = QgzRanksPerNode(services.comm().node_layout());
    for (int s = 0; s < plan_.grad_quant_slots; ++s) free_quant_slots_.push_back(s);
    quant_worker_ = std::make_unique<QuantizedReduceWorker>();
  }
}

GradReducer::~GradReducer() {
  for (Reduction& r : queue_) r.handle.Wait().IgnoreError();
}

absl::StatusOr<int> GradReducer::AcquireQuantSlot() {
  // Every reduction in flight holds a slot: retiring the oldest frees one.
  while (free_quant_slots_.empty()) ZS_RETURN_IF_ERROR(RetireOldest(WaitSite::kStepReductions));
  const int slot = free_quant_slots_.front();
  free_quant_slots_.pop_front();
  return slot;
}

void GradReducer::BeginNextStep() {
  for (int& count : reduced_count_) count = 0;
  for (int& count : contributions_) count = 0;
}

absl::Status GradReducer::GradFinal(int segment) {
  return hook_ ? hook_(segment) : absl::OkStatus();
}

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

void* GradReducer::ViewData(int segment, int slot) const {
  if (slot == kDirectView) return buffers_.GradsAt(segment, 0);
  if (slot == kAccumView) return buffers_.TiedAccumData(segment);
  return buffers_.StagingSlotData(slot);
}

absl::Status GradReducer::RetireOldest(WaitSite site) {
  Reduction r = std::move(queue_.front());
  queue_.pop_front();
  ZS_RETURN_IF_ERROR(services_.WaitComm(r.handle, site));
  if (r.quant_slot >= 0) free_quant_slots_.push_back(r.quant_slot);
  if (r.slot >= 0 || r.slot == kAccumView) {
    if (r.micro > 0) {
      // Stage 2, later micro-batch: the reduce-scatter left this rank's
      // summed block in place in the slot; add it to the gradient shard.
      // Reductions retire in issue order, so micro-batches add in order.
      const UnitSegment& seg = layout_.unit(r.unit);
      const ElementRange shard = layout_.ShardRange(r.unit, rank_);
      const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
      ZS_RETURN_IF_ERROR(services_.ops().Accumulate(
          buffers_.GradsAt(r.unit, shard.begin),
          static_cast<char*>(ViewData(r.unit, r.slot)) + shard.begin * elem, seg.shard_numel,
          grad_dtype_));
    }
    if (r.slot >= 0) {
      free_slots_.push_back(r.slot);
    } else {
      accum_busy_[r.unit] = 0;
    }
  }
  // In issue order: the segment's last micro-batch completes its gradient.
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
  // In issue order, so that each segment's norm runs on the compute stream
  // while the host waits for the next segment's reduction.
  while (!queue_.empty()) ZS_RETURN_IF_ERROR(RetireOldest(WaitSite::kStepReductions));
  return absl::OkStatus();
}

absl::StatusOr<GradReducer::SegmentView> GradReducer::OpenSegment(int segment) {
  const int uses = uses_[segment];
  const int micro = contributions_[segment] / uses;
  const int use = contributions_[segment] % uses;
  SegmentView view;
  view.segment = segment;
  if (use == 0 && micro == 0 && !plan_.stage.grads_sharded) {
    // Stages 0-1: the first micro-batch's first use writes straight into
    // the full gradient buffer, whose padding is zero and never written.
    view.slot = kDirectView;
    return view;
  }
  if (use == 0 && uses > 1) {
    // A tied segment's micro-batch gradient forms in its accumulator; a
    // stage-2 reduce-scatter of the previous micro-batch may still read it.
    while (accum_busy_[segment]) ZS_RETURN_IF_ERROR(RetireOldest(WaitSite::kGradViewSlot));
    view.slot = kAccumView;
  } else {
    ZS_ASSIGN_OR_RETURN(view.slot, AcquireSlot());
  }
  // The memory held another gradient: zero this segment's padding so that
  // it reduces (and stays) zero. The trainer overwrites every param element.
  char* data = static_cast<char*>(ViewData(segment, view.slot));
  const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
  for (const ElementRange& pad : layout_.PaddingRanges(segment)) {
    ZS_RETURN_IF_ERROR(services_.ZeroOnCompute(data + pad.begin * elem, pad.size() * elem));
  }
  return view;
}

absl::StatusOr<std::vector<void*>> GradReducer::OpenView(int unit) {
  const std::string& name = model_.units[unit].name;
  if (grad_segments_[unit].empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GradView(%s): every param of the unit is frozen (ParamSpec::trainable false), so it has "
        "no gradient; skip its GradView and ReduceGrads",
        name));
  }
  if (!open_view_[unit].empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GradView(%s) called twice without ReduceGrads in between", name));
  }
  if (reduced_count_[unit] >= accum_steps_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GradView(%s): the unit already has %d micro-batch gradients this step "
                        "(grad_accum_steps); call Step() first",
                        name, reduced_count_[unit]));
  }
  for (int s : grad_segments_[unit]) {
    if (open_use_[s] >= 0) {
      const UnitSegment& seg = layout_.unit(s);
      return absl::FailedPreconditionError(absl::StrFormat(
          "GradView(%s): its tied param '%s.%s' has a gradient view open through unit '%s'; "
          "call ReduceGrads(%s) first (the uses of a tied param are added one at a time)",
          name, model_.units[seg.spec_unit].name,
          model_.units[seg.spec_unit].params[seg.tied_param].name, model_.units[open_use_[s]].name,
          model_.units[open_use_[s]].name));
    }
  }
  std::vector<SegmentView> views;
  for (int s : grad_segments_[unit]) {
    absl::StatusOr<SegmentView> view = OpenSegment(s);
    if (!view.ok()) {
      for (const SegmentView& v : views) {
        if (v.slot >= 0) free_slots_.push_back(v.slot);
      }
      return view.status();
    }
    views.push_back(*view);
  }
  // The trainer writes the views from the host: the zeroing, and the
  // accumulation that last read the memory, must be done.
  ZS_RETURN_IF_ERROR(services_.SyncCompute());
  std::vector<void*> out;
  for (int s : layout_.SegmentsOf(unit)) {
    void* data = nullptr;
    for (const SegmentView& v : views) {
      if (v.segment == s) data = ViewData(s, v.slot);
    }
    out.push_back(data);
  }
  for (const SegmentView& v : views) open_use_[v.segment] = unit;
  open_view_[unit] = std::move(views);
  return out;
}

absl::Status GradReducer::Reduce(int unit) {
  if (open_view_[unit].empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ReduceGrads(%s) without a GradView: get the view, write the gradient, then reduce",
        model_.units[unit].name));
  }
  const std::vector<SegmentView> views = std::move(open_view_[unit]);
  open_view_[unit].clear();
  ++reduced_count_[unit];
  for (const SegmentView& v : views) {
    open_use_[v.segment] = -1;
    ZS_RETURN_IF_ERROR(ReduceSegment(v));
  }
  return Poll();
}

absl::Status GradReducer::ReduceSegment(const SegmentView& view) {
  const int s = view.segment;
  const int uses = uses_[s];
  const int micro = contributions_[s] / uses;
  const int use = contributions_[s] % uses;
  ++contributions_[s];
  if (uses == 1) return MicroComplete(s, micro, view.slot, ViewData(s, view.slot), false);
  // A tied segment: later uses add into the first's memory, in call order.
  const int base = micro == 0 && !plan_.stage.grads_sharded ? kDirectView : kAccumView;
  void* base_data = ViewData(s, base);
  if (use > 0) {
    ZS_RETURN_IF_ERROR(services_.ops().Accumulate(base_data, ViewData(s, view.slot),
                                                  layout_.unit(s).padded_numel, grad_dtype_));
    free_slots_.push_back(view.slot);
  }
  if (use + 1 < uses) return absl::OkStatus();
  // The later uses were added on the compute stream.
  return MicroComplete(s, micro, base, base_data, /*added_on_compute=*/true);
}

absl::Status GradReducer::MicroComplete(int segment, int micro, int slot, void* data,
                                        bool added_on_compute) {
  const UnitSegment& seg = layout_.unit(segment);
  const ElementRange shard = layout_.ShardRange(segment, rank_);
  const uint64_t tag = CollectiveLog::UnitTag(segment);
  Communicator& comm = services_.comm();

  if (!plan_.stage.grads_sharded) {
    if (slot != kDirectView) {
      ZS_RETURN_IF_ERROR(services_.ops().Accumulate(buffers_.GradsAt(segment, 0), data,
                                                    seg.padded_numel, grad_dtype_));
      if (slot >= 0) free_slots_.push_back(slot);
    }
    if (micro == accum_steps_ - 1) {
      // Stages 0-1 reduce once per step, when the segment's gradient is
      // summed over this rank's micro-batches; asynchronously, so the
      // reduction overlaps the backward of the units before it. The
      // communicator reads the buffer the accumulation above writes: it
      // waits for that work itself (an event on the compute stream), not
      // this thread.
      void* grads = buffers_.GradsAt(segment, 0);
      void* shard_grads = buffers_.GradsAt(segment, shard.begin);
      // One rank reading and writing the same memory moves nothing: the
      // collective is not issued, and the gradient is final once
      // accumulated (same stream).
      if (world_ == 1 && grads == shard_grads) return GradFinal(segment);
      std::shared_ptr<Event> ready;
      if (slot != kDirectView || added_on_compute) {
        ZS_ASSIGN_OR_RETURN(ready, services_.RecordCompute());
      }
      Reduction r;
      r.unit = segment;
      r.micro = micro;
      if (!plan_.stage.optimizer_sharded) {
        r.handle = comm.AllReduceAfter(ready, grads, grads, seg.padded_numel, grad_dtype_, tag);
        services_.log().Note(CollectiveKind::kAllReduceGrads, segment, seg.padded_numel);
      } else {
        r.handle =
            comm.ReduceScatterAfter(ready, grads, shard_grads, seg.shard_numel, grad_dtype_, tag);
        services_.log().Note(CollectiveKind::kReduceScatterGrads, segment, seg.shard_numel);
      }
      queue_.push_back(std::move(r));
    }
    return absl::OkStatus();
  }

  // Stage 2: reduce-scatter every micro-batch. The first writes straight into
  // the gradient shard; later ones reduce in place and are added when the
  // entry retires. A tied segment's accumulator was written on the compute
  // stream (the uses' sum): the collective waits for that work.
  const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
  void* recv = micro == 0 ? buffers_.GradsAt(segment, shard.begin)
                          : static_cast<char*>(data) + shard.begin * elem;
  Reduction r;
  r.unit = segment;
  r.slot = slot;
  r.micro = micro;
  if (plan_.quantized_grad_bits != 0) {
    // qgZ quantizes on this thread: the compute stream's work on `data`
    // (the padding's zeroing, a tied segment's sum) must be done.
    ZS_ASSIGN_OR_RETURN(r.quant_slot, AcquireQuantSlot());
    ZS_RETURN_IF_ERROR(services_.SyncCompute());
    if (slot == kAccumView) accum_busy_[segment] = 1;
    auto op = std::make_unique<QuantizedReduceScatter>();
    const absl::Status started =
        op->Start(comm, quant_ranks_per_node_, plan_.quantized_grad_bits, data, recv,
                  seg.shard_numel, grad_dtype_, tag, buffers_.GradQuantSlotData(r.quant_slot));
    if (!started.ok()) {
      free_quant_slots_.push_back(r.quant_slot);
      return started;
    }
    r.handle = quant_worker_->Submit(std::move(op));
  } else if (slot == kAccumView) {
    accum_busy_[segment] = 1;
    ZS_ASSIGN_OR_RETURN(std::shared_ptr<Event> ready, services_.RecordCompute());
    r.handle = comm.ReduceScatterAfter(ready, data, recv, seg.shard_numel, grad_dtype_, tag);
  } else {
    r.handle = comm.ReduceScatter(data, recv, seg.shard_numel, grad_dtype_, tag);
  }
  services_.log().Note(CollectiveKind::kReduceScatterGrads, segment, seg.shard_numel);
  queue_.push_back(std::move(r));
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
