// The planner's offload rows: every policy the engine runs (the optimizer
// state on the host or NVMe, the gradient shard and stage 3's param shards
// on the host) is PlanEngineBuffers verbatim, each buffer on the tier the
// engine's ledgers record; the --offload spellings; the NVMe term of the
// step time.
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard {
namespace {

ClusterSpec Cluster(int gpus) {
  ClusterSpec c;
  c.gpus = gpus;
  c.gpus_per_node = std::min(gpus, 8);
  c.gpu_mem_bytes = int64_t{1} << 40;
  return c;
}

Placement PlacementOf(MemoryTier tier) {
  return tier == MemoryTier::kHost   ? Placement::kHost
         : tier == MemoryTier::kNvme ? Placement::kNvme
                                     : Placement::kDevice;
}

TEST(PlannerOffloadTest, OffloadRowsArePlanEngineBuffersPerTier) {
  auto model = ModelFromPreset("gpt2");
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937_64 rng(testing::Seed());
  const Precision precisions[] = {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed};
  for (int trial = 0; trial < 8; ++trial) {
    const int gpus = 1 << (rng() % 4);
    const int stage = static_cast<int>(rng() % 4);
    PlanOptions options;
    options.precision = precisions[rng() % 3];
    options.stage = stage;
    options.tp = options.pp = 1;
    options.grad_accum_steps = 1 + static_cast<int>(rng() % 3);
    const MemoryTier grads = rng() % 2 ? MemoryTier::kHost : MemoryTier::kDevice;
    const MemoryTier params = stage == 3 && rng() % 2 ? MemoryTier::kHost : MemoryTier::kDevice;
    const std::string where = testing::SeedTrace() + ", trial " + std::to_string(trial);
    int64_t device_bytes[3] = {0, 0, 0};
    for (MemoryTier tier : {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme}) {
      // Gradients and params leave the device only with the optimizer.
      const Offload offload =
          tier == MemoryTier::kDevice ? Offload::kNone : Offload{tier, grads, params};
      options.offload = offload;
      auto plan = Planner::Plan(*model, Cluster(gpus), options);
      ASSERT_TRUE(plan.ok()) << plan.status() << " " << where;
      ASSERT_EQ(plan->candidates.size(), 1u) << where;
      const Candidate& c = plan->candidates[0];
      EXPECT_TRUE(c.engine_supported) << c.Label() << " " << where;
      // The engine's own plan for this rank, as Engine::Create would ask.
      const TrainSpec train =
          Planner::EngineTrainSpec(plan->options, stage, c.micro_batches, offload);
      ASSERT_TRUE(train.Validate().ok()) << train.Validate() << " " << where;
      EXPECT_EQ(train.offload.optimizer, offload.optimizer);
      EXPECT_EQ(train.offload.grads, offload.grads);
      EXPECT_EQ(train.offload.params, offload.params);
      auto engine = PlanEngineBuffers(model->spec, train, gpus);
      ASSERT_TRUE(engine.ok()) << engine.status() << " " << where;
      ASSERT_EQ(c.buffers.size(), engine->buffers.size()) << c.Label() << " " << where;
      for (size_t i = 0; i < c.buffers.size(); ++i) {
        const PlannedBuffer& want = engine->buffers[i];
        const PlacedBuffer& got = c.buffers[i];
        EXPECT_EQ(got.buffer.name, want.name) << where;
        EXPECT_EQ(got.buffer.numel, want.numel) << want.name << " " << where;
        EXPECT_EQ(got.buffer.dtype, want.dtype) << want.name << " " << where;
        EXPECT_EQ(got.buffer.tier, want.tier) << want.name << " " << where;
        EXPECT_EQ(got.placement, PlacementOf(want.tier)) << want.name << " " << where;
      }
      // Per tier: the device's figure is the engine's device ledger plus
      // what the planner adds beside it (activations, workspace, reserve).
      const MemoryBreakdown& gpu = c.per_gpu;
      EXPECT_EQ(gpu.params + gpu.grads + gpu.master + gpu.optimizer + gpu.buffers +
                    (gpu.workspace - plan->cluster.workspace_bytes),
                engine->total_bytes(MemoryTier::kDevice))
          << c.Label() << " " << where;
      EXPECT_EQ(c.per_rank_host.total(), engine->total_bytes(MemoryTier::kHost))
          << c.Label() << " " << where;
      EXPECT_EQ(c.per_rank_nvme.total(), engine->total_bytes(MemoryTier::kNvme))
          << c.Label() << " " << where;
      if (tier == MemoryTier::kNvme) EXPECT_GT(c.per_rank_nvme.total(), 0) << where;
      if (tier != MemoryTier::kDevice) EXPECT_GT(c.per_rank_host.total(), 0) << where;
      EXPECT_EQ(c.per_node_host_bytes, c.per_rank_host.total() * std::min(gpus, 8)) << where;
      device_bytes[static_cast<int>(tier)] = engine->total_bytes(MemoryTier::kDevice);
    }
    if (params == MemoryTier::kDevice) {
      // The device drops by the optimizer state: 4 bytes per shard element
      // of each of master (mixed precision), m and v.
      auto dense = PlanEngineBuffers(
          model->spec, Planner::EngineTrainSpec(options, stage, options.grad_accum_steps), gpus);
      ASSERT_TRUE(dense.ok());
      const int64_t states = dense->BytesIn(MemoryCategory::kMasterParams) +
                             dense->BytesIn(MemoryCategory::kOptimizerState);
      EXPECT_EQ(device_bytes[0] - device_bytes[1], states) << where;
      EXPECT_EQ(device_bytes[0] - device_bytes[2], states) << where;
    } else {
      EXPECT_LT(device_bytes[1], device_bytes[0]) << where;
    }
  }
}

TEST(PlannerOffloadTest, ZeroInfinityToTheHostIsTheEnginesStage3) {
  auto model = ModelFromPreset("gpt2");
  ASSERT_TRUE(model.ok());
  PlanOptions options;
  options.stage = 3;
  options.tp = options.pp = 1;
  options.offload = Offload{MemoryTier::kNvme, MemoryTier::kHost, MemoryTier::kHost};
  auto plan = Planner::Plan(*model, Cluster(8), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Candidate& c = plan->candidates.at(0);
  EXPECT_TRUE(c.engine_supported);
  EXPECT_EQ(c.Label(), "stage 3 + offload optimizer=nvme,grads=host,params=host");
  EXPECT_GT(c.per_rank_nvme.optimizer, 0);
  EXPECT_GT(c.per_rank_host.params, 0);  // the sharded units' param shards
  EXPECT_GT(c.per_rank_host.grads, 0);   // the reduced gradient shard
  bool staged = false;
  for (const PlacedBuffer& b : c.buffers) {
    if (b.buffer.name == kParamStageBuffer) staged = b.placement == Placement::kDevice;
  }
  EXPECT_TRUE(staged) << "stage 3's gathers stage a host shard on the device";
}

TEST(PlannerOffloadTest, NvmeAddsTheSwapTrafficToTheStep) {
  auto model = ModelFromPreset("gpt2");
  ASSERT_TRUE(model.ok());
  std::mt19937_64 rng(testing::Seed());
  PlanOptions options;
  options.stage = 2;
  options.tp = options.pp = 1;
  ClusterSpec cluster = Cluster(8);
  cluster.nvme_read_gbps = 0.05 + 0.01 * static_cast<double>(rng() % 10);
  cluster.nvme_write_gbps = 0.02 + 0.01 * static_cast<double>(rng() % 10);
  options.offload = Offload::kOptimizer;
  auto host = Planner::Plan(*model, cluster, options);
  options.offload = Offload::kOptimizerNvme;
  auto nvme = Planner::Plan(*model, cluster, options);
  ASSERT_TRUE(host.ok() && nvme.ok());
  const Candidate& h = host->candidates.at(0);
  const Candidate& n = nvme->candidates.at(0);
  // bf16: master, m and v (12 bytes per shard element), the NVMe tier's
  // buffers, read and written every step.
  const double state_bytes = static_cast<double>(n.per_rank_nvme.total());
  const double swap =
      state_bytes / (cluster.nvme_read_gbps * 1e9) + state_bytes / (cluster.nvme_write_gbps * 1e9);
  EXPECT_GT(n.time.offload, h.time.offload) << testing::SeedTrace();
  // The same PCIe copies on both tiers; the update overlaps the swap
  // traffic, which is slower here: nvme - host = swap - adam.
  const double shard = state_bytes / 12.0;
  const double adam = shard / (cluster.cpu_adam_gparams_per_s * 1e9);
  ASSERT_GT(swap, adam);
  EXPECT_NEAR(n.time.offload - h.time.offload, swap - adam, 1e-9 * swap) << testing::SeedTrace();
  EXPECT_EQ(n.per_rank_nvme.total() % 12, 0);
}

TEST(PlannerOffloadTest, OffloadSpellingsParseAndPrint) {
  struct Case {
    const char* text;
    Offload want;
    const char* name;
  };
  const Case cases[] = {
      {"none", Offload::kNone, "none"},
      {"optimizer", Offload::kOptimizer, "optimizer=host"},
      {"optimizer+params", Offload::kOptimizerAndParams, "optimizer=host,grads=host,params=host"},
      {"optimizer=nvme", Offload::kOptimizerNvme, "optimizer=nvme"},
      {"optimizer=nvme,params=host",
       Offload{MemoryTier::kNvme, MemoryTier::kDevice, MemoryTier::kHost},
       "optimizer=nvme,params=host"},
      {"grads=host,optimizer=host", Offload{MemoryTier::kHost, MemoryTier::kHost},
       "optimizer=host,grads=host"},
      {"optimizer=device", Offload::kNone, "none"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseOffload(c.text);
    ASSERT_TRUE(parsed.ok()) << c.text << ": " << parsed.status();
    EXPECT_EQ(*parsed, c.want) << c.text;
    EXPECT_EQ(OffloadName(*parsed), c.name) << c.text;
    // The printed name parses back to the same policy.
    auto again = ParseOffload(OffloadName(*parsed));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *parsed) << c.text;
  }
  struct Bad {
    const char* text;
    const char* names;
  };
  for (const Bad& b : {Bad{"optimiser=host", "unknown state 'optimiser'"},
                       Bad{"optimizer=disk", "'disk' is not a tier optimizer may take"},
                       Bad{"params=nvme", "'nvme' is not a tier params may take"},
                       Bad{"grads=nvme", "'nvme' is not a tier grads may take"},
                       Bad{"optimizer=host,optimizer=nvme", "'optimizer' is given twice"},
                       Bad{"optimizer=", "'' is not a tier"}, Bad{"", "unknown state ''"}}) {
    auto parsed = ParseOffload(b.text);
    ASSERT_FALSE(parsed.ok()) << b.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(parsed.status().message());
    EXPECT_NE(message.find(b.names), std::string::npos) << message;
    EXPECT_NE(message.find("optimizer=device|host|nvme, grads=device|host, params=device|host"),
              std::string::npos)
        << message;
  }
}

TEST(PlannerOffloadTest, ImpossibleOffloadsAreRefused) {
  auto model = ModelFromPreset("gpt2");
  ASSERT_TRUE(model.ok());
  struct Case {
    int stage;
    Offload offload;
    const char* names;
  };
  for (const Case& c :
       {Case{2, Offload{MemoryTier::kDevice, MemoryTier::kHost}, "offload the optimizer too"},
        Case{3, Offload{MemoryTier::kDevice, MemoryTier::kDevice, MemoryTier::kHost},
             "offload the optimizer too"},
        Case{2, Offload{MemoryTier::kHost, MemoryTier::kDevice, MemoryTier::kHost},
             "--stage 3 for params=host"}}) {
    PlanOptions options;
    options.stage = c.stage;
    options.offload = c.offload;
    auto plan = Planner::Plan(*model, Cluster(8), options);
    ASSERT_FALSE(plan.ok()) << OffloadName(c.offload);
    EXPECT_NE(plan.status().message().find(c.names), std::string::npos) << plan.status();
  }
  for (double bad : {0.0, -1.0, 2e6}) {
    ClusterSpec cluster = Cluster(8);
    cluster.nvme_write_gbps = bad;
    auto plan = Planner::Plan(*model, cluster, PlanOptions{});
    ASSERT_FALSE(plan.ok()) << bad;
    EXPECT_NE(plan.status().message().find("--nvme-write-gbps"), std::string::npos)
        << plan.status();
  }
}

}  // namespace
}  // namespace zeroshard
