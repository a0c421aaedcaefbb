// Planner: ZeRO paper numbers, the automatic choice and its fallbacks, and
// buffers that are PlanBuffers verbatim where the engine runs the plan.
#include "zeroshard/estimate/planner.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/plan/internal/rank_memory.h"
#include "engine/src/plan/internal/step_time.h"
#include "gtest/gtest.h"
#include "tests/plan/llama3_8b_hand_count.h"
#include "tests/test_env.h"
#include "zeroshard/estimate/model_source.h"

namespace zeroshard::internal {
namespace {

ClusterSpec Cluster(int gpus, int64_t gpu_gib = 80) {
  ClusterSpec c;
  c.gpus = gpus;
  c.gpus_per_node = std::min(gpus, 8);
  c.gpu_mem_bytes = gpu_gib << 30;
  return c;
}

const PlacedBuffer* FindBuffer(const Candidate& c, const std::string& name) {
  for (const PlacedBuffer& b : c.buffers) {
    if (b.buffer.name == name) return &b;
  }
  return nullptr;
}

// ZeRO paper (Rajbhandari et al. 2020), Figure 1: Psi = 7.5B, N = 64,
// mixed-precision Adam (K = 12): 120, 31.4, 16.6 and 1.9 GB of model states
// per GPU for stages 0-3 (GB = 10^9 bytes).
TEST(PlannerTest, ZeroPaperFigure1) {
  auto model = ModelFromParamCount(7500000000);
  ASSERT_TRUE(model.ok());
  const double expected_gb[] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    PlanOptions options;
    options.stage = stage;
    options.offload = Offload::kNone;
    options.tp = options.pp = 1;
    auto plan = Planner::Plan(*model, Cluster(64, 1024), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->candidates.size(), 1u);
    const double gb = static_cast<double>(plan->candidates[0].per_gpu.model_states()) / 1e9;
    // The paper rounds to one decimal; layout padding adds < 0.001 GB.
    EXPECT_NEAR(gb, expected_gb[stage], 0.06) << "stage " << stage;
  }
}

TEST(PlannerTest, EngineConfigurationsUsePlanBuffersVerbatim) {
  auto model = ModelFromPreset("gpt2");
  ASSERT_TRUE(model.ok());
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    for (int stage = 0; stage <= 2; ++stage) {
      for (int accum : {1, 3}) {
        PlanOptions options;
        options.precision = precision;
        options.stage = stage;
        options.offload = Offload::kNone;
        options.tp = options.pp = 1;
        options.grad_accum_steps = accum;
        auto plan = Planner::Plan(*model, Cluster(4), options);
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_EQ(plan->candidates.size(), 1u);
        const Candidate& c = plan->candidates[0];
        EXPECT_TRUE(c.engine_supported);
        auto layout = FlatLayout::Create(model->spec, 4);
        ASSERT_TRUE(layout.ok());
        auto expected = PlanBuffers(*layout, Planner::EngineTrainSpec(options, stage, accum));
        ASSERT_TRUE(expected.ok());
        ASSERT_EQ(c.buffers.size(), expected->buffers.size());
        for (size_t i = 0; i < c.buffers.size(); ++i) {
          EXPECT_EQ(c.buffers[i].buffer.name, expected->buffers[i].name);
          EXPECT_EQ(c.buffers[i].buffer.numel, expected->buffers[i].numel);
          EXPECT_EQ(c.buffers[i].buffer.dtype, expected->buffers[i].dtype);
          EXPECT_EQ(c.buffers[i].placement, Placement::kDevice);
        }
        EXPECT_EQ(c.per_gpu.model_states(), expected->model_state_bytes());
      }
    }
  }
}

