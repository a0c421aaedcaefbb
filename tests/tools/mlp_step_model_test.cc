// The calibrated step-time model (PredictMlpEngineStep) against values
// computed by hand from a made-up profile, and the profile parser's errors.
#include "tools/mlp_step_model.h"

#include <cmath>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_seed.h"
#include "tools/machine_profile.h"

namespace zeroshard {
namespace {

// Round rates, so the hand arithmetic below stays readable.
MachineProfile RoundProfile() {
  MachineProfile p;
  p.cores = 2;
  p.calibrated_hidden = 64;
  p.calibrated_micro_batch = 4;
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
                                "m.json: field 'sgemm.gflops' is -3, outside its range "
                                "[0.001, 1000000] (10^9 FLOP/s)"))
      << e.status();
  auto schema = ParseMachineProfile("{\"schema\": \"x\"}", "m.json");
  EXPECT_TRUE(absl::StrContains(schema.status().message(), "field 'schema'"));
  auto not_json = ParseMachineProfile("nope", "m.json");
  EXPECT_TRUE(absl::StrContains(not_json.status().message(), "not a JSON object"));

  // The network section: absent unless measured; each link round-trips on
  // its own (a job on one node measures no inter-node link).
  EXPECT_EQ(json.find("\"network\""), std::string::npos);
  EXPECT_FALSE(back->network.measured());
  m.network.nodes = 3;
  m.network.ranks_per_node = 1;
  m.network.inter_node = {72.5e-6, 0.118e9, {8, 65536}, {72.6e-6, 0.63e-3}};
  auto net = ParseMachineProfile(MachineProfileJson(m), "m.json");
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_EQ(net->network.nodes, 3);
  EXPECT_EQ(net->network.ranks_per_node, 1);
  EXPECT_DOUBLE_EQ(net->network.inter_node.alpha_s, 72.5e-6);
  EXPECT_DOUBLE_EQ(net->network.inter_node.beta_bytes_per_s, 0.118e9);
  EXPECT_EQ(net->network.inter_node.seconds.size(), 2u);
  EXPECT_EQ(net->network.intra_node.beta_bytes_per_s, 0);
  nlohmann::json empty = nlohmann::json::parse(MachineProfileJson(m));
  empty["network"].erase("inter_node");
  auto no_link = ParseMachineProfile(empty.dump(), "m.json");
  ASSERT_FALSE(no_link.ok());
  EXPECT_TRUE(absl::StrContains(no_link.status().message(),
                                "field 'network' must hold 'intra_node', 'inter_node' or both"))
      << no_link.status();
}

// Every numeric field of a profile file, with the range docs/estimator.md
// gives it (written out here, not taken from the parser).
struct FieldCase {
  const char* pointer;  // JSON pointer into the file
  const char* name;     // as the message names it
  double min;
  double max;
  bool integer;
};

const FieldCase kFields[] = {
    {"/cores", "cores", 1, 1048576, true},
    {"/threads_per_rank", "threads_per_rank", 1, 1048576, true},
    {"/calibrated_shapes/hidden", "calibrated_shapes.hidden", 1, 65536, true},
    {"/calibrated_shapes/micro_batch", "calibrated_shapes.micro_batch", 1, 1048576, true},
    {"/sgemm/gflops", "sgemm.gflops", 1e-3, 1e6, false},
    {"/elementwise/gelu_ns", "elementwise.gelu_ns", 1e-3, 1e6, false},
    {"/elementwise/gelu_grad_ns", "elementwise.gelu_grad_ns", 1e-3, 1e6, false},
    {"/elementwise/copy_gbps", "elementwise.copy_gbps", 1e-3, 1e6, false},
    {"/optimizer/ns_per_param", "optimizer.ns_per_param", 1e-3, 1e6, false},
    {"/collectives/local/2/all_reduce/alpha_us", "collectives.local.2.all_reduce.alpha_us", 0, 1e6,
     false},
    {"/collectives/local/2/all_gather/beta_gbps", "collectives.local.2.all_gather.beta_gbps", 1e-3,
     1e6, false},
    {"/collectives/local/2/reduce_scatter/sizes_bytes/0",
     "collectives.local.2.reduce_scatter.sizes_bytes[0]", 0, 4611686018427387904.0, false},
    {"/collectives/local/2/reduce_scatter/seconds/1",
     "collectives.local.2.reduce_scatter.seconds[1]", 0, 1e6, false},
    {"/network/nodes", "network.nodes", 1, 1048576, true},
    {"/network/ranks_per_node", "network.ranks_per_node", 1, 1048576, true},
    {"/network/inter_node/alpha_us", "network.inter_node.alpha_us", 0, 1e6, false},
    {"/network/intra_node/beta_gbps", "network.intra_node.beta_gbps", 1e-3, 1e6, false},
    {"/network/inter_node/seconds/1", "network.inter_node.seconds[1]", 0, 1e6, false},
};

