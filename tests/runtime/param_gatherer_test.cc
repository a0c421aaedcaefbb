// ParamGatherer on its own (no engine), on 2 ranks: the updated-param
// all-gathers (stages 1-2) and the stage-3 gather pool deliver every unit's
// whole segment as the ranks' shards hold it (values set here per element),
// Gather and Release pair at every stage, stage 3 holds at most
// max_gathered_units units at once, and stage-3 prefetch turns on after the
// first step and a step that leaves the recorded order fails naming it.
#include "engine/src/runtime/param_gatherer.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/plan/buffer_plan.h"
#include "gtest/gtest.h"
#include "tests/runtime/runtime_test_services.h"
#include "tests/test_seed.h"

namespace zeroshard::testing {
namespace {

using internal::ElementRange;
using internal::FlatLayout;
using internal::ParamGatherer;
using internal::ShardBuffers;

float ParamValue(uint64_t seed, int unit, int64_t i) {
  return static_cast<float>((seed + 31 * static_cast<uint64_t>(unit) + 7 * i) % 1000) - 500.0f;
}

// Gathers `unit` and compares its whole segment with ParamValue.
absl::Status GatherAndCheck(ParamGatherer& g, const FlatLayout& layout, uint64_t seed, int unit,
                            int64_t step, bool first) {
  ZS_ASSIGN_OR_RETURN(std::vector<void*> data, g.Gather(unit, step, first));
  if (data.size() != 1) return absl::InternalError("a plain unit is one segment");
  const float* values = static_cast<const float*>(data[0]);
  for (int64_t i = 0; i < layout.unit(unit).padded_numel; ++i) {
    if (values[i] != ParamValue(seed, unit, i)) {
      return absl::InternalError(absl::StrFormat("step %d unit %d element %d: %g, expected %g",
                                                 step, unit, i, values[i],
                                                 ParamValue(seed, unit, i)));
    }
  }
  return absl::OkStatus();
}

absl::Status RunStage(int stage, int world) {
  const uint64_t seed = Seed() + static_cast<uint64_t>(stage);
  std::mt19937_64 rng(seed);
  const ModelSpec model = RandomModel(rng, 5);
  TrainSpec train;
  train.zero_stage = stage;
  train.prefetch_units = 1;
  train.max_gathered_units = 2;
  return RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<RankRig> rig,
                        RankRig::Create(model, train, world, rank, comm));
    const FlatLayout& layout = rig->layout;
    ShardBuffers& buffers = *rig->buffers;
    ParamGatherer g(model, layout, rig->plan, rank, DType::kFloat32, buffers, *rig->services);
    const int units = layout.num_units();
    // Every rank writes only its own shard of each unit (the optimizer's
    // part); the gathers must bring the others'.
    for (int u = 0; u < units; ++u) {
      const ElementRange shard = layout.ShardRange(u, rank);
      float* mine = static_cast<float*>(buffers.ParamsAt(u, shard.begin));
      for (int64_t i = shard.begin; i < shard.end; ++i)
        mine[i - shard.begin] = ParamValue(seed, u, i);
    }
    if (stage < 3) {
      g.IssueUpdatedParamGathers();
      const int64_t expected = world > 1 && stage > 0 ? units : 0;
      if (rig->services->log().total() != expected) {
        return absl::InternalError(absl::StrFormat("%d updated-param all-gathers, expected %d",
                                                   rig->services->log().total(), expected));
      }
      if (stage == 0) return absl::OkStatus();  // no sharding: nothing gathered
    }
    std::vector<int> order(units);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 order_rng(seed + 1);
    std::shuffle(order.begin(), order.end(), order_rng);
    for (int64_t step = 1; step <= 3; ++step) {
      const bool first = step == 1;
      if (step == 3) {
        // Leaving the first step's order is a named error, not a silent
        // fallback (prefetch would miss).
        std::reverse(order.begin(), order.end());
        const absl::Status left = g.Gather(order[0], step, first).status();
        if (left.code() != absl::StatusCode::kFailedPrecondition ||
            left.message().find("first step's") == absl::string_view::npos) {
          return absl::InternalError(absl::StrFormat("a step out of order: %s", left.ToString()));
        }
        break;
      }
      for (int u : order) {
        ZS_RETURN_IF_ERROR(GatherAndCheck(g, layout, seed, u, step, first));
        if (g.DescribeGathered().find(model.units[u].name) == std::string::npos) {
          return absl::InternalError("DescribeGathered: " + g.DescribeGathered());
        }
        if (stage == 3) {
          // max_gathered_units (2): a second unit at once, not a third.
          const int other = (u + 1) % units;
          ZS_RETURN_IF_ERROR(GatherAndCheck(g, layout, seed, other, step, first));
          const int third = (u + 2) % units;
          const absl::Status too_many = g.Gather(third, step, first).status();
          if (too_many.code() != absl::StatusCode::kFailedPrecondition ||
              too_many.message().find("at most 2 units") == absl::string_view::npos) {
            return absl::InternalError(
                absl::StrFormat("a third unit at once: %s", too_many.ToString()));
          }
          ZS_RETURN_IF_ERROR(g.Release(other));
        }
        ZS_RETURN_IF_ERROR(g.Release(u));
        const absl::Status twice = g.Release(u);
        if (twice.code() != absl::StatusCode::kFailedPrecondition ||
            twice.message().find("no unit is gathered") == absl::string_view::npos) {
          return absl::InternalError(absl::StrFormat("a second Release: %s", twice.ToString()));
        }
      }
      if (stage < 3) break;
      ZS_RETURN_IF_ERROR(g.DropPool());
      ZS_RETURN_IF_ERROR(g.EndStep(step, first));
      if (!g.prefetch_active()) {
        return absl::InternalError(absl::StrFormat("after step %d prefetch is off", step));
      }
    }
    return absl::OkStatus();
  });
}

TEST(ParamGathererTest, GathersWholeUnitsAndPairsGatherWithRelease) {
  for (int stage : {0, 1, 2, 3}) {
    const absl::Status s = RunStage(stage, 2);
    EXPECT_TRUE(s.ok()) << "stage " << stage << ": " << s << "; " << SeedTrace();
  }
}

}  // namespace
}  // namespace zeroshard::testing