TEST(PlannerTest, Stage3OffloadAndFp16AreDerivedFromTheSameLayout) {
  auto model = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(model.ok());
  auto layout = FlatLayout::Create(model->spec, 8);
  ASSERT_TRUE(layout.ok());
  PlanOptions options;
  options.stage = 3;
  options.tp = options.pp = 1;
  options.offload = Offload::kOptimizerAndParams;
  options.precision = Precision::kFp16Mixed;
  auto plan = Planner::Plan(*model, Cluster(8), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->candidates.size(), 1u);
  const Candidate& c = plan->candidates[0];
  // ZeRO-Infinity to the host is what the engine runs (OffloadSpec grads
  // and params host): the sharded params' shards on the host, staged to
  // the device per gather.
  EXPECT_TRUE(c.engine_supported);
  const PlacedBuffer* shards = FindBuffer(c, kOffloadParamShardBuffer);
  ASSERT_NE(shards, nullptr);
  EXPECT_EQ(shards->buffer.dtype, DType::kFloat16);
  EXPECT_EQ(shards->placement, Placement::kHost);
  const PlacedBuffer* gather = FindBuffer(c, kParamGatherBuffer);
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->buffer.numel, 2 * layout->max_unit_numel());
  EXPECT_EQ(gather->placement, Placement::kDevice);
  for (const char* host : {kMasterBuffer, kAdamMBuffer, kAdamVBuffer, kOffloadGradShardBuffer}) {
    ASSERT_NE(FindBuffer(c, host), nullptr) << host;
    EXPECT_EQ(FindBuffer(c, host)->placement, Placement::kHost) << host;
  }
  // The device keeps the sharded gradient (the reductions' target) and the
  // persistent units' params.
  EXPECT_EQ(c.per_gpu.grads, 2 * layout->shard_numel());
  // On the host: 2 (gradient shard) + 12 (master, m, v) bytes per shard
  // element, and the sharded units' param shards.
  EXPECT_EQ(c.per_rank_host.grads, 2 * layout->shard_numel());
  EXPECT_EQ(c.per_rank_host.master + c.per_rank_host.optimizer, 12 * layout->shard_numel());
  EXPECT_EQ(c.per_rank_host.params, shards->buffer.bytes());
  EXPECT_GT(c.per_rank_host.params, 0);
  EXPECT_EQ(c.per_node_host_bytes, 8 * c.per_rank_host.total());
}

