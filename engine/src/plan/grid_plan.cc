// PlanGrid: the dp x tp x pp candidates of a ModelSpec, each sized exactly by
// the engine's own PlanEngineBuffers on its shard spec, and the choice.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/layout/flat_layout.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/estimate/byte_units.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

// "3.1 MiB": the largest binary unit that leaves at least 1.
std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= kGiB) return absl::StrFormat("%.1f GiB", b / static_cast<double>(kGiB));
  if (bytes >= kMiB) return absl::StrFormat("%.1f MiB", b / static_cast<double>(kMiB));
  if (bytes >= kKiB) return absl::StrFormat("%.1f KiB", b / static_cast<double>(kKiB));
  return absl::StrFormat("%d B", bytes);
}

// True when tp divides every split dimension of the model.
bool TpDividesSplits(const ModelSpec& model, int tp) {
  for (const UnitSpec& unit : model.units) {
    for (const ParamSpec& p : unit.params) {
      if (p.tp_split_dim >= 0 && p.shape[p.tp_split_dim] % tp != 0) return false;
    }
  }
  return true;
}

// The engine's grad_accum_steps on a tp x pp split: the planner's
// convention (PlanOptions::grad_accum_steps) keeps the global batch of the
// dp-only run, so each dp rank runs accum x tp x pp micro-batches. It
// matters to the size: stages 0-1 stage gradients only when accumulating.
// Clamped to int; an accumulation above TrainSpec's limit is refused by
// PlanEngineBuffers as the engine would refuse it.
int GridAccumSteps(const TrainSpec& base, int tp, int pp) {
  const int64_t steps = int64_t{base.grad_accum_steps} * tp * pp;
  return static_cast<int>(std::min<int64_t>(steps, std::numeric_limits<int>::max()));
}

// Sizes the four stages of one (tp, pp) split with the optimizer on
// `tier`: appends one candidate per ZeRO stage to `out`.
absl::Status SizeSplit(const ModelSpec& model, const TrainSpec& base, int world, int tp, int pp,
                       MemoryTier tier, const GridShardSpec& shard_spec,
                       std::vector<GridCandidate>& out) {
  const int dp = world / (tp * pp);
  std::vector<GridCandidate> split(4);
  for (int stage = 0; stage < 4; ++stage) {
    split[stage].tp = tp;
    split[stage].pp = pp;
    split[stage].dp = dp;
    split[stage].stage = stage;
    split[stage].optimizer_tier = tier;
    split[stage].stage_bytes.assign(pp, 0);
  }
  for (int pp_rank = 0; pp_rank < pp; ++pp_rank) {
    // tp rank 0 stands for its whole stage: every tp rank has the same shapes.
    ZS_ASSIGN_OR_RETURN(const ModelSpec shard, shard_spec
                                                   ? shard_spec(tp, pp, pp_rank)
                                                   : ShardModelSpec(model, tp, 0, pp, pp_rank));
    for (int stage = 0; stage < 4; ++stage) {
      GridCandidate& c = split[stage];
      ZS_ASSIGN_OR_RETURN(const BufferPlan plan,
                          PlanEngineBuffers(shard, GridTrainSpec(base, c), dp));
      c.stage_bytes[pp_rank] = plan.total_bytes();
      c.host_bytes = std::max(c.host_bytes, plan.total_bytes(MemoryTier::kHost));
      c.nvme_bytes = std::max(c.nvme_bytes, plan.total_bytes(MemoryTier::kNvme));
    }
  }
  for (GridCandidate& c : split) {
    const auto worst = std::max_element(c.stage_bytes.begin(), c.stage_bytes.end());
    c.per_rank_bytes = *worst;
    c.worst_pp_stage = static_cast<int>(worst - c.stage_bytes.begin());
    out.push_back(std::move(c));
  }
  return absl::OkStatus();
}

