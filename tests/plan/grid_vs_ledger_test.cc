// The planner's grid figures are the engine's allocation: on every rank of
// every dp x tp x pp grid below, at ZeRO stages 0-3, the ledger of the
// rank's shard engine (ShardModelSpec, dp group, model-parallel options)
// holds exactly the bytes PlanGrid lists for the rank's pipeline stage, and
// a step with model parallelism on allocates nothing more (peak = plan).
#include <cstdint>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"
#include "tests/grid_test_util.h"
#include "tests/runtime/local_grid.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

struct GridCase {
  int tp, pp, dp;
};

// Deterministic weights, the same on every dp rank of a position.
std::vector<float> InitialValues(int unit, int param, int64_t numel) {
  std::vector<float> v(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    v[i] = 0.01f * static_cast<float>((i * 7 + unit * 13 + param * 5) % 17 - 8);
  }
  return v;
}

void WriteGradient(const TensorView& view, int seed) {
  for (int64_t i = 0; i < view.numel; ++i) {
    const float g = 1e-3f * static_cast<float>((i * 11 + seed) % 23 - 11);
    if (view.dtype == DType::kFloat32) {
      view.as<float>()[i] = g;
    } else if (view.dtype == DType::kBFloat16) {
      view.as<uint16_t>()[i] = Fp32ToBf16(g);
    } else {
      view.as<uint16_t>()[i] = Fp32ToFp16(g);
    }
  }
}

TEST(GridVsLedgerTest, EveryRankOfEveryGridAllocatesThePlansBytes) {
  // Five units: pipeline stages of unequal size (pp 2: 2 + 3 units, pp 4:
  // 2 + 1 + 1 + 1), so each stage's figure is checked on its own.
  const ModelSpec model = testing::MlpGridSpec(5, 16);
  TrainSpec base;
  base.precision = Precision::kBf16Mixed;
  // One micro-batch per rank in dp-only terms: stages 0-1 of a dp-only run
  // would not stage gradients, but every grid here accumulates tp x pp
  // micro-batches per dp rank and does (the figure PlanGrid must include).
  base.grad_accum_steps = 1;
  base.max_grad_norm = 1.0;
  const std::vector<GridCase> grids = {{2, 1, 2}, {1, 2, 2}, {2, 2, 1},
                                       {2, 2, 2}, {1, 4, 1}, {4, 1, 1}};
  for (const GridCase& g : grids) {
    const int world = g.tp * g.pp * g.dp;
    auto grid_plan = PlanGrid(model, base, world, int64_t{1} << 40);
    ASSERT_TRUE(grid_plan.ok()) << grid_plan.status();
    for (int stage = 0; stage < 4; ++stage) {
      const GridCandidate* planned = nullptr;
      for (const GridCandidate& c : grid_plan->candidates) {
        if (c.tp == g.tp && c.pp == g.pp && c.stage == stage) planned = &c;
      }
      ASSERT_NE(planned, nullptr) << "tp " << g.tp << " pp " << g.pp << " stage " << stage;
      SCOPED_TRACE(planned->Label());
      TrainSpec train = base;
      train.zero_stage = stage;
      train.grad_accum_steps = base.grad_accum_steps * g.tp * g.pp;
      std::vector<int64_t> created(world, -1);
      std::vector<int64_t> peak(world, -1);
      std::mutex mu;
      const GridShape shape{g.dp, g.tp, g.pp};
      const absl::Status status =
          testing::RunLocalGrid(shape, [&](const testing::GridRank& r) -> absl::Status {
            ZS_ASSIGN_OR_RETURN(ModelSpec shard,
                                ShardModelSpec(model, g.tp, r.coord.tp, g.pp, r.coord.pp));
            auto device = CreateCpuDevice();
            ModelParallelOptions parallel;
            parallel.group = r.model_parallel;
            parallel.count_replicated = r.coord.tp == 0;
            ZS_ASSIGN_OR_RETURN(auto engine,
                                Engine::Create(shard, train, *device, *r.dp, parallel));
            const int64_t after_create = device->ledger().current_total();
            for (size_t u = 0; u < shard.units.size(); ++u) {
              for (size_t p = 0; p < shard.units[u].params.size(); ++p) {
                ZS_RETURN_IF_ERROR(
                    engine->SetParam(static_cast<int>(u), static_cast<int>(p),
                                     InitialValues(static_cast<int>(u), static_cast<int>(p),
                                                   shard.units[u].params[p].NumElements())));
              }
            }
            ZS_RETURN_IF_ERROR(engine->Start());
            ZS_RETURN_IF_ERROR(
                testing::StepWithGradients(*engine, [&](int u, int p, const TensorView& v) {
                  WriteGradient(v, u * 3 + p + r.coord.tp);
                }).status());
            std::lock_guard<std::mutex> lock(mu);
            created[r.rank] = after_create;
            peak[r.rank] = device->ledger().peak_total();
            return absl::OkStatus();
          });
      ASSERT_TRUE(status.ok()) << status;
      for (int rank = 0; rank < world; ++rank) {
        const int pp_rank = CoordOf(rank, shape).pp;
        EXPECT_EQ(created[rank], planned->stage_bytes[pp_rank]) << "rank " << rank;
        EXPECT_EQ(peak[rank], planned->stage_bytes[pp_rank]) << "rank " << rank;
      }
    }
  }
}

}  // namespace
}  // namespace zeroshard
