#include "engine/src/runtime/param_gatherer.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/common/quant_int8.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

// The planner sizes the int8 packs by its own copy of the format.
static_assert(kQwzBlockElements == kernels::kQuantBlock);
static_assert(QwzPackBytes(1) == kernels::QuantPackedBytes(1) &&
              QwzPackBytes(257) == kernels::QuantPackedBytes(257) &&
              QwzPackBytes(4096) == kernels::QuantPackedBytes(4096));

ParamGatherer::ParamGatherer(const ModelSpec& model, const FlatLayout& layout,
                             const BufferPlan& plan, int rank, DType param_dtype,
                             const ShardBuffers& buffers, RuntimeServices& services)
    : model_(model),
      layout_(layout),
      plan_(plan),
      rank_(rank),
      world_(services.comm().size()),
      param_dtype_(param_dtype),
      buffers_(buffers),
      services_(services) {
  gathered_.assign(layout_.num_spec_units(), 0);
  updated_gathers_.resize(layout_.num_units());
  slots_.resize(plan_.gather_slots);
  unit_slot_.assign(layout_.num_units(), -1);
  prefetch_depth_ = std::max(0, plan_.gather_slots - plan_.held_slots);
  secondary_valid_.assign(layout_.num_units(), 0);
}

ParamGatherer::~ParamGatherer() {
  for (CommHandle& h : updated_gathers_) h.Wait().IgnoreError();
  for (GatherSlot& g : slots_) g.gather.Wait().IgnoreError();
}

int ParamGatherer::held_unit() const {
  for (size_t u = 0; u < gathered_.size(); ++u) {
    if (gathered_[u]) return static_cast<int>(u);
  }
  return -1;
}

absl::StatusOr<std::vector<void*>> ParamGatherer::Gather(int unit, int64_t step, bool first_step) {
  const std::string& name = model_.units[unit].name;
  if (gathered_[unit]) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Gather(%s): the unit is gathered already; Release it before gathering it again", name));
  }
  const std::vector<int>& segments = layout_.SegmentsOf(unit);
  bool sharded = false;
  for (int s : segments) sharded |= !plan_.unit_resident[s];
  if (sharded && held_units_ >= plan_.max_gathered_units) {
    return absl::FailedPreconditionError(
        absl::StrFormat("Gather(%s) while %s: stage 3 holds at most %d unit%s at once "
                        "(TrainSpec::max_gathered_units); Release one first, or raise it",
                        name, DescribeGathered(), plan_.max_gathered_units,
                        plan_.max_gathered_units == 1 ? "" : "s"));
  }
  std::vector<void*> out;
  std::vector<int> holding;  // the segments held so far, let go on an error
  for (int s : segments) {
    if (plan_.unit_resident[s]) {
      // Stages 1-3: the updated params of the last step arrive
      // asynchronously; waiting here (not in Step) lets them overlap the
      // forward of earlier units.
      ZS_RETURN_IF_ERROR(services_.WaitComm(updated_gathers_[s], WaitSite::kParamGather));
      out.push_back(buffers_.ParamsAt(s, 0));
      continue;
    }
    absl::StatusOr<void*> data = GatherSegment(s, unit, step, first_step);
    if (!data.ok()) {
      for (int h : holding) --slots_[unit_slot_[h]].holds;
      return data.status();
    }
    out.push_back(*data);
    holding.push_back(s);
  }
  gathered_[unit] = 1;
  if (sharded) ++held_units_;
  // Look ahead while the trainer computes with this unit (not for an
  // evaluation pass, whose order is its own).
  if (prefetch_active_ && !eval_) ZS_RETURN_IF_ERROR(PrefetchFrom(order_pos_));
  return out;
}

absl::Status ParamGatherer::SetEval(bool eval) {
  eval_ = eval;
  // Back to the step: gather ahead what its order wants next.
  if (!eval && prefetch_active_) return PrefetchFrom(order_pos_);
  return absl::OkStatus();
}

std::string ParamGatherer::DescribeGathered() const {
  // At most a few names: a message stays one short line.
  constexpr int kMaxNames = 3;
  std::vector<std::string> names;
  int count = 0;
  for (size_t u = 0; u < gathered_.size(); ++u) {
    if (!gathered_[u]) continue;
    if (++count <= kMaxNames) names.push_back("'" + model_.units[u].name + "'");
  }
  if (count == 0) return "no unit is gathered";
  std::string text = absl::StrJoin(names, ", ");
  if (count > kMaxNames) absl::StrAppend(&text, " and ", count - kMaxNames, " more");
  return absl::StrCat(text, count == 1 ? " is" : " are", " gathered");
}