// The smallest per_rank_bytes among candidates [0, end).
int64_t SmallestNeed(const std::vector<GridCandidate>& candidates, size_t end) {
  int64_t need = candidates[0].per_rank_bytes;
  for (size_t i = 1; i < end; ++i) need = std::min(need, candidates[i].per_rank_bytes);
  return need;
}

}  // namespace

std::string GridCandidate::Label() const {
  std::string label = absl::StrFormat("tp %d x pp %d x dp %d, stage %d", tp, pp, dp, stage);
  if (optimizer_tier != MemoryTier::kDevice) {
    absl::StrAppend(&label, ", optimizer on ", MemoryTierName(optimizer_tier));
  }
  return label;
}

TrainSpec GridTrainSpec(const TrainSpec& base, const GridCandidate& candidate) {
  TrainSpec train = base;
  train.zero_stage = candidate.stage;
  train.grad_accum_steps = GridAccumSteps(base, candidate.tp, candidate.pp);
  train.offload.optimizer = candidate.optimizer_tier;
  return train;
}

absl::StatusOr<GridPlan> PlanGrid(const ModelSpec& model, const TrainSpec& base, int world,
                                  int64_t per_rank_cap_bytes) {
  return PlanGrid(model, base, world, per_rank_cap_bytes, GridOptions{});
}

