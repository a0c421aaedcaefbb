// The estimator for the GPT example (examples/gpt): the spec it builds from a
// tied GPT-2 config.json is the trainer's (an "lm_head" unit aliasing
// embed.wte.weight, stored and counted once), its model states are
// PlanEngineBuffers of that spec at every stage, and --activations
// gpt-example lists the trainer's own tensors, checked here against a hand
// count from the sizes (fresh random sizes every run).
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/plan/internal/rank_memory.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/estimate/fine_tuning.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard {
namespace {

using testing::Seed;
using testing::SeedTrace;

struct GptSizes {
  int64_t layers, heads, width, vocab, positions;
  std::string Config(bool tied = true) const {
    return absl::StrFormat(
        R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": %d,
            "n_head": %d, "n_embd": %d, "n_positions": %d, "vocab_size": %d,
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": %s})",
        layers, heads, width, positions, vocab, tied ? "true" : "false");
  }
};

GptSizes RandomSizes(std::mt19937_64& rng) {
  GptSizes s;
  s.layers = 1 + static_cast<int64_t>(rng() % 4);
  s.heads = 1 + static_cast<int64_t>(rng() % 4);
  s.width = s.heads * (1 + static_cast<int64_t>(rng() % 12));
  s.vocab = 3 + static_cast<int64_t>(rng() % 300);
  s.positions = 8 + static_cast<int64_t>(rng() % 64);
  return s;
}

PlanOptions GptOptions(int stage, Precision precision, Recompute recompute, int64_t seq,
                       int64_t micro_batch) {
  PlanOptions o;
  o.activations = ActivationModel::kGptExample;
  o.stage = stage;
  o.precision = precision;
  o.recompute = recompute;
  o.seq = seq;
  o.micro_batch = micro_batch;
  return o;
}

ClusterSpec CpuRanks(int ranks) {
  ClusterSpec c;
  c.gpus = c.gpus_per_node = ranks;
  c.reserve_bytes = 0;
  c.workspace_bytes = 0;
  return c;
}

TEST(GptExampleEstimateTest, TiedGpt2SpecHasTheTrainersUnitsAndCountsTheHeadOnce) {
  std::mt19937_64 rng(Seed() + 11);
  const GptSizes s = RandomSizes(rng);
  SCOPED_TRACE(SeedTrace());
  auto model = ModelFromHfConfig(s.Config(), "config.json");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelSpec& spec = model->spec;
  const int64_t c = s.width;
  ASSERT_EQ(spec.units.size(), static_cast<size_t>(s.layers + 3));
  EXPECT_EQ(spec.units[0].name, "embed");
  EXPECT_EQ(spec.units[0].params[0].name, "wte.weight");
  EXPECT_EQ(spec.units[0].params[1].name, "wpe.weight");
  const std::vector<std::string> block = {
      "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
      "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  for (int64_t i = 0; i < s.layers; ++i) {
    const UnitSpec& unit = spec.units[1 + i];
    EXPECT_EQ(unit.name, absl::StrCat("h.", i));
    ASSERT_EQ(unit.params.size(), block.size());
    for (size_t p = 0; p < block.size(); ++p) EXPECT_EQ(unit.params[p].name, block[p]);
    EXPECT_EQ(unit.params[2].shape, (std::vector<int64_t>{c, 3 * c}));
    EXPECT_EQ(unit.params[8].shape, (std::vector<int64_t>{c, 4 * c}));
    EXPECT_EQ(unit.params[10].shape, (std::vector<int64_t>{4 * c, c}));
  }
  EXPECT_EQ(spec.units[s.layers + 1].name, "final_norm");
  const UnitSpec& head = spec.units[s.layers + 2];
  EXPECT_EQ(head.name, "lm_head");
  ASSERT_EQ(head.params.size(), 1u);
  EXPECT_EQ(head.params[0].name, "lm_head.weight");
  EXPECT_EQ(head.params[0].shape, (std::vector<int64_t>{s.vocab, c}));
  ASSERT_TRUE(head.params[0].tied_to.has_value());
  EXPECT_EQ(head.params[0].tied_to->unit, "embed");
  EXPECT_EQ(head.params[0].tied_to->param, "wte.weight");

  // Hand count: V C + P C, per block 12 C^2 + 13 C (c_attn 3C^2 + 3C,
  // c_proj C^2 + C, c_fc 4C^2 + 4C, mlp.c_proj 4C^2 + C, two norms 4C), ln_f 2C.
  const int64_t stored = s.vocab * c + s.positions * c + s.layers * (12 * c * c + 13 * c) + 2 * c;
  EXPECT_EQ(spec.NumStoredParams(), stored);
  EXPECT_EQ(spec.NumParams(), stored + s.vocab * c);  // the manifest's count: every use
  EXPECT_EQ(model->active_params, stored);
  auto plan =
      Planner::Plan(*model, CpuRanks(2), GptOptions(1, Precision::kFp32, Recompute::kNone, 4, 1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->params, stored);
  EXPECT_EQ(plan->num_units, s.layers + 3);

  // Untied: the head is a param of its own (no alias).
  auto untied = ModelFromHfConfig(s.Config(/*tied=*/false), "untied.json");
  ASSERT_TRUE(untied.ok()) << untied.status();
  EXPECT_FALSE(untied->spec.units.back().params[0].tied_to.has_value());
  EXPECT_EQ(untied->spec.NumStoredParams(), stored + s.vocab * c);
}

// The planner's model states and buffers for the tied spec are the
// engine's own plan (PlanEngineBuffers of the same spec), buffer by buffer:
// the alias adds nothing, wte sits in a segment of its own.
TEST(GptExampleEstimateTest, ModelStatesEqualTheEnginesPlanAtEveryStage) {
  std::mt19937_64 rng(Seed() + 12);
  const GptSizes s = RandomSizes(rng);
  auto model = ModelFromHfConfig(s.Config(), "config.json");
  ASSERT_TRUE(model.ok()) << model.status();
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
      for (int stage = 0; stage <= 3; ++stage) {
        SCOPED_TRACE(absl::StrCat(ranks, " ranks, ", PrecisionName(precision), ", stage ", stage,
                                  "; ", SeedTrace()));
        auto plan = Planner::Plan(*model, CpuRanks(ranks),
                                  GptOptions(stage, precision, Recompute::kFull, 8, 2));
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_EQ(plan->candidates.size(), 1u);
        const Candidate& c = plan->candidates[0];
        EXPECT_TRUE(c.engine_supported);
        TrainSpec train;
        train.zero_stage = stage;
        train.precision = precision;
        auto engine = PlanEngineBuffers(model->spec, train, ranks);
        ASSERT_TRUE(engine.ok()) << engine.status();
        ASSERT_EQ(c.buffers.size(), engine->buffers.size());
        for (size_t b = 0; b < c.buffers.size(); ++b) {
          EXPECT_EQ(c.buffers[b].buffer.name, engine->buffers[b].name);
          EXPECT_EQ(c.buffers[b].buffer.bytes(), engine->buffers[b].bytes())
              << engine->buffers[b].name;
        }
        EXPECT_EQ(c.per_gpu.model_states(), engine->model_state_bytes());
        EXPECT_EQ(c.per_gpu.buffers, engine->BytesIn(MemoryCategory::kCommBuffers));
      }
    }
  }
}

// --activations gpt-example against a hand count of the trainer's tensors.
TEST(GptExampleEstimateTest, TrainerTensorsMatchAHandCount) {
  std::mt19937_64 rng(Seed() + 13);
  for (int trial = 0; trial < 20; ++trial) {
    const GptSizes s = RandomSizes(rng);
    auto model = ModelFromHfConfig(s.Config(), "config.json");
    ASSERT_TRUE(model.ok()) << model.status();
    const int64_t b = 1 + static_cast<int64_t>(rng() % 4);
    const int64_t t = 1 + static_cast<int64_t>(rng() % s.positions);
    const Recompute recompute = rng() % 2 == 0 ? Recompute::kNone : Recompute::kFull;
    const Precision precision = rng() % 2 == 0 ? Precision::kFp32 : Precision::kBf16Mixed;
    const int stage = static_cast<int>(rng() % 4);
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": L ", s.layers, " H ", s.heads, " C ", s.width,
                              " V ", s.vocab, " B ", b, " T ", t, " recompute ",
                              RecomputeName(recompute), " ", PrecisionName(precision), "; ",
                              SeedTrace()));
    ClusterSpec cluster = CpuRanks(2);
    cluster.workspace_bytes = static_cast<int64_t>(rng() % 1000);  // added on top
    auto plan = Planner::Plan(*model, cluster, GptOptions(stage, precision, recompute, t, b));
    ASSERT_TRUE(plan.ok()) << plan.status();

    const int64_t n = b * t, c = s.width, l = s.layers;
    const int64_t block_acts = n * (15 * c + 4) + b * s.heads * t * t;
    // Largest unit, in elements: a block (12 C^2 + 13 C), the embeddings
    // (V C + P C) or the head (V C, its alias of wte).
    const int64_t largest =
        std::max({12 * c * c + 13 * c, s.vocab * c + s.positions * c, s.vocab * c});
    std::map<std::string, std::pair<MemoryCategory, int64_t>> hand = {
        {"gpt.block_inputs", {MemoryCategory::kActivations, 4 * (l + 1) * n * c}},
        {"gpt.block_acts",
         {MemoryCategory::kActivations, 4 * block_acts * (recompute == Recompute::kFull ? 1 : l)}},
        {"gpt.final_norm", {MemoryCategory::kActivations, 4 * (n * c + 2 * n)}},
        {"gpt.logits", {MemoryCategory::kActivations, 4 * n * s.vocab}},
        {"gpt.tokens", {MemoryCategory::kActivations, 4 * 2 * n}},
        {"gpt.grad_io", {MemoryCategory::kWorkspace, 4 * 2 * n * c}},
        {"gpt.block_scratch", {MemoryCategory::kWorkspace, 4 * (6 * n * c + t * t)}},
        {"gpt.unit_grads", {MemoryCategory::kWorkspace, 4 * largest}},
    };
    if (precision != Precision::kFp32) {
      hand["gpt.unit_params"] = {MemoryCategory::kWorkspace, 4 * largest};
    }
    ASSERT_EQ(plan->trainer_tensors.size(), hand.size());
    int64_t activations = 0, workspace = cluster.workspace_bytes;
    for (const TrainerTensor& tensor : plan->trainer_tensors) {
      ASSERT_EQ(hand.count(tensor.name), 1u) << tensor.name;
      EXPECT_EQ(tensor.category, hand[tensor.name].first) << tensor.name;
      EXPECT_EQ(tensor.bytes, hand[tensor.name].second) << tensor.name;
      (hand[tensor.name].first == MemoryCategory::kActivations ? activations : workspace) +=
          hand[tensor.name].second;
    }
    ASSERT_EQ(plan->candidates.size(), 1u);
    // The engine's own workspace buffers (the 16-bit precisions' norm
    // blocks) stay in the category too.
    for (const PlacedBuffer& engine_buffer : plan->candidates[0].buffers) {
      if (engine_buffer.buffer.category == MemoryCategory::kWorkspace) {
        workspace += engine_buffer.buffer.bytes();
      }
    }
    EXPECT_EQ(plan->candidates[0].per_gpu.activations, activations);
    EXPECT_EQ(plan->candidates[0].per_gpu.workspace, workspace);
    EXPECT_EQ(plan->candidates[0].per_gpu.reserve, 0);
  }
}

