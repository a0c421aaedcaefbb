// ParamGatherer on its own (no engine), on 2 ranks: the updated-param
// all-gathers (stages 1-2) and the stage-3 gather pool deliver every unit's
// whole segment as the ranks' shards hold it (values set here per element),
// Gather and Release pair at every stage, and stage-3 prefetch turns on
// after the first step and off when a step leaves the recorded order.
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
  ZS_ASSIGN_OR_RETURN(void* data, g.Gather(unit, step, first));
  const float* values = static_cast<const float*>(data);
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
      if (step == 3) std::reverse(order.begin(), order.end());
      for (int u : order) {
        ZS_RETURN_IF_ERROR(GatherAndCheck(g, layout, seed, u, step, first));
        if (g.DescribeGathered().find(model.units[u].name) == std::string::npos) {
          return absl::InternalError("DescribeGathered: " + g.DescribeGathered());
        }
        if (stage == 3) {
          const int other = (u + 1) % units;
          if (g.Gather(other, step, first).status().code() !=
              absl::StatusCode::kFailedPrecondition) {
            return absl::InternalError("stage 3 gathered a second unit while one was held");
          }
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
      // On after the first step (2 slots: depth 1); off once step 3 left
      // the recorded order.
      const bool want_active = step < 3;
      if (g.prefetch_active() != want_active) {
        return absl::InternalError(absl::StrFormat("after step %d prefetch is %s", step,
                                                   g.prefetch_active() ? "on" : "off"));
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