absl::StatusOr<GridPlan> PlanGrid(const ModelSpec& model, const TrainSpec& base, int world,
                                  int64_t per_rank_cap_bytes, const GridOptions& options) {
  ZS_RETURN_IF_ERROR(model.Validate());
  if (world < 1 || world > internal::kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PlanGrid: world %d is outside [1, %d]", world, internal::kMaxWorldSize));
  }
  if (per_rank_cap_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PlanGrid: per-rank cap %d bytes; give a positive number of bytes", per_rank_cap_bytes));
  }
  if (options.optimizer_tiers.empty()) {
    return absl::InvalidArgumentError(
        "PlanGrid: no optimizer tier to consider; give at least MemoryTier::kDevice");
  }
  for (MemoryTier tier : options.optimizer_tiers) {
    if (static_cast<int>(tier) < 0 || static_cast<int>(tier) >= kNumMemoryTiers) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "PlanGrid: optimizer tier %d is not a MemoryTier; use device, host or nvme",
          static_cast<int>(tier)));
    }
  }
  GridPlan plan;
  plan.world = world;
  plan.per_rank_cap_bytes = per_rank_cap_bytes;
  const int units = static_cast<int>(model.units.size());
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0 || !TpDividesSplits(model, tp)) continue;
    for (int pp = 1; pp <= world / tp && pp <= units; ++pp) {
      if ((world / tp) % pp != 0) continue;
      if (options.shard_spec) {
        // A split the trainer's own sharding refuses is not a candidate.
        absl::StatusOr<ModelSpec> first = options.shard_spec(tp, pp, 0);
        if (first.status().code() == absl::StatusCode::kInvalidArgument) continue;
        ZS_RETURN_IF_ERROR(first.status());
      }
      for (MemoryTier tier : options.optimizer_tiers) {
        ZS_RETURN_IF_ERROR(
            SizeSplit(model, base, world, tp, pp, tier, options.shard_spec, plan.candidates));
      }
    }
  }
  // Preference: fewest model-parallel ranks (tp = pp = 1, sharding alone,
  // comes first), then more tp before more pp, then the optimizer nearest
  // the device, then the lowest stage.
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                   [](const GridCandidate& a, const GridCandidate& b) {
                     return std::make_tuple(a.model_parallel_ranks(), -a.tp,
                                            static_cast<int>(a.optimizer_tier), a.stage) <
                            std::make_tuple(b.model_parallel_ranks(), -b.tp,
                                            static_cast<int>(b.optimizer_tier), b.stage);
                   });
  plan.by_time = static_cast<bool>(options.step_time);
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    GridCandidate& c = plan.candidates[i];
    c.fits = c.per_rank_bytes <= per_rank_cap_bytes;
    c.step_seconds = std::numeric_limits<double>::quiet_NaN();
    if (plan.by_time) {
      absl::StatusOr<double> seconds = options.step_time(c);
      if (!seconds.ok()) {
        return absl::Status(
            seconds.status().code(),
            absl::StrCat("PlanGrid: step time of ", c.Label(), ": ", seconds.status().message()));
      }
      if (!std::isfinite(*seconds) || *seconds < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("PlanGrid: the step time of %s is %g s; a step time model must give "
                            "a finite number >= 0",
                            c.Label(), *seconds));
      }
      c.step_seconds = *seconds;
    }
    if (!c.fits) continue;
    if (plan.chosen < 0 ||
        (plan.by_time && c.step_seconds < plan.candidates[plan.chosen].step_seconds)) {
      plan.chosen = static_cast<int>(i);
    }
  }
  if (plan.chosen < 0) {
    const auto smallest = std::min_element(plan.candidates.begin(), plan.candidates.end(),
                                           [](const GridCandidate& a, const GridCandidate& b) {
                                             return a.per_rank_bytes < b.per_rank_bytes;
                                           });
    return absl::ResourceExhaustedError(absl::StrFormat(
        "PlanGrid: nothing fits %s per rank on %d ranks (%d candidates: ZeRO stages 0-3 alone "
        "and every tp x pp split); the smallest need is %s per rank (%s); a cap of %s would fit "
        "it, or use more ranks",
        FormatBytes(per_rank_cap_bytes), world, plan.candidates.size(),
        FormatBytes(smallest->per_rank_bytes), smallest->Label(),
        FormatBytes(smallest->per_rank_bytes)));
  }
  const GridCandidate& chosen = plan.chosen_candidate();
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    GridCandidate& c = plan.candidates[i];
    if (static_cast<int>(i) == plan.chosen) {
      c.reason = plan.by_time ? "chosen: the fastest that fits" : "chosen: the first that fits";
    } else if (!c.fits) {
      c.reason =
          absl::StrFormat("over the cap by %s", FormatBytes(c.per_rank_bytes - per_rank_cap_bytes));
    } else if (plan.by_time) {
      c.reason = absl::StrFormat("fits; %.3g s slower than the choice",
                                 c.step_seconds - chosen.step_seconds);
    } else {
      c.reason = "fits; later in preference order";
    }
  }
  plan.description =
      absl::StrFormat("%s: %s per rank <= cap %s", chosen.Label(),
                      FormatBytes(chosen.per_rank_bytes), FormatBytes(per_rank_cap_bytes));
  if (plan.by_time) {
    int fitting = 0;
    for (const GridCandidate& c : plan.candidates) fitting += c.fits;
    absl::StrAppendFormat(&plan.description, "; the fastest of %d that fit (%.4g s per step)",
                          fitting, chosen.step_seconds);
  } else if (plan.chosen > 0) {
    // What was passed over: the stages before it alone, or all of them.
    const bool alone = chosen.model_parallel_ranks() == 1;
    size_t passed = 0;
    while (passed < plan.candidates.size() && plan.candidates[passed].model_parallel_ranks() == 1) {
      ++passed;
    }
    if (alone) passed = static_cast<size_t>(plan.chosen);
    const std::string which = passed == 1 ? "stage 0" : absl::StrFormat("stages 0-%d", passed - 1);
    absl::StrAppendFormat(&plan.description, "; %s alone need >= %s", which,
                          FormatBytes(SmallestNeed(plan.candidates, passed)));
    if (!alone && static_cast<size_t>(plan.chosen) > passed) {
      absl::StrAppendFormat(&plan.description, "; %d preferred tp x pp candidates do not fit",
                            plan.chosen - static_cast<int>(passed));
    }
  }
  return plan;
}

}  // namespace zeroshard
