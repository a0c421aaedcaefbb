// The calibrated step-time model (PredictMlpEngineStep) against values
// computed by hand from a made-up profile, and the profile parser's errors.
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "zeroshard/machine_profile.h"
#include "zeroshard/planner.h"

namespace zeroshard {
namespace {

// Round rates, so the hand arithmetic below stays readable.
MachineProfile RoundProfile() {
  MachineProfile p;
  p.cores = 2;
  p.sgemm_flops_per_s = 1e9;
  p.gelu_s_per_element = 1e-9;
  p.gelu_grad_s_per_element = 2e-9;
  p.copy_bytes_per_s = 1e9;
  p.optimizer_s_per_param = 1e-9;
  CollectiveProfile c;
  c.all_reduce.alpha_s = 10e-6;
  c.all_reduce.beta_bytes_per_s = 1e9;
  c.reduce_scatter.alpha_s = 5e-6;
  c.reduce_scatter.beta_bytes_per_s = 2e9;
  c.all_gather.alpha_s = 5e-6;
  c.all_gather.beta_bytes_per_s = 2e9;
  p.collectives["local"][2] = c;
  return p;
}

// hidden 64, 2 blocks, micro-batch 4. Per block: W1 [256, 64], b1 [256],
// W2 [64, 256], b2 [64]: 33,088 params, every param start a multiple of 64.
// Each product is 2 x 4 x 256 x 64 = 131,072 FLOPs; forward 2 per block,
// backward 4 per block less the first block's dx: 11 products.
//   gemm        11 x 131,072 / 1e9                       = 1441.792 us
//   GELU        2 x 4 x 256 = 2048 elements x 1 ns      =    2.048 us
//   GELU'       2048 x 2 ns                              =    4.096 us
//   copies      2 x (3 x 33,088 x 4 + 4 x 12 x 64 x 4) B =  818.688 us
//   compute                                              = 2266.624 us
//   loader      4 products (524.288) + 2304 GELUs (2.304)
//               + 2 x 4 x 6 x 64 x 4 B (12.288)          =  538.880 us
const MlpWorkload kWorkload{64, 2, 4};
constexpr double kComputeUs = 2266.624;
constexpr double kLoaderUs = 538.880;

TEST(EngineStepModelTest, OneRankStageZeroIsComputePlusOptimizer) {
  auto p = PredictMlpEngineStep(kWorkload, 0, 1, "local", RoundProfile());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->compute * 1e6, kComputeUs, 1e-6);
  EXPECT_NEAR(p->loader * 1e6, kLoaderUs, 1e-6);
  // One rank: a unit is 33,088 used elements padded to 259 x 128 = 33,152;
  // the optimizer updates both units: 66,304 params x 1 ns.
  EXPECT_NEAR(p->optimizer * 1e6, 66.304, 1e-6);
  EXPECT_EQ(p->comm_total, 0.0);
  // The loader's thread has the second core: max(2332.928, 2871.808 / 2).
  EXPECT_NEAR(p->total * 1e6, 2332.928, 1e-6);
  EXPECT_EQ(p->contention, 0.0);
}

TEST(EngineStepModelTest, StageThreeOnTwoRanksByHand) {
  auto p = PredictMlpEngineStep(kWorkload, 3, 2, "local", RoundProfile());
  ASSERT_TRUE(p.ok()) << p.status();
  // Two ranks: shard 130 x 128 = 16,640 per unit, padded 33,280 (133,120 B).
  // optimizer: 2 units x 16,640 x 1 ns = 33.28 us.
  EXPECT_NEAR(p->optimizer * 1e6, 33.28, 1e-6);
  // reduce-scatter and all-gather of a unit: 5 + 133,120 / 2e3 = 71.56 us.
  // Stage 3: 2 reduce-scatters, 2 x 2 gathers (forward and backward), and
  // the small all-gather (5 + 128 / 2e3 = 5.064) and all-reduce (10.008).
  EXPECT_NEAR(p->comm_total * 1e6, 2 * 71.56 + 4 * 71.56 + 5.064 + 10.008, 1e-6);
  EXPECT_EQ(p->collectives, 2 * 3 + 2);
  // Exposed: the last reduction, the first gather and the small ones; the
  // other 286.24 us hide behind 2266.624 us of compute.
  EXPECT_NEAR(p->exposed_comm * 1e6, 71.56 + 71.56 + 15.072, 1e-6);
  EXPECT_NEAR(p->critical_path * 1e6, kComputeUs + 33.28 + 158.192, 1e-6);
  // Two ranks x (compute + loader + optimizer + comm) on two cores.
  const double work = kComputeUs + kLoaderUs + 33.28 + 444.432;
  EXPECT_NEAR(p->cpu_work * 1e6, work, 1e-6);
  EXPECT_NEAR(p->total * 1e6, work, 1e-6);
  EXPECT_NEAR(p->contention * 1e6, work - (kComputeUs + 33.28 + 158.192), 1e-6);
}

TEST(EngineStepModelTest, StagesDifferInTheirCollectives) {
  const MachineProfile m = RoundProfile();
  auto s0 = PredictMlpEngineStep(kWorkload, 0, 2, "local", m);
  auto s1 = PredictMlpEngineStep(kWorkload, 1, 2, "local", m);
  auto s2 = PredictMlpEngineStep(kWorkload, 2, 2, "local", m);
  ASSERT_TRUE(s0.ok() && s1.ok() && s2.ok());
  const double small = 15.072;
  // all-reduce of a unit: 10 + 133,120 / 1e3 = 143.12 us.
  EXPECT_NEAR(s0->comm_total * 1e6, 2 * 143.12 + small, 1e-6);
  EXPECT_NEAR(s1->comm_total * 1e6, 2 * 143.12 + 2 * 71.56 + small, 1e-6);
  EXPECT_NEAR(s2->comm_total * 1e6, 2 * 71.56 + 2 * 71.56 + small, 1e-6);
  // Stage 0 updates every param; stages 1-2 their shard.
  EXPECT_NEAR(s0->optimizer * 1e6, 2 * 33.28, 1e-6);
  EXPECT_NEAR(s1->optimizer * 1e6, 33.28, 1e-6);
}

TEST(EngineStepModelTest, MoreRanksThanCoresShareThem) {
  MachineProfile m = RoundProfile();
  m.collectives["local"][4] = m.collectives["local"][2];
  auto p = PredictMlpEngineStep(kWorkload, 0, 4, "local", m);
  ASSERT_TRUE(p.ok()) << p.status();
  // Only cores / ranks = half of each collective's time is this rank's CPU.
  const double work = p->compute + p->loader + p->optimizer + 0.5 * p->comm_total;
  EXPECT_NEAR(p->total, 4 * work / 2, 1e-12);
}

// mpirun binds each rank to one core at np <= 2: one rank's loader then
// shares the trainer's core though the machine has two.
TEST(EngineStepModelTest, RanksBoundToCpusUseOnlyThoseCores) {
  const MachineProfile m = RoundProfile();  // 2 cores
  const double critical_us = kComputeUs + 66.304;
  const double work_us = critical_us + kLoaderUs;  // 2871.808: above the path, below twice it
  auto unbound = PredictMlpEngineStep(kWorkload, 0, 1, "local", m, 0);
  ASSERT_TRUE(unbound.ok()) << unbound.status();
  EXPECT_NEAR(unbound->total * 1e6, critical_us, 1e-6);
  auto one_cpu = PredictMlpEngineStep(kWorkload, 0, 1, "mpi", m, 1);
  ASSERT_TRUE(one_cpu.ok()) << one_cpu.status();
  EXPECT_NEAR(one_cpu->critical_path * 1e6, critical_us, 1e-6);
  EXPECT_NEAR(one_cpu->cpu_work * 1e6, work_us, 1e-6);
  EXPECT_NEAR(one_cpu->total * 1e6, work_us, 1e-6);
  EXPECT_NEAR(one_cpu->contention * 1e6, kLoaderUs, 1e-6);
  EXPECT_EQ(one_cpu->usable_cores, 1);
  EXPECT_EQ(unbound->usable_cores, 2);
  // Bound to both cores (or more than the machine has) is not bound.
  auto two_cpus = PredictMlpEngineStep(kWorkload, 0, 1, "local", m, 2);
  auto many_cpus = PredictMlpEngineStep(kWorkload, 0, 1, "local", m, 64);
  ASSERT_TRUE(two_cpus.ok() && many_cpus.ok());
  EXPECT_DOUBLE_EQ(two_cpus->total, unbound->total);
  EXPECT_DOUBLE_EQ(many_cpus->total, unbound->total);

  // Two ranks, one core each, on two cores: the same cores as unbound.
  auto pair_unbound = PredictMlpEngineStep(kWorkload, 3, 2, "local", m, 0);
  auto pair_bound = PredictMlpEngineStep(kWorkload, 3, 2, "local", m, 1);
  ASSERT_TRUE(pair_unbound.ok() && pair_bound.ok());
  EXPECT_DOUBLE_EQ(pair_bound->total, pair_unbound->total);
  EXPECT_DOUBLE_EQ(pair_bound->contention, pair_unbound->contention);
  EXPECT_EQ(pair_bound->usable_cores, 2);

  auto negative = PredictMlpEngineStep(kWorkload, 0, 1, "local", m, -1);
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(negative.status().message(), "cpus per rank -1 outside [0, 2^20]"))
      << negative.status();
  EXPECT_FALSE(PredictMlpEngineStep(kWorkload, 0, 1, "local", m, (1 << 20) + 1).ok());
}

