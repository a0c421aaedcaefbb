// Stage 3: the gather pool, prefetch along the recorded order, and the
// collective-sequence record.
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "engine/src/runtime/engine_impl.h"
#include "engine/src/runtime/fingerprint.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

void EngineImpl::NoteCollective(CollectiveKind kind, int unit, int64_t count) {
  ++collectives_total_;
  if (!train_.check_collective_sequence) return;
  const int64_t record[3] = {static_cast<int64_t>(kind), unit, count};
  sequence_hash_ = HashBytes(record, sizeof(record), sequence_hash_ == 0 ? 1 : sequence_hash_);
  ++sequence_count_;
}

const char* EngineImpl::WaitSiteName(WaitSite site) {
  switch (site) {
    case WaitSite::kGradViewSlot:
      return "GradView: staging slot's reduction";
    case WaitSite::kStepReductions:
      return "Step: gradient reductions";
    case WaitSite::kRecordExchange:
      return "norm / record exchange";
    case WaitSite::kParamGather:
      return "Gather: updated params (stages 1-2)";
    case WaitSite::kStage3Gather:
      return "Gather: stage-3 all-gather";
    case WaitSite::kStage3Evict:
      return "Gather: stage-3 slot reuse";
    case WaitSite::kStage3Drop:
      return "Step: stage-3 gather pool";
    case WaitSite::kGetParam:
      return "GetParam";
    case WaitSite::kSave:
      return "Save: updated params";
    case WaitSite::kModelParallel:
      return "model-parallel norm";
    case WaitSite::kNumSites:
      break;
  }
  return "?";
}

void EngineImpl::PrintCommWaits() const {
  // One block per rank, written at once so that ranks do not interleave.
  std::string out = absl::StrFormat(
      "zeroshard: rank %d: collective waits over %d steps (ms per step, blocking waits)\n", rank_,
      steps_since_start_);
  const double steps = static_cast<double>(std::max<int64_t>(1, steps_since_start_));
  for (int s = 0; s < static_cast<int>(WaitSite::kNumSites); ++s) {
    if (site_waits_[s] == 0) continue;
    absl::StrAppendFormat(
        &out, "  %-38s %9.3f ms  (%.1f waits)\n", WaitSiteName(static_cast<WaitSite>(s)),
        absl::ToDoubleMilliseconds(site_wait_[s]) / steps, site_waits_[s] / steps);
  }
  std::fputs(out.c_str(), stderr);
}

EngineStats EngineImpl::Stats() const {
  EngineStats stats = stats_;
  stats.loss_scale = loss_scale_;
  stats.prefetch_active = prefetch_active_;
  stats.collectives = collectives_total_;
  return stats;
}

void* EngineImpl::GatherSlotData(int slot) const {
  return gather_pool_.as<char>() +
         slot * plan_.gather_slot_numel * static_cast<int64_t>(DTypeSize(param_dtype_));
}

void EngineImpl::DisablePrefetch(const std::string& why) {
  prefetch_active_ = false;
  if (!prefetch_fallback_reported_) {
    prefetch_fallback_reported_ = true;
    std::fprintf(stderr,
                 "zeroshard: rank %d: %s; stage-3 prefetch is off, units are gathered on demand\n",
                 rank_, why.c_str());
  }
}

absl::Status EngineImpl::IssueUnitGather(int unit, int slot) {
  const UnitSegment& seg = layout_.unit(unit);
  GatherSlot& g = gather_slots_[slot];
  g.unit = unit;
  g.issued = ++gather_issue_counter_;
  unit_gather_slot_[unit] = slot;
  // Every rank's shard lands at its offset in the slot: the unit's segment,
  // padding (zero in every shard) included.
  g.gather = comm_.AllGather(ParamsAt(unit, layout_.ShardRange(unit, rank_).begin),
                             GatherSlotData(slot), seg.shard_numel, param_dtype_, UnitTag(unit));
  NoteCollective(CollectiveKind::kGatherUnit, unit, seg.shard_numel);
  return absl::OkStatus();
}

