// ZeRO++ in the engine (TrainSpec::zeropp; docs/multinode.md, "ZeRO++").
// qwZ: stage 3's param all-gathers carry int8 blocks. The run trains the
// same model as the exact path within the quantization's error, is not the
// exact path (so the int8 path ran), the plan counts its buffer and equals
// the ledger on every rank, and the option is refused below stage 3.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gtest/gtest.h"
#include "kernels/common/quant_int8.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/buffer_plan.h"

namespace zeroshard::testing {
namespace {

constexpr int kWorld = 4;
constexpr int kSteps = 24;

TEST(EngineZeroPlusPlusTest, QuantizedWeightsTrainNearTheExactPath) {
  const mlp::MlpConfig cfg = SmallMlp();
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    SCOPED_TRACE(PrecisionName(precision));
    RunConfig exact;
    exact.world = kWorld;
    exact.stage = 3;
    exact.steps = kSteps;
    exact.precision = precision;
    RunConfig qwz = exact;
    qwz.quantized_weights = true;
    auto a = TrainMlp(cfg, exact);
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = TrainMlp(cfg, qwz);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->losses.size(), b->losses.size());
    double worst_loss = 0;
    for (size_t i = 0; i < a->losses.size(); ++i) {
      ASSERT_TRUE(std::isfinite(b->losses[i])) << "step " << i << ": loss " << b->losses[i];
      worst_loss = std::max(worst_loss, std::fabs(b->losses[i] - a->losses[i]) / a->losses[i]);
    }
    const double weights = RelativeL2Difference(*b, *a);
    std::printf(
        "%s: qwZ vs exact over %d steps: max relative loss difference %.3g, weights "
        "relative L2 %.3g\n",
        PrecisionName(precision), kSteps, worst_loss, weights);
    // Each gathered weight moves by at most half its block's scale (the
    // block's largest magnitude / 254): the loss by about that fraction.
    EXPECT_LT(worst_loss, 0.01) << SeedTrace();
    // Measured 0.0014-0.0016 over 10 seeds (fp32 and bf16): a bound 3x above.
    EXPECT_LT(weights, 0.005) << SeedTrace();
    EXPECT_FALSE(BitwiseEqual(*a, *b))
        << "qwZ gave the exact path's bits: the int8 path did not run";
    EXPECT_GT(weights, 0.0);

    // The plan counts the int8 packs; the engine allocates the plan.
    auto plan = PlanEngineBuffers(spec, MakeTrainSpec(qwz), kWorld);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const PlannedBuffer* packs = plan->Find(kParamGatherInt8Buffer);
    ASSERT_NE(packs, nullptr);
    const int64_t shard = plan->gather_slot_numel / kWorld;
    EXPECT_EQ(packs->bytes(),
              int64_t{plan->gather_slots} * kWorld * kernels::QuantPackedBytes(shard));
    auto exact_plan = PlanEngineBuffers(spec, MakeTrainSpec(exact), kWorld);
    ASSERT_TRUE(exact_plan.ok());
    EXPECT_EQ(exact_plan->Find(kParamGatherInt8Buffer), nullptr);
    EXPECT_EQ(plan->total_bytes(), exact_plan->total_bytes() + packs->bytes());
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(b->peak_bytes[r], plan->total_bytes()) << "rank " << r;
      EXPECT_EQ(b->model_state_bytes[r], plan->model_state_bytes()) << "rank " << r;
    }
  }
}

TEST(EngineZeroPlusPlusTest, QuantizedWeightsNeedStage3) {
  for (int stage = 0; stage <= 2; ++stage) {
    RunConfig run;
    run.stage = stage;
    run.quantized_weights = true;
    const absl::Status s = MakeTrainSpec(run).Validate();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("zeropp.quantized_weights (qwZ) quantizes stage 3's param "
                               "all-gathers, but zero_stage is " +
                               std::to_string(stage)),
              std::string::npos)
        << s;
  }
}

}  // namespace
}  // namespace zeroshard::testing