TEST(PlannerTest, PicksStage0WhenTheReplicatedModelFits) {
  auto model = ModelFromPreset("gpt2");
  ASSERT_TRUE(model.ok());
  auto plan = Planner::Plan(*model, Cluster(8), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_NE(plan->chosen_candidate(), nullptr);
  EXPECT_EQ(plan->chosen_candidate()->Label(), "stage 0");
  EXPECT_TRUE(plan->rejected.empty());
}

TEST(PlannerTest, ShardsFurtherWhenReplicationDoesNotFit) {
  auto model = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(model.ok());
  auto plan = Planner::Plan(*model, Cluster(8), PlanOptions{});
  ASSERT_TRUE(plan.ok());
  ASSERT_NE(plan->chosen_candidate(), nullptr);
  EXPECT_EQ(plan->chosen_candidate()->Label(), "stage 1");
  ASSERT_EQ(plan->rejected.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(plan->rejected[0], "stage 0: ")) << plan->rejected[0];
  EXPECT_TRUE(absl::StrContains(plan->rejected[0], "GiB per GPU > 80.0 GiB")) << plan->rejected[0];
}

TEST(PlannerTest, FallsBackToTensorAndPipelineStagesWhenStage3AloneDoesNotFit) {
  auto model = ModelFromPreset("llama-2-70b");
  ASSERT_TRUE(model.ok());
  auto plan = Planner::Plan(*model, Cluster(64), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Candidate* chosen = plan->chosen_candidate();
  ASSERT_NE(chosen, nullptr);
  EXPECT_GT(chosen->tp * chosen->pp, 1);
  EXPECT_TRUE(chosen->fits);
  EXPECT_EQ(model->transformer->heads % chosen->tp, 0);
  EXPECT_EQ(model->transformer->kv_heads % chosen->tp, 0);
  EXPECT_EQ(80 % chosen->pp, 0);
  EXPECT_LE(chosen->tp, 8);
  bool stage3_rejected = false;
  for (const std::string& r : plan->rejected) {
    stage3_rejected |= absl::StartsWith(r, "stage 3: ") && absl::StrContains(r, "> 80.0 GiB");
  }
  EXPECT_TRUE(stage3_rejected);
  EXPECT_TRUE(absl::StrContains(plan->why, "fastest"));
  // Sharding alone, with offload, does not fit either.
  for (const Candidate& c : plan->candidates) {
    if (c.Tier() < 3) {
      EXPECT_FALSE(c.fits) << c.Label();
    }
  }
}

TEST(PlannerTest, PipelineSplitsTheLayersAndKeepsTheHeadOnTheLastStage) {
  auto model = ModelFromPreset("llama-2-70b");
  ASSERT_TRUE(model.ok());
  PlanOptions options;
  options.tp = 8;
  options.pp = 4;
  options.stage = 1;
  options.offload = Offload::kNone;
  auto plan = Planner::Plan(*model, Cluster(64), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->candidates.size(), 1u);
  const Candidate& c = plan->candidates[0];
  EXPECT_EQ(c.dp, 2);
  EXPECT_EQ(c.micro_batches, 32);  // the global batch stays gpus x micro-batch
  // 1F1B: the first stage holds pp micro-batches of its 20 layers.
  EXPECT_EQ(c.worst_pp_stage, 0);
  EXPECT_GT(c.time.bubble, 0);

  int64_t layers = 0;
  const ModelSpec first = internal::RankSlice(*model, 8, 4, 0, &layers);
  EXPECT_EQ(layers, 20);
  EXPECT_EQ(first.units.front().name, "embed");
  EXPECT_EQ(first.units.back().name, "layers.19");
  const ModelSpec last = internal::RankSlice(*model, 8, 4, 3, &layers);
  EXPECT_EQ(last.units.front().name, "layers.60");
  EXPECT_EQ(last.units.back().name, "lm_head");
  // Tensor parallelism splits q_proj's output rows and o_proj's input columns.
  const ParamSpec& q = first.units[1].params[1];
  EXPECT_EQ(q.name, "self_attn.q_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{1024, 8192}));
  const ParamSpec& o = first.units[1].params[4];
  EXPECT_EQ(o.name, "self_attn.o_proj.weight");
  EXPECT_EQ(o.shape, (std::vector<int64_t>{8192, 1024}));
  // A tied embedding is kept on the last stage too.
  auto gpt2 = ModelFromPreset("gpt2");
  ASSERT_TRUE(gpt2.ok());
  const ModelSpec gpt2_last = internal::RankSlice(*gpt2, 1, 2, 1, &layers);
  EXPECT_EQ(gpt2_last.units.back().name, "lm_head_tied_copy");
}

TEST(PlannerTest, ImpossibleInputsAreInvalidArgument) {
  auto model = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(model.ok());
  auto expect_invalid = [&](PlanOptions options, ClusterSpec cluster, const std::string& needle) {
    auto plan = Planner::Plan(*model, cluster, options);
    ASSERT_FALSE(plan.ok()) << needle;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(plan.status().message(), needle)) << plan.status();
  };
  PlanOptions tp3;
  tp3.tp = 3;
  expect_invalid(tp3, Cluster(24), "--tp 3");
  PlanOptions pp5;
  pp5.pp = 5;
  expect_invalid(pp5, Cluster(40), "--pp 5");
  // The engine offloads at stage 0 too, but params live on the host only
  // at stage 3 (the only stage that shards them).
  PlanOptions offload0;
  offload0.stage = 0;
  offload0.offload = Offload::kOptimizerAndParams;
  expect_invalid(offload0, Cluster(8), "--offload");
  ClusterSpec ragged = Cluster(12);
  ragged.gpus_per_node = 8;
  expect_invalid(PlanOptions{}, ragged, "whole number of nodes");
  PlanOptions batch0;
  batch0.micro_batch = 0;
  expect_invalid(batch0, Cluster(8), "--micro-batch");
  auto gpt2 = ModelFromPreset("gpt2");
  PlanOptions long_seq;
  long_seq.seq = 4096;
  auto plan = Planner::Plan(*gpt2, Cluster(8), long_seq);
  EXPECT_FALSE(plan.ok());
}

TEST(PlannerTest, CostReportComparesGpuCounts) {
  auto model = ModelFromPreset("llama-2-13b");
  ASSERT_TRUE(model.ok());
  PlanOptions options;
  options.price_per_gpu_hour = 2.0;
  options.dataset_tokens = 1e11;
  auto plan = Planner::Plan(*model, Cluster(32), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->min_fitting_gpus, 0);
  ASSERT_FALSE(plan->scaling.empty());
  for (const ScalePoint& p : plan->scaling) {
    if (p.gpus == plan->min_fitting_gpus) {
      EXPECT_DOUBLE_EQ(p.scaling_efficiency, 1.0);
    }
    if (p.fits) {
      EXPECT_NEAR(p.epoch_s, 1e11 / p.tokens_per_s, 1e-6 * p.epoch_s);
      EXPECT_NEAR(p.epoch_cost, p.epoch_s / 3600 * p.gpus * 2.0, 1e-6 * p.epoch_cost);
    }
  }
  const Candidate* chosen = plan->chosen_candidate();
  ASSERT_NE(chosen, nullptr);
  EXPECT_GT(chosen->epoch_cost, 0);
  EXPECT_GT(chosen->scaling_efficiency, 0);
}

PlanOptions Forced(int stage, Offload offload, int tp = 1, int pp = 1) {
  PlanOptions options;
  options.stage = stage;
  options.offload = offload;
  options.tp = tp;
  options.pp = pp;
  return options;
}

// The one candidate of a fully forced plan (a copy: the plan is a temporary).
Candidate Only(const absl::StatusOr<Plan>& plan) {
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok() || plan->candidates.size() != 1) {
    ADD_FAILURE() << "expected one candidate";
    return Candidate{};
  }
  return plan->candidates.front();
}

// Full recomputation keeps each layer's input and rebuilds one layer at a
// time with flash attention: never more than selective (which keeps every
// layer's flash-attention set), at any length, split or pipeline.
TEST(PlannerTest, FullRecomputationNeverNeedsMoreActivationsThanSelective) {
  auto model = ModelFromPreset("llama-3-8b");
  ASSERT_TRUE(model.ok());
  for (int64_t seq : {2048, 4096, 32768, 131072}) {
    for (const auto& [tp, pp] : std::vector<std::pair<int, int>>{{1, 1}, {8, 1}, {8, 4}, {2, 32}}) {
      PlanOptions options = Forced(1, Offload::kNone, tp, pp);
      options.seq = seq;
      options.recompute = Recompute::kFull;
      const int64_t full = Only(Planner::Plan(*model, Cluster(64), options)).per_gpu.activations;
      options.recompute = Recompute::kSelective;
      const int64_t selective =
          Only(Planner::Plan(*model, Cluster(64), options)).per_gpu.activations;
      EXPECT_LE(full, selective) << "seq " << seq << " tp " << tp << " pp " << pp;
    }
  }
  // The reproducer: 128k tokens on tp 8 fit with full recomputation (it
  // was 149.3 GiB, more than selective's 96.7).
  PlanOptions options = Forced(1, Offload::kNone, 8, 1);
  options.seq = 131072;
  options.recompute = Recompute::kFull;
  const Candidate c = Only(Planner::Plan(*model, Cluster(64), options));
  EXPECT_TRUE(c.fits) << c.verdict;
  EXPECT_NEAR(static_cast<double>(c.per_gpu.total()) / (1 << 30), 21.2, 0.1);
  // The 21.2 GiB is the hand count's (tests/plan/llama3_8b_hand_count.h),
  // and the planner's breakdown is it to the byte.
  const testing::HandCountedBytes hand = testing::Llama3_8bTp8Dp8Stage1FullRecompute128k();
  EXPECT_NEAR(static_cast<double>(hand.total()) / (1 << 30), 21.2, 0.05);
  EXPECT_EQ(c.dp, 8);
  EXPECT_EQ(c.per_gpu.params, hand.params);
  EXPECT_EQ(c.per_gpu.grads, hand.grads);
  EXPECT_EQ(c.per_gpu.master, hand.master);
  EXPECT_EQ(c.per_gpu.optimizer, hand.optimizer);
  EXPECT_EQ(c.per_gpu.buffers, hand.buffers);
  EXPECT_EQ(c.per_gpu.activations, hand.activations);
  EXPECT_EQ(c.per_gpu.workspace, hand.workspace);
  EXPECT_EQ(c.per_gpu.reserve, hand.reserve);
  EXPECT_EQ(c.per_gpu.total(), hand.total());
}

TEST(PlannerTest, PlansClustersOfUpTo2To20GpusExactlyAndFast) {
  auto model = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(model.ok());
  // Above 1024 data-parallel ranks the sharding candidates are sized too.
  auto plan = Planner::Plan(*model, Cluster(4096), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_NE(plan->chosen_candidate(), nullptr);
  EXPECT_EQ(plan->chosen_candidate()->Label(), "stage 1");
  EXPECT_EQ(plan->chosen_candidate()->dp, 4096);
  for (const std::string& r : plan->rejected) EXPECT_FALSE(absl::StrContains(r, "limit")) << r;
  // 2^20 GPUs: the engine's own buffers, to the element, in well under a second.
  const auto begin = std::chrono::steady_clock::now();
  ClusterSpec huge = Cluster(1 << 20);
  plan = Planner::Plan(*model, huge, PlanOptions{});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LT(seconds, 1.0);
  auto layout = FlatLayout::Create(model->spec, 1 << 20);
  ASSERT_TRUE(layout.ok());
  for (const Candidate& c : plan->candidates) {
    if (c.Tier() != 1) continue;
    auto expected = PlanBuffers(*layout, Planner::EngineTrainSpec(plan->options, c.stage, 1));
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(c.per_gpu.model_states(), expected->model_state_bytes()) << c.Label();
    EXPECT_EQ(c.per_gpu.buffers, expected->BytesIn(MemoryCategory::kCommBuffers)) << c.Label();
  }
  // Stage 0 holds every padded element: 16 bytes each, exactly.
  EXPECT_EQ(plan->candidates[0].per_gpu.model_states(), 16 * layout->total_numel());
}

// The engine's host gradient shard (grads=host) at stage 1: the GPU keeps
// the whole gradient (it is reduced there), the host update reads the
// rank's shard from a host buffer, as at stage 2.
TEST(PlannerTest, Stage1OptimizerOffloadKeepsAGradientShardOnTheHost) {
  auto model = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(model.ok());
  auto layout = FlatLayout::Create(model->spec, 8);
  ASSERT_TRUE(layout.ok());
  const Offload host_grads{MemoryTier::kHost, MemoryTier::kHost, MemoryTier::kDevice};
  const Candidate s1 = Only(Planner::Plan(*model, Cluster(8), Forced(1, host_grads)));
  EXPECT_TRUE(s1.engine_supported);
  EXPECT_EQ(s1.per_gpu.grads, 2 * layout->total_numel());
  const PlacedBuffer* shard = FindBuffer(s1, kOffloadGradShardBuffer);
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(shard->placement, Placement::kHost);
  EXPECT_EQ(shard->buffer.numel, layout->shard_numel());
  EXPECT_EQ(shard->buffer.dtype, DType::kBFloat16);
  EXPECT_EQ(s1.per_rank_host.grads, 2 * layout->shard_numel());
  // 2 (grad shard) + 12 (master, m, v) bytes per shard element, as stage 2.
  EXPECT_EQ(s1.per_rank_host.model_states(), 14 * layout->shard_numel());
  EXPECT_EQ(s1.per_rank_nvme.total(), 0);
  const Candidate s2 = Only(Planner::Plan(*model, Cluster(8), Forced(2, host_grads)));
  EXPECT_EQ(s2.per_rank_host.model_states(), s1.per_rank_host.model_states());
  ASSERT_NE(FindBuffer(s2, kOffloadGradShardBuffer), nullptr);
  EXPECT_EQ(s2.per_gpu.grads, 2 * layout->shard_numel());
  EXPECT_EQ(s1.per_node_host_bytes, 8 * s1.per_rank_host.total());
}

TEST(PlannerTest, GatherPoolNeverExceedsTheShardedUnits) {
  auto model = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(model.ok());
  auto layout = FlatLayout::Create(model->spec, 8);
  ASSERT_TRUE(layout.ok());
  for (int depth : {2, 35, 36, 64}) {
    PlanOptions options = Forced(3, Offload::kNone);
    options.prefetch_depth = depth;
    const Candidate c = Only(Planner::Plan(*model, Cluster(8), options));
    const PlacedBuffer* gather = FindBuffer(c, kParamGatherBuffer);
    ASSERT_NE(gather, nullptr);
    // 35 units, all sharded: at most one buffer each.
    EXPECT_EQ(gather->buffer.numel, std::min(depth, 35) * layout->max_unit_numel()) << depth;
  }
}

TEST(PlannerTest, MixtureOfExpertsComputesWithItsActiveParams) {
  auto mixtral = ModelFromPreset("mixtral-8x7b");
  ASSERT_TRUE(mixtral.ok());
  PlanOptions options;
  options.seq = 4096;
  const double tokens = 64.0 * 4096;
  const double attention = 12.0 * 4096 * 4096 * 32;
  EXPECT_DOUBLE_EQ(internal::ModelFlopsPerStep(*mixtral, options, 64),
                   tokens * (6.0 * static_cast<double>(mixtral->active_params) + attention));
  EXPECT_LT(mixtral->active_params, mixtral->spec.NumParams() / 3);
}

TEST(PlannerTest, PlanningTheLargestModelsIsFast) {
  const auto begin = std::chrono::steady_clock::now();
  for (const char* name : {"llama-3-70b", "gpt3-175b"}) {
    auto model = ModelFromPreset(name);
    ASSERT_TRUE(model.ok());
    PlanOptions options;
    options.price_per_gpu_hour = 2.0;
    options.dataset_tokens = 1e12;
    auto plan = Planner::Plan(*model, Cluster(1024), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(plan->chosen_candidate(), nullptr) << name;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_LT(seconds, zeroshard::testing::TimeLimit(1.0));
}

}  // namespace
}  // namespace zeroshard::internal