absl::StatusOr<int> EngineImpl::AcquireGatherSlot(int protect_from) {
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
  for (size_t s = 0; s < gather_slots_.size(); ++s) {
    const GatherSlot& g = gather_slots_[s];
    if (g.held) continue;
    if (g.unit < 0) return static_cast<int>(s);
    if (wanted(g.unit)) continue;
    if (best < 0 || g.issued < gather_slots_[best].issued) best = static_cast<int>(s);
  }
  if (best < 0) {
    // Every free slot holds a unit the window wants: take the oldest anyway.
    for (size_t s = 0; s < gather_slots_.size(); ++s) {
      if (!gather_slots_[s].held &&
          (best < 0 || gather_slots_[s].issued < gather_slots_[best].issued)) {
        best = static_cast<int>(s);
      }
    }
  }
  if (best < 0) {
    return absl::FailedPreconditionError(
        "stage 3: every gather buffer is held; Release the gathered unit before the next Gather");
  }
  GatherSlot& g = gather_slots_[best];
  // Its all-gather may still be writing.
  ZS_RETURN_IF_ERROR(WaitComm(g.gather, WaitSite::kStage3Evict));
  unit_gather_slot_[g.unit] = -1;
  g.unit = -1;
  return best;
}

absl::Status EngineImpl::PrefetchFrom(size_t order_pos) {
  // Issue the all-gathers of the next prefetch_depth_ units of the recorded
  // order that are not already in a slot, into slots that are empty or hold
  // a finished unit the window does not need.
  const size_t end = std::min(recorded_order_.size(), order_pos + prefetch_depth_);
  for (size_t k = order_pos; k < end; ++k) {
    const int unit = recorded_order_[k];
    if (unit_gather_slot_[unit] >= 0) continue;
    int free_slot = -1;
    for (size_t s = 0; s < gather_slots_.size() && free_slot < 0; ++s) {
      const GatherSlot& g = gather_slots_[s];
      if (g.held || g.gather.valid()) continue;
      bool needed = false;
      for (size_t j = order_pos; j < end && g.unit >= 0; ++j)
        needed |= recorded_order_[j] == g.unit;
      if (!needed) free_slot = static_cast<int>(s);
    }
    if (free_slot < 0) break;
    GatherSlot& g = gather_slots_[free_slot];
    if (g.unit >= 0) unit_gather_slot_[g.unit] = -1;
    ZS_RETURN_IF_ERROR(IssueUnitGather(unit, free_slot));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::DropGatherPool() {
  for (GatherSlot& g : gather_slots_) {
    ZS_RETURN_IF_ERROR(WaitComm(g.gather, WaitSite::kStage3Drop));
    if (g.unit >= 0) unit_gather_slot_[g.unit] = -1;
    g.unit = -1;
  }
  return absl::OkStatus();
}

absl::StatusOr<UnitView> EngineImpl::GatherSharded(int unit) {
  if (held_unit_ >= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Gather(%s) while '%s' is still gathered: stage 3 holds one unit at a time; Release it "
        "first",
        model_.units[unit].name, model_.units[held_unit_].name));
  }
  if (steps_since_start_ == 0) {
    recorded_order_.push_back(unit);
  } else if (prefetch_active_) {
    if (order_pos_ < recorded_order_.size() && recorded_order_[order_pos_] == unit) {
      ++order_pos_;
    } else {
      DisablePrefetch(absl::StrFormat(
          "step %d: gather %d was unit '%s', not '%s' as in the first step", step_ + 1,
          order_pos_ + 1, model_.units[unit].name,
          order_pos_ < recorded_order_.size() ? model_.units[recorded_order_[order_pos_]].name
                                              : std::string("(none: more gathers than then)")));
    }
  }
  int slot = unit_gather_slot_[unit];
  if (slot < 0) {
    ZS_ASSIGN_OR_RETURN(slot, AcquireGatherSlot(static_cast<int>(order_pos_)));
    ZS_RETURN_IF_ERROR(IssueUnitGather(unit, slot));
  }
  ZS_RETURN_IF_ERROR(WaitComm(gather_slots_[slot].gather, WaitSite::kStage3Gather));
  gather_slots_[slot].held = true;
  held_unit_ = unit;
  gathered_[unit] = 1;
  // Look ahead while the trainer computes with this unit.
  if (prefetch_active_) ZS_RETURN_IF_ERROR(PrefetchFrom(order_pos_));
  return MakeView(GatherSlotData(slot), param_dtype_, unit);
}

}  // namespace zeroshard::internal
