// Planner: ZeRO paper numbers, the automatic choice and its fallbacks, and
// buffers that are PlanBuffers verbatim where the engine runs the plan.
#include "engine/src/plan/planner.h"

#include <chrono>

#include "absl/strings/match.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/internal/rank_memory.h"
#include "engine/src/plan/model_source.h"
#include "gtest/gtest.h"
#include "tests/test_env.h"

namespace zeroshard {
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
  for (PlanPrecision precision : {PlanPrecision::kFp32, PlanPrecision::kBf16}) {
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
  options.precision = PlanPrecision::kFp16;
  auto plan = Planner::Plan(*model, Cluster(8), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->candidates.size(), 1u);
  const Candidate& c = plan->candidates[0];
  EXPECT_FALSE(c.engine_supported);
  const PlacedBuffer* params = FindBuffer(c, kParamsBuffer);
  ASSERT_NE(params, nullptr);
  EXPECT_EQ(params->buffer.numel, layout->shard_numel());
  EXPECT_EQ(params->buffer.dtype, DType::kFloat16);
  EXPECT_EQ(params->placement, Placement::kHost);
  const PlacedBuffer* gather = FindBuffer(c, kParamGatherBuffer);
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->buffer.numel, 2 * layout->max_unit_numel());
  EXPECT_EQ(gather->placement, Placement::kDevice);
  for (const char* host : {kMasterBuffer, kAdamMBuffer, kAdamVBuffer, kGradsBuffer}) {
    ASSERT_NE(FindBuffer(c, host), nullptr) << host;
    EXPECT_EQ(FindBuffer(c, host)->placement, Placement::kHost) << host;
  }
  EXPECT_EQ(c.per_gpu.model_states(), 0);
  // 2 (params) + 2 (grads) + 12 (master, m, v) bytes per shard element.
  EXPECT_EQ(c.per_rank_host.model_states(), 16 * layout->shard_numel());
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
  PlanOptions offload0;
  offload0.stage = 0;
  offload0.offload = Offload::kOptimizer;
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
}  // namespace zeroshard
