#include "engine/src/runtime/param_gatherer.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

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
  const int units = layout_.num_units();
  gathered_.assign(units, 0);
  updated_gathers_.resize(units);
  slots_.resize(plan_.gather_slots);
  unit_slot_.assign(units, -1);
  prefetch_depth_ = std::max(0, plan_.gather_slots - 1);
}

ParamGatherer::~ParamGatherer() {
  for (CommHandle& h : updated_gathers_) h.Wait().IgnoreError();
  for (GatherSlot& g : slots_) g.gather.Wait().IgnoreError();
}

absl::StatusOr<void*> ParamGatherer::Gather(int unit, int64_t step, bool first_step) {
  if (!plan_.unit_resident[unit]) return GatherSharded(unit, step, first_step);
  // Stages 1-3: the updated params of the last step arrive asynchronously;
  // waiting here (not in Step) lets them overlap the forward of earlier units.
  ZS_RETURN_IF_ERROR(services_.WaitComm(updated_gathers_[unit], WaitSite::kParamGather));
  gathered_[unit] = 1;
  return buffers_.ParamsAt(unit, 0);
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
  if (plan_.unit_resident[unit]) return absl::OkStatus();
  // The slot keeps the unit's data until it is needed for another unit, so
  // a Gather of the same unit right after (forward to backward) is free.
  slots_[unit_slot_[unit]].held = false;
  held_unit_ = -1;
  return absl::OkStatus();
}

void ParamGatherer::IssueUpdatedParamGathers() {
  // Only this rank's shard was updated: bring every rank's updated shard of
  // the resident units to all ranks; Gather(u) waits for it, so the
  // all-gathers overlap the forward of earlier units.
  if (!plan_.stage.optimizer_sharded) return;
  for (int u = 0; u < layout_.num_units(); ++u) {
    if (!plan_.unit_resident[u]) continue;
    const UnitSegment& seg = layout_.unit(u);
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

void ParamGatherer::DisablePrefetch(const std::string& why) {
  prefetch_active_ = false;
  if (!prefetch_fallback_reported_) {
    prefetch_fallback_reported_ = true;
    std::fprintf(stderr,
                 "zeroshard: rank %d: %s; stage-3 prefetch is off, units are gathered on demand\n",
                 rank_, why.c_str());
  }
}

absl::Status ParamGatherer::IssueUnitGather(int unit, int slot) {
  const UnitSegment& seg = layout_.unit(unit);
  GatherSlot& g = slots_[slot];
  g.unit = unit;
  g.issued = ++issue_counter_;
  unit_slot_[unit] = slot;
  // Every rank's shard lands at its offset in the slot: the unit's segment,
  // padding (zero in every shard) included.
  g.gather = services_.comm().AllGather(
      buffers_.ParamsAt(unit, layout_.ShardRange(unit, rank_).begin), buffers_.GatherSlotData(slot),
      seg.shard_numel, param_dtype_, CollectiveLog::UnitTag(unit));
  services_.log().Note(CollectiveKind::kGatherUnit, unit, seg.shard_numel);
  return absl::OkStatus();
}

absl::StatusOr<int> ParamGatherer::AcquireSlot(int protect_from) {
  // An empty slot first; else the oldest slot not held and not wanted by the
  // prefetch window that starts at `protect_from` in the recorded order.
  auto wanted = [&](int unit) {
    if (!prefetch_active_) return false;
    const size_t begin = static_cast<size_t>(protect_from);
    const size_t end = std::min(recorded_order_.size(), begin + prefetch_depth_);
    for (size_t k = begin; k < end; ++k) {
      if (recorded_order_[k] == unit) return true;
    }
    return false;
  };
  int best = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const GatherSlot& g = slots_[s];
    if (g.held) continue;
    if (g.unit < 0) return static_cast<int>(s);
    if (wanted(g.unit)) continue;
    if (best < 0 || g.issued < slots_[best].issued) best = static_cast<int>(s);
  }
  if (best < 0) {
    // Every free slot holds a unit the window wants: take the oldest anyway.
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s].held && (best < 0 || slots_[s].issued < slots_[best].issued)) {
        best = static_cast<int>(s);
      }
    }
  }
  if (best < 0) {
    return absl::FailedPreconditionError(
        "stage 3: every gather buffer is held; Release the gathered unit before the next Gather");
  }
  GatherSlot& g = slots_[best];
  // Its all-gather may still be writing.
  ZS_RETURN_IF_ERROR(services_.WaitComm(g.gather, WaitSite::kStage3Evict));
  unit_slot_[g.unit] = -1;
  g.unit = -1;
  return best;
}