absl::Status ParamGatherer::Release(int unit) {
  // A Release without its Gather (or a second one) is a trainer bug at every
  // stage, with the same words at every stage, though only stage 3 has a
  // buffer to give back.
  if (!gathered_[unit]) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Release(%s): the unit is not gathered (%s); every Release follows a Gather of the same "
        "unit, once",
        model_.units[unit].name, DescribeGathered()));
  }
  gathered_[unit] = 0;
  Unhold(unit);
  return absl::OkStatus();
}

void ParamGatherer::Unhold(int unit) {
  // A slot keeps its segment's data until it is needed for another, so a
  // Gather of the same unit right after (forward to backward) is free.
  bool sharded = false;
  for (int s : layout_.SegmentsOf(unit)) {
    if (plan_.unit_resident[s]) continue;
    sharded = true;
    --slots_[unit_slot_[s]].holds;
  }
  if (sharded) --held_units_;
}

void ParamGatherer::IssueUpdatedParamGathers() {
  // Only this rank's shard was updated: bring every rank's updated shard of
  // the resident trainable segments to all ranks (frozen ones never change);
  // Gather(u) waits for it, so the all-gathers overlap the forward of
  // earlier units.
  if (!plan_.stage.optimizer_sharded) return;
  for (int u = 0; u < layout_.num_units(); ++u) {
    if (!plan_.unit_resident[u]) continue;
    const UnitSegment& seg = layout_.unit(u);
    if (!seg.trainable) continue;
    if (world_ == 1) continue;  // the shard is the whole unit, updated in place
    updated_gathers_[u] = services_.comm().AllGather(
        buffers_.ParamsAt(u, layout_.ShardRange(u, rank_).begin), buffers_.ParamsAt(u, 0),
        seg.shard_numel, param_dtype_, CollectiveLog::UnitTag(u));
    services_.log().Note(CollectiveKind::kAllGatherParams, u, seg.shard_numel);
  }
}

absl::Status ParamGatherer::WaitUpdatedParamGathers(WaitSite site) {
  for (CommHandle& h : updated_gathers_) ZS_RETURN_IF_ERROR(services_.WaitComm(h, site));
  return absl::OkStatus();
}

absl::Status ParamGatherer::Dequantize(int slot) {
  GatherSlot& g = slots_[slot];
  if (g.dequantized) return absl::OkStatus();
  const int64_t shard = layout_.unit(g.unit).shard_numel;
  const int64_t packed = kernels::QuantPackedBytes(shard);
  const char* packs = static_cast<const char*>(buffers_.GatherInt8SlotData(slot));
  char* out = static_cast<char*>(buffers_.GatherSlotData(slot));
  const int64_t shard_bytes = shard * static_cast<int64_t>(DTypeSize(param_dtype_));
  for (int r = 0; r < world_; ++r) {
    ZS_RETURN_IF_ERROR(services_.ops().DequantizeInt8(packs + r * packed, shard, param_dtype_,
                                                      out + r * shard_bytes));
  }
  // The trainer reads the slot once Gather returns.
  ZS_RETURN_IF_ERROR(services_.SyncCompute());
  g.dequantized = true;
  return absl::OkStatus();
}

absl::Status ParamGatherer::KeepSecondary(int slot) {
  GatherSlot& g = slots_[slot];
  if (!g.keep_secondary) return absl::OkStatus();
  g.keep_secondary = false;
  const int64_t piece = layout_.unit(g.unit).padded_numel / plan_.secondary_partition_size;
  const int64_t bytes = piece * static_cast<int64_t>(DTypeSize(param_dtype_));
  const char* slot_data = static_cast<const char*>(buffers_.GatherSlotData(slot));
  ZS_RETURN_IF_ERROR(services_.CopyOnCompute(buffers_.SecondaryData(g.unit),
                                             slot_data + secondary_->rank() * bytes, bytes));
  ZS_RETURN_IF_ERROR(services_.SyncCompute());
  secondary_valid_[g.unit] = 1;
  return absl::OkStatus();
}