TEST(EngineStepModelTest, MissingCollectivesNameTheCalibrateCommand) {
  auto p = PredictMlpEngineStep(kWorkload, 1, 4, "mpi", RoundProfile());
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "no mpi collectives for 4 ranks"));
  EXPECT_TRUE(absl::StrContains(p.status().message(), "mpirun -np 4 zeroshard calibrate"));
  EXPECT_FALSE(PredictMlpEngineStep(kWorkload, 4, 2, "local", RoundProfile()).ok());
}

TEST(MachineProfileTest, RoundTripsAndNamesTheBadField) {
  MachineProfile m = RoundProfile();
  m.calibrated_hidden = 64;
  m.calibrated_micro_batch = 4;
  const std::string json = MachineProfileJson(m);
  auto back = ParseMachineProfile(json, "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_DOUBLE_EQ(back->sgemm_flops_per_s, 1e9);
  EXPECT_DOUBLE_EQ(back->collectives.at("local").at(2).all_reduce.alpha_s, 10e-6);

  std::string bad = json;
  bad.replace(bad.find("\"gflops\": 1.0"), 13, "\"gflops\": -3");
  auto e = ParseMachineProfile(bad, "m.json");
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::StrContains(e.status().message(),
                                "m.json: field 'sgemm.gflops' must be a "
                                "positive number (got -3)"))
      << e.status();
  auto schema = ParseMachineProfile("{\"schema\": \"x\"}", "m.json");
  EXPECT_TRUE(absl::StrContains(schema.status().message(), "field 'schema'"));
  auto not_json = ParseMachineProfile("nope", "m.json");
  EXPECT_TRUE(absl::StrContains(not_json.status().message(), "not a JSON object"));
}

}  // namespace
}  // namespace zeroshard