std::string FormatBound(double v) {
  return v == std::trunc(v) ? absl::StrFormat("%.0f", v) : absl::StrFormat("%g", v);
}

double LogUniform(std::mt19937_64& rng, double lo, double hi) {
  return std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi))(rng));
}

// A value outside [min, max]: above, below, negative, or (integers) a
// fraction inside the range.
double OutOfRangeValue(std::mt19937_64& rng, const FieldCase& f) {
  switch (std::uniform_int_distribution<int>(0, f.integer ? 3 : 2)(rng)) {
    case 0:  // just above, or far above up to 1.7e308
      return rng() & 1 ? f.max * (1 + LogUniform(rng, 1e-9, 1e3))
                       : LogUniform(rng, f.max * 1.001, 1.7e308);
    case 1:  // negative
      return -LogUniform(rng, 1e-300, 1.7e308);
    case 2:  // below a positive minimum, else negative
      return f.min > 0 ? f.min * std::uniform_real_distribution<double>(0, 0.999)(rng)
                       : -LogUniform(rng, 1e-300, 1.0);
    default:  // not a whole number
      return std::floor(LogUniform(rng, f.min, f.max - 1)) + 0.5;
  }
}

nlohmann::json ValidProfileJson() {
  MachineProfile m = RoundProfile();
  m.collectives["local"][2].reduce_scatter.sizes_bytes = {1024, 4096};
  m.collectives["local"][2].reduce_scatter.seconds = {1e-5, 2e-5};
  m.network.nodes = 2;
  m.network.ranks_per_node = 2;
  m.network.intra_node = {50e-6, 30e9, {8, 4194304}, {50e-6, 190e-6}};
  m.network.inter_node = {70e-6, 0.125e9, {8, 4194304}, {70e-6, 33e-3}};
  return nlohmann::json::parse(MachineProfileJson(m));
}

// The issue-17 profile ("ns_per_param": 1.7e308 gave inf and null with
// exit 0), then random values outside every field's range: each is refused
// naming the file, the field, the value and the range.
TEST(MachineProfileTest, EveryFieldOutsideItsRangeIsRefusedNamingIt) {
  nlohmann::json j = ValidProfileJson();
  ASSERT_TRUE(ParseMachineProfile(j.dump(), "m.json").ok());
  j["optimizer"]["ns_per_param"] = 1.7e308;
  auto huge = ParseMachineProfile(j.dump(), "prof.json");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(huge.status().message(),
            "prof.json: field 'optimizer.ns_per_param' is 1.7e+308, outside its range [0.001, "
            "1000000] (ns per param); write the profile with `zeroshard calibrate` or fix the "
            "field");

  std::mt19937_64 rng(testing::Seed());
  for (const FieldCase& f : kFields) {
    for (int trial = 0; trial < 20; ++trial) {
      nlohmann::json bad = ValidProfileJson();
      const double v = OutOfRangeValue(rng, f);
      bad[nlohmann::json::json_pointer(f.pointer)] = v;
      auto got = ParseMachineProfile(bad.dump(), "m.json");
      ASSERT_FALSE(got.ok()) << f.name << " = " << v << "; " << testing::SeedTrace();
      const std::string message(got.status().message());
      const std::string value = nlohmann::json(v).dump();
      const bool fraction = f.integer && v >= f.min && v <= f.max;
      EXPECT_TRUE(absl::StrContains(
          message,
          fraction
              ? absl::StrCat("m.json: field '", f.name, "' is ", value, ", not a whole number")
              : absl::StrCat("m.json: field '", f.name, "' is ", value, ", outside its range [",
                             FormatBound(f.min), ", ", FormatBound(f.max), "]")))
          << message << "; " << testing::SeedTrace();
    }
  }
  // Names are short and printable; measured points pair up.
  nlohmann::json long_name = ValidProfileJson();
  long_name["cpu"] = std::string(300, 'x');
  EXPECT_TRUE(absl::StrContains(ParseMachineProfile(long_name.dump(), "m.json").status().message(),
                                "field 'cpu' is 300 bytes long"));
  nlohmann::json unpaired = ValidProfileJson();
  unpaired["collectives"]["local"]["2"]["all_reduce"]["seconds"].push_back(1.0);
  EXPECT_TRUE(absl::StrContains(ParseMachineProfile(unpaired.dump(), "m.json").status().message(),
                                "must be lists of the same length"));
}