absl::Status ParamGatherer::PrefetchFrom(size_t order_pos) {
  // Issue the all-gathers of the next prefetch_depth_ units of the recorded
  // order that are not already in a slot, into slots that are empty or hold
  // a finished unit the window does not need.
  const size_t end = std::min(recorded_order_.size(), order_pos + prefetch_depth_);
  for (size_t k = order_pos; k < end; ++k) {
    const int unit = recorded_order_[k];
    if (unit_slot_[unit] >= 0) continue;
    int free_slot = -1;
    for (size_t s = 0; s < slots_.size() && free_slot < 0; ++s) {
      const GatherSlot& g = slots_[s];
      if (g.held || g.gather.valid()) continue;
      bool needed = false;
      for (size_t j = order_pos; j < end && g.unit >= 0; ++j)
        needed |= recorded_order_[j] == g.unit;
      if (!needed) free_slot = static_cast<int>(s);
    }
    if (free_slot < 0) break;
    GatherSlot& g = slots_[free_slot];
    if (g.unit >= 0) unit_slot_[g.unit] = -1;
    ZS_RETURN_IF_ERROR(IssueUnitGather(unit, free_slot));
  }
  return absl::OkStatus();
}

absl::Status ParamGatherer::DropPool() {
  for (GatherSlot& g : slots_) {
    ZS_RETURN_IF_ERROR(services_.WaitComm(g.gather, WaitSite::kStage3Drop));
    if (g.unit >= 0) unit_slot_[g.unit] = -1;
    g.unit = -1;
  }
  return absl::OkStatus();
}

absl::Status ParamGatherer::EndStep(int64_t step, bool first_step) {
  if (plan_.gather_slots == 0) return absl::OkStatus();
  // A step that gathered fewer units than the first falls back.
  if (first_step) {
    prefetch_active_ = prefetch_depth_ > 0 && !recorded_order_.empty();
  } else if (prefetch_active_ && order_pos_ != recorded_order_.size()) {
    DisablePrefetch(absl::StrFormat("step %d made %d gathers, the first step %d", step, order_pos_,
                                    recorded_order_.size()));
  }
  order_pos_ = 0;
  if (prefetch_active_) ZS_RETURN_IF_ERROR(PrefetchFrom(0));
  return absl::OkStatus();
}

absl::StatusOr<void*> ParamGatherer::GatherSharded(int unit, int64_t step, bool first_step) {
  if (held_unit_ >= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Gather(%s) while '%s' is still gathered: stage 3 holds one unit at a time; Release it "
        "first",
        model_.units[unit].name, model_.units[held_unit_].name));
  }
  if (first_step) {
    recorded_order_.push_back(unit);
  } else if (prefetch_active_) {
    if (order_pos_ < recorded_order_.size() && recorded_order_[order_pos_] == unit) {
      ++order_pos_;
    } else {
      DisablePrefetch(absl::StrFormat(
          "step %d: gather %d was unit '%s', not '%s' as in the first step", step, order_pos_ + 1,
          model_.units[unit].name,
          order_pos_ < recorded_order_.size() ? model_.units[recorded_order_[order_pos_]].name
                                              : std::string("(none: more gathers than then)")));
    }
  }
  int slot = unit_slot_[unit];
  if (slot < 0) {
    ZS_ASSIGN_OR_RETURN(slot, AcquireSlot(static_cast<int>(order_pos_)));
    ZS_RETURN_IF_ERROR(IssueUnitGather(unit, slot));
  }
  ZS_RETURN_IF_ERROR(services_.WaitComm(slots_[slot].gather, WaitSite::kStage3Gather));
  slots_[slot].held = true;
  held_unit_ = unit;
  gathered_[unit] = 1;
  // Look ahead while the trainer computes with this unit.
  if (prefetch_active_) ZS_RETURN_IF_ERROR(PrefetchFrom(order_pos_));
  return buffers_.GatherSlotData(slot);
}

}  // namespace zeroshard::internal
