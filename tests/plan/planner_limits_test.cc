// The planner's counts are exact or refused: inputs past the documented
// ranges are InvalidArgument naming the flag, a candidate whose bytes would
// pass 2^63 is named in `rejected` (never shown with a wrapped number), and
// every number of a plan is finite.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard {
namespace {

ClusterSpec Cluster(int gpus) {
  ClusterSpec c;
  c.gpus = gpus;
  c.gpus_per_node = std::min(gpus, 8);
  return c;
}

void ExpectInvalid(const absl::StatusOr<Plan>& plan, const std::string& needle) {
  ASSERT_FALSE(plan.ok()) << needle;
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_TRUE(absl::StrContains(plan.status().message(), needle)) << plan.status();
  EXPECT_FALSE(absl::StrContains(plan.status().message(), "\n")) << plan.status();
}

TEST(PlannerLimitsTest, BatchAndTokensPast2To63AreRefused) {
  auto gpt2 = ModelFromPreset("gpt2");
  ASSERT_TRUE(gpt2.ok());
  PlanOptions options;
  options.micro_batch = 1000000000000000000;
  ExpectInvalid(Planner::Plan(*gpt2, Cluster(8), options), "lower --micro-batch");
  options.micro_batch = int64_t{1} << 62;
  ExpectInvalid(Planner::Plan(*gpt2, Cluster(8), options), "--micro-batch 4611686018427387904");
  // Fits in tokens per step, not in bytes of activations: refused by the
  // activation count, naming --seq and --micro-batch.
  auto llama = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(llama.ok());
  options.micro_batch = 1;
  options.seq = int64_t{1} << 45;
  ExpectInvalid(Planner::Plan(*llama, Cluster(8), options), "activations");
  // Micro-batches per step must stay an int.
  options = PlanOptions{};
  options.grad_accum_steps = 1 << 20;
  ExpectInvalid(Planner::Plan(*gpt2, Cluster(4096), options), "--grad-accum 1048576");
}

TEST(PlannerLimitsTest, OutOfRangeClusterAndCostInputsAreRefused) {
  auto gpt2 = ModelFromPreset("gpt2");
  ASSERT_TRUE(gpt2.ok());
  const std::vector<std::pair<std::function<void(ClusterSpec&, PlanOptions&)>, std::string>> cases =
      {{[](ClusterSpec&, PlanOptions& o) { o.price_per_gpu_hour = 1e308; }, "--price"},
       {[](ClusterSpec&, PlanOptions& o) { o.dataset_tokens = 1e30; }, "--tokens"},
       {[](ClusterSpec&, PlanOptions& o) { o.dataset_tokens = NAN; }, "--tokens"},
       {[](ClusterSpec& c, PlanOptions&) { c.mfu = 1e-300; }, "--mfu"},
       {[](ClusterSpec& c, PlanOptions&) { c.peak_tflops = 1e300; }, "--peak-tflops"},
       {[](ClusterSpec& c, PlanOptions&) { c.inter_node_gbps = 1e-300; }, "--inter-node-bw"},
       {[](ClusterSpec& c, PlanOptions&) { c.pcie_gbps = INFINITY; }, "--pcie-bw"},
       {[](ClusterSpec& c, PlanOptions&) { c.intra_node_latency_us = 1e300; },
        "--intra-node-latency"},
       {[](ClusterSpec& c, PlanOptions&) { c.gpus = (1 << 20) + 8; }, "--gpus"},
       {[](ClusterSpec& c, PlanOptions&) { c.gpu_mem_bytes = (int64_t{1} << 62) + 1; },
        "--gpu-mem"}};
  for (const auto& [mutate, flag] : cases) {
    ClusterSpec cluster = Cluster(8);
    PlanOptions options;
    mutate(cluster, options);
    ExpectInvalid(Planner::Plan(*gpt2, cluster, options), flag);
  }
  // The largest accepted price and dataset give finite costs.
  PlanOptions options;
  options.price_per_gpu_hour = kMaxPricePerGpuHour;
  options.dataset_tokens = kMaxDatasetTokens;
  auto plan = Planner::Plan(*gpt2, Cluster(8), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const Candidate& c : plan->candidates) {
    EXPECT_TRUE(std::isfinite(c.epoch_cost) && c.epoch_cost > 0) << c.epoch_cost;
  }
}

TEST(PlannerLimitsTest, CandidatesThatCannotBeSizedAreNamedNotWrapped) {
  // 2^42 tokens of Llama-3-8B: one GPU's activations pass 2^63 bytes
  // without tensor parallelism, but not split 4 or 8 ways with sequence
  // parallelism (nor 2 ways). The others are named, the splits are sized.
  auto model = ModelFromPreset("llama-3-8b");
  ASSERT_TRUE(model.ok());
  PlanOptions options;
  options.seq = int64_t{1} << 42;
  ClusterSpec cluster = Cluster(8);
  cluster.gpu_mem_bytes = int64_t{1} << 62;
  auto plan = Planner::Plan(*model, cluster, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const Candidate& c : plan->candidates) {
    EXPECT_GE(c.tp, 4) << c.Label();  // tp 1 and 2 pass 2^63
    EXPECT_TRUE(c.per_gpu.CheckedTotal().has_value());
    EXPECT_GT(c.per_gpu.activations, int64_t{1} << 59) << c.Label();
  }
  ASSERT_FALSE(plan->candidates.empty());
  bool named = false;
  for (const std::string& r : plan->rejected) {
    named |= absl::StartsWith(r, "stage 0: not sized: activations");
  }
  EXPECT_TRUE(named) << plan->why;
  // When no candidate can be sized, the first reason is the error.
  cluster.reserve_bytes = cluster.workspace_bytes = int64_t{1} << 62;
  options.seq = 0;
  ExpectInvalid(Planner::Plan(*model, cluster, options), "stage 0: pipeline stage 0");
}

}  // namespace
}  // namespace zeroshard