absl::Status ParamGatherer::IssueUnitGather(int unit, int slot) {
  const UnitSegment& seg = layout_.unit(unit);
  GatherSlot& g = slots_[slot];
  g.unit = unit;
  g.issued = ++issue_counter_;
  unit_slot_[unit] = slot;
  // Every rank's shard lands at its offset in the slot: the segment,
  // padding (zero in every shard) included. A shard on the host tier goes
  // to the slot's device staging buffer first.
  const void* mine = buffers_.ParamsAt(unit, layout_.ShardRange(unit, rank_).begin);
  if (buffers_.ParamsOffDevice(unit)) {
    void* stage = buffers_.ParamStageData(slot);
    if (!fetch_) return absl::InternalError("stage 3: params off the device without a fetch");
    ZS_RETURN_IF_ERROR(fetch_(unit, stage));
    mine = stage;
  }
  g.keep_secondary = false;
  if (secondary_ != nullptr && secondary_valid_[unit]) {
    // hpZ: the group's pieces of this step's params (never quantized:
    // they are what the world gather delivered).
    const int64_t piece = seg.padded_numel / plan_.secondary_partition_size;
    g.gather = secondary_->AllGather(buffers_.SecondaryData(unit), buffers_.GatherSlotData(slot),
                                     piece, param_dtype_, CollectiveLog::UnitTag(unit));
    g.dequantized = true;
    ++secondary_gathers_;
    return absl::OkStatus();
  }
  g.keep_secondary = secondary_ != nullptr;
  if (plan_.quantized_weights) {
    // qwZ: this rank's shard as an int8 pack, in its place among the
    // ranks' packs (an in-place all-gather); unpacked on first use.
    const int64_t packed = kernels::QuantPackedBytes(seg.shard_numel);
    char* packs = static_cast<char*>(buffers_.GatherInt8SlotData(slot));
    char* my_pack = packs + rank_ * packed;
    ZS_RETURN_IF_ERROR(services_.ops().QuantizeInt8(mine, seg.shard_numel, param_dtype_, my_pack));
    // The communicator reads the pack from the host side of the stream.
    ZS_RETURN_IF_ERROR(services_.SyncCompute());
    g.gather = services_.comm().AllGather(my_pack, packs, packed, DType::kUInt8,
                                          CollectiveLog::UnitTag(unit));
    g.dequantized = false;
  } else {
    g.gather = services_.comm().AllGather(mine, buffers_.GatherSlotData(slot), seg.shard_numel,
                                          param_dtype_, CollectiveLog::UnitTag(unit));
  }
  services_.log().Note(CollectiveKind::kGatherUnit, unit, seg.shard_numel);
  return absl::OkStatus();
}

bool ParamGatherer::InWindow(int segment, size_t order_pos) const {
  if (!prefetch_active_) return false;
  const size_t end = std::min(recorded_order_.size(), order_pos + prefetch_depth_);
  for (size_t k = order_pos; k < end; ++k) {
    if (recorded_order_[k].segment == segment) return true;
  }
  return false;
}

absl::StatusOr<int> ParamGatherer::AcquireSlot(int protect_from) {
  // An empty slot first; else the oldest slot no unit holds and the
  // prefetch window that starts at `protect_from` does not want.
  const size_t window = static_cast<size_t>(protect_from);
  int best = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const GatherSlot& g = slots_[s];
    if (g.holds > 0) continue;
    if (g.unit < 0) return static_cast<int>(s);
    if (InWindow(g.unit, window)) continue;
    if (best < 0 || g.issued < slots_[best].issued) best = static_cast<int>(s);
  }
  if (best < 0) {
    // Every free slot holds a segment the window wants: take the oldest.
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].holds == 0 && (best < 0 || slots_[s].issued < slots_[best].issued)) {
        best = static_cast<int>(s);
      }
    }
  }
  if (best < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "stage 3: every gather buffer is held (%s); Release a unit before the next Gather",
        DescribeGathered()));
  }
  GatherSlot& g = slots_[best];
  // Its all-gather may still be writing.
  ZS_RETURN_IF_ERROR(services_.WaitComm(g.gather, WaitSite::kStage3Evict));
  unit_slot_[g.unit] = -1;
  g.unit = -1;
  return best;
}

absl::Status ParamGatherer::PrefetchFrom(size_t order_pos) {
  // Issue the all-gathers of the next prefetch_depth_ segments of the
  // recorded order that are not already in a slot, into slots that are
  // empty or hold a finished segment no unit holds and the window does
  // not need.
  const size_t end = std::min(recorded_order_.size(), order_pos + prefetch_depth_);
  for (size_t k = order_pos; k < end; ++k) {
    const int segment = recorded_order_[k].segment;
    if (unit_slot_[segment] >= 0) continue;
    int free_slot = -1;
    for (size_t s = 0; s < slots_.size() && free_slot < 0; ++s) {
      const GatherSlot& g = slots_[s];
      if (g.holds > 0 || g.gather.valid()) continue;
      if (g.unit < 0 || !InWindow(g.unit, order_pos)) free_slot = static_cast<int>(s);
    }
    if (free_slot < 0) break;
    GatherSlot& g = slots_[free_slot];
    if (g.unit >= 0) unit_slot_[g.unit] = -1;
    ZS_RETURN_IF_ERROR(IssueUnitGather(segment, free_slot));
  }
  return absl::OkStatus();
}