// The same ranges for a profile made in code, and for every figure derived
// from a random in-range profile and workload: finite, non-negative, at
// most kMaxPredictedStepSeconds, or an OutOfRange error naming the figure.
TEST(EngineStepModelTest, RandomInRangeProfilesGiveFiniteFiguresOrNameTheOverflow) {
  MachineProfile code = RoundProfile();
  code.optimizer_s_per_param = 1.7e308 * 1e-9;
  auto refused = PredictMlpEngineStep(kWorkload, 0, 1, "local", code);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(
      absl::StrContains(refused.status().message(), "field 'optimizer.ns_per_param' is 1.7"))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "e+308, outside its range [0.001, 1000000] (ns per param)"))
      << refused.status();

  std::mt19937_64 rng(testing::Seed());
  int out_of_range = 0;
  int predicted = 0;
  for (int trial = 0; trial < 300; ++trial) {
    MachineProfile m = RoundProfile();
    m.cores = static_cast<int>(LogUniform(rng, 1, 1 << 20));
    m.sgemm_flops_per_s = LogUniform(rng, 1e-3, 1e6) * 1e9;
    m.gelu_s_per_element = LogUniform(rng, 1e-3, 1e6) * 1e-9;
    m.gelu_grad_s_per_element = LogUniform(rng, 1e-3, 1e6) * 1e-9;
    m.copy_bytes_per_s = LogUniform(rng, 1e-3, 1e6) * 1e9;
    m.optimizer_s_per_param = LogUniform(rng, 1e-3, 1e6) * 1e-9;
    for (CollectiveFit* fit :
         {&m.collectives["local"][2].all_reduce, &m.collectives["local"][2].reduce_scatter,
          &m.collectives["local"][2].all_gather}) {
      fit->alpha_s = std::uniform_real_distribution<double>(0, 1e6)(rng) * 1e-6;
      fit->beta_bytes_per_s = LogUniform(rng, 1e-3, 1e6) * 1e9;
    }
    ASSERT_TRUE(ValidateMachineProfile(m).ok()) << testing::SeedTrace();
    MlpWorkload w;
    w.hidden = static_cast<int64_t>(LogUniform(rng, 1, 65536));
    w.blocks = static_cast<int>(LogUniform(rng, 1, 4096));
    w.micro_batch = static_cast<int64_t>(LogUniform(rng, 1, 1 << 20));
    const int stage = std::uniform_int_distribution<int>(0, 3)(rng);
    const int ranks = 1 + static_cast<int>(rng() & 1);
    auto p = PredictMlpEngineStep(w, stage, ranks, "local", m);
    const std::string what =
        absl::StrFormat("hidden %d blocks %d micro-batch %d stage %d ranks %d; %s", w.hidden,
                        w.blocks, w.micro_batch, stage, ranks, testing::SeedTrace());
    if (!p.ok()) {
      ASSERT_EQ(p.status().code(), absl::StatusCode::kOutOfRange) << p.status() << "; " << what;
      EXPECT_TRUE(absl::StrContains(p.status().message(), "passes the model's bound of 1000000 s"))
          << p.status();
      ++out_of_range;
      continue;
    }
    ++predicted;
    for (double v :
         {p->gemm, p->elementwise, p->compute, p->optimizer, p->comm_total, p->exposed_comm,
          p->loader, p->critical_path, p->cpu_work, p->contention, p->total}) {
      EXPECT_TRUE(v >= 0 && v <= kMaxPredictedStepSeconds) << v << "; " << what;
    }
    EXPECT_TRUE(std::isfinite(p->flops) && std::isfinite(p->comm_bytes)) << what;
  }
  // Both outcomes occur over the ranges.
  EXPECT_GT(out_of_range, 0) << testing::SeedTrace();
  EXPECT_GT(predicted, 0) << testing::SeedTrace();

  // By hand: 1 MFLOP/s against hidden 65536: 8 b h^2 (6L - 1) FLOPs.
  MachineProfile slow = RoundProfile();
  slow.sgemm_flops_per_s = 1e6;
  auto big = PredictMlpEngineStep(MlpWorkload{65536, 1000, 16}, 0, 1, "local", slow);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(big.status().message(), "the predicted gemm time, "))
      << big.status();
}

}  // namespace
}  // namespace zeroshard
