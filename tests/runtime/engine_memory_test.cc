// The ledger's bytes equal the plan's, and the plan's equal the ZeRO formulas.
#include <cstdio>

#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "gtest/gtest.h"
#include "tests/runtime/engine_test_util.h"
#include "zeroshard/buffer_plan.h"

namespace zeroshard::testing {
namespace {

using internal::FlatLayout;
using internal::kParamAlignment;
using internal::kShardQuantum;
using internal::PlanBuffers;

TEST(EngineMemoryTest, LedgerEqualsPlanEqualsZeroFormulasForBf16Mixed) {
  const mlp::MlpConfig cfg = SmallMlp();
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  for (int world = 1; world <= 4; ++world) {
    auto layout = FlatLayout::Create(spec, world);
    ASSERT_TRUE(layout.ok());
    // Psi counted with the layout's padding; the padding is small.
    const int64_t psi = layout->total_numel();
    EXPECT_GE(psi, spec.NumParams());
    EXPECT_LE(psi - spec.NumParams(), static_cast<int64_t>(spec.units.size()) *
                                          (world * kShardQuantum + 4 * kParamAlignment));
    const int64_t n = world;
    for (int stage = 0; stage <= 3; ++stage) {
      RunConfig run;
      run.world = world;
      run.stage = stage;
      run.steps = 2;
      run.precision = Precision::kBf16Mixed;
      // What a trainer can ask before Engine::Create (the public API).
      auto plan = PlanEngineBuffers(spec, MakeTrainSpec(run), world);
      ASSERT_TRUE(plan.ok()) << plan.status();
      // ZeRO paper, mixed-precision Adam: 2 psi params + 2 psi grads + 12 psi
      // (fp32 master, m, v), split as the stage says.
      const int64_t expected[] = {2 * psi + 2 * psi + 12 * psi, 2 * psi + 2 * psi + 12 * psi / n,
                                  2 * psi + (2 * psi + 12 * psi) / n, 16 * psi / n};
      EXPECT_EQ(plan->model_state_bytes(), expected[stage])
          << "world " << world << " stage " << stage;
      EXPECT_EQ(plan->BytesIn(MemoryCategory::kParams), stage == 3 ? 2 * psi / n : 2 * psi);
      if (stage == 3) {
        // The gather pool: (max_gathered_units + prefetch_units) buffers of
        // the largest unit.
        const TrainSpec train = MakeTrainSpec(run);
        EXPECT_EQ(plan->Find(kParamGatherBuffer)->bytes(),
                  2 * (train.max_gathered_units + train.prefetch_units) * layout->max_unit_numel());
      }
      auto result = TrainMlp(cfg, run);
      ASSERT_TRUE(result.ok()) << result.status();
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(result->model_state_bytes[r], plan->model_state_bytes()) << "rank " << r;
        // The engine allocates the plan's buffers and nothing else.
        EXPECT_EQ(result->peak_bytes[r], plan->total_bytes()) << "rank " << r;
      }
      std::printf("bf16 world %d stage %d: model states per rank %lld bytes (stage 0: %lld)\n",
                  world, stage, static_cast<long long>(result->model_state_bytes[0]),
                  static_cast<long long>(expected[0]));
    }
  }
}

TEST(EngineMemoryTest, Fp32StagesShardWhatTheySay) {
  const ModelSpec spec = mlp::BuildModelSpec(SmallMlp());
  auto layout = FlatLayout::Create(spec, 4);
  ASSERT_TRUE(layout.ok());
  const int64_t psi = layout->total_numel();
  RunConfig run;
  run.world = 4;
  for (int stage = 0; stage <= 2; ++stage) {
    run.stage = stage;
    auto plan = PlanBuffers(*layout, MakeTrainSpec(run));
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->BytesIn(MemoryCategory::kParams), 4 * psi);
    EXPECT_EQ(plan->BytesIn(MemoryCategory::kMasterParams), 0);  // the params are the master
    EXPECT_EQ(plan->BytesIn(MemoryCategory::kGradients), stage == 2 ? psi : 4 * psi);
    EXPECT_EQ(plan->BytesIn(MemoryCategory::kOptimizerState), stage == 0 ? 8 * psi : 2 * psi);
  }
}

}  // namespace
}  // namespace zeroshard::testing