TEST(GptExampleEstimateTest, GptExampleModeRefusesWhatTheExampleDoesNotRun) {
  const GptSizes s{2, 2, 16, 50, 32};
  auto model = ModelFromHfConfig(s.Config(), "config.json");
  ASSERT_TRUE(model.ok()) << model.status();
  auto expect_refused = [&](const ModelDescription& m, PlanOptions o, int gpus,
                            const std::string& needle) {
    auto plan = Planner::Plan(m, CpuRanks(gpus), o);
    ASSERT_FALSE(plan.ok()) << needle;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(plan.status().message(), needle)) << plan.status();
  };
  const PlanOptions base = GptOptions(1, Precision::kFp32, Recompute::kNone, 16, 1);
  PlanOptions selective = base;
  selective.recompute = Recompute::kSelective;
  expect_refused(*model, selective, 2, "--recompute none or full");
  PlanOptions tp = base;
  tp.tp = 2;
  expect_refused(*model, tp, 2, "tensor or pipeline");
  PlanOptions offload = base;
  offload.offload = Offload::kOptimizer;
  expect_refused(*model, offload, 2, "offload");
  auto untied = ModelFromHfConfig(s.Config(/*tied=*/false), "untied.json");
  ASSERT_TRUE(untied.ok());
  expect_refused(*untied, base, 2, "tie_word_embeddings false");
  ModelDescription lora = *model;
  ASSERT_TRUE(AddLoraAdapters(lora, 2).ok());
  expect_refused(lora, base, 2, "drop --lora and --freeze");
  ModelDescription frozen = *model;
  ASSERT_TRUE(FreezeParams(frozen.spec, "h.0.ln_1").ok());
  expect_refused(frozen, base, 2, "drop --lora and --freeze");
  auto llama = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(llama.ok());
  expect_refused(*llama, base, 2, "not a GPT2LMHeadModel");
  // Automatic choice in this mode: stages 0-3 only, no splits or offload.
  PlanOptions automatic = base;
  automatic.stage = -1;
  auto plan = Planner::Plan(*model, CpuRanks(4), automatic);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->candidates.size(), 4u);
  for (const Candidate& c : plan->candidates) EXPECT_TRUE(c.engine_supported) << c.Label();
}

// Pipeline splits of a tied model still plan: the last stage's copy of the
// embedding takes the place of the head that aliases it.
TEST(GptExampleEstimateTest, PipelineSplitsOfATiedModelKeepOneHeadOnTheLastStage) {
  auto gpt2 = ModelFromPreset("gpt2");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  int64_t layers = 0;
  const ModelSpec last = internal::RankSlice(*gpt2, 1, 2, 1, &layers);
  int heads = 0;
  for (const UnitSpec& u : last.units) {
    heads += u.name == "lm_head" || u.name == internal::kTiedEmbeddingCopyUnit;
    for (const ParamSpec& p : u.params) EXPECT_FALSE(p.tied_to.has_value()) << u.name;
  }
  EXPECT_EQ(heads, 1);
  const ModelSpec whole = internal::RankSlice(*gpt2, 1, 1, 0, &layers);
  EXPECT_EQ(whole.units.back().name, "lm_head");
  PlanOptions o;
  o.pp = 2;
  o.tp = 1;
  ClusterSpec cluster;
  cluster.gpus = cluster.gpus_per_node = 2;
  auto plan = Planner::Plan(*gpt2, cluster, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->candidates.empty());
}

}  // namespace
}  // namespace zeroshard