absl::Status ParamGatherer::DropPool() {
  // The optimizer rewrites the trainable shards; frozen segments' copies
  // stay valid and stay in their slots.
  // hpZ: the secondary pieces of trainable segments are stale too.
  for (int u = 0; u < layout_.num_units(); ++u) {
    if (layout_.unit(u).trainable) secondary_valid_[u] = 0;
  }
  for (GatherSlot& g : slots_) {
    ZS_RETURN_IF_ERROR(services_.WaitComm(g.gather, WaitSite::kStage3Drop));
    if (g.unit < 0 || !layout_.unit(g.unit).trainable) continue;
    unit_slot_[g.unit] = -1;
    g.unit = -1;
  }
  return absl::OkStatus();
}

absl::Status ParamGatherer::DropSegment(int segment) {
  secondary_valid_[segment] = 0;
  const int slot = unit_slot_[segment];
  if (slot < 0) return absl::OkStatus();
  GatherSlot& g = slots_[slot];
  ZS_RETURN_IF_ERROR(services_.WaitComm(g.gather, WaitSite::kSetFrozenParam));
  unit_slot_[segment] = -1;
  g.unit = -1;
  return absl::OkStatus();
}

absl::Status ParamGatherer::EndStep(int64_t step, bool first_step) {
  if (plan_.gather_slots == 0) return absl::OkStatus();
  if (first_step) {
    prefetch_active_ = prefetch_depth_ > 0 && !recorded_order_.empty();
  } else if (prefetch_active_ && order_pos_ != recorded_order_.size()) {
    const size_t pos = order_pos_;
    order_pos_ = 0;
    return absl::FailedPreconditionError(absl::StrFormat(
        "Step() %d: the step made %d stage-3 gathers, the first step %d (next: unit '%s'); "
        "stage-3 prefetch follows the first step's order: gather the same units in the same "
        "order every step, or set TrainSpec::prefetch_units to 0",
        step, pos, recorded_order_.size(), model_.units[recorded_order_[pos].unit].name));
  }
  order_pos_ = 0;
  if (prefetch_active_) ZS_RETURN_IF_ERROR(PrefetchFrom(0));
  return absl::OkStatus();
}

absl::Status ParamGatherer::CheckOrder(int segment, int unit, int64_t step) {
  if (order_pos_ < recorded_order_.size() && recorded_order_[order_pos_].segment == segment) {
    ++order_pos_;
    return absl::OkStatus();
  }
  const std::string expected =
      order_pos_ < recorded_order_.size()
          ? absl::StrCat("'", model_.units[recorded_order_[order_pos_].unit].name, "'")
          : std::string("none (it made fewer gathers)");
  return absl::FailedPreconditionError(absl::StrFormat(
      "Gather(%s) at step %d: stage-3 gather %d of the step is unit '%s', but the first step's "
      "was %s; stage-3 prefetch follows the first step's order: gather the same units in the "
      "same order every step (a recompute pass included), or set TrainSpec::prefetch_units to 0",
      model_.units[unit].name, step, order_pos_ + 1, model_.units[unit].name, expected));
}

absl::StatusOr<void*> ParamGatherer::GatherSegment(int segment, int unit, int64_t step,
                                                   bool first_step) {
  if (eval_) {
    // An evaluation pass: not part of any step's order.
  } else if (first_step) {
    recorded_order_.push_back({segment, unit});
  } else if (prefetch_active_) {
    ZS_RETURN_IF_ERROR(CheckOrder(segment, unit, step));
  }
  ++segment_gathers_;
  int slot = unit_slot_[segment];
  if (slot < 0) {
    ZS_ASSIGN_OR_RETURN(slot, AcquireSlot(static_cast<int>(order_pos_)));
    ZS_RETURN_IF_ERROR(IssueUnitGather(segment, slot));
  } else {
    ++gathers_ahead_;
  }
  CommHandle& gather = slots_[slot].gather;
  if (gather.valid() && !gather.Ready()) ++gathers_waited_;
  ZS_RETURN_IF_ERROR(services_.WaitComm(gather, WaitSite::kStage3Gather));
  ZS_RETURN_IF_ERROR(Dequantize(slot));
  ZS_RETURN_IF_ERROR(KeepSecondary(slot));
  ++slots_[slot].holds;
  return buffers_.GatherSlotData(slot);
}

}  // namespace zeroshard::internal
