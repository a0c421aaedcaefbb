// Frozen params, LoRA adapters and tied params in the planner: freeze
// patterns, and model-state bytes per GPU at ZeRO stages 0-3 against hand
// counts written from the shapes (a tied param stored once).
#include "zeroshard/estimate/fine_tuning.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/plan/internal/rank_memory.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard {
namespace {

using testing::Seed;
using testing::SeedTrace;

TEST(FineTuningTest, FreezePatternsAreGlobsOverUnitDotParam) {
  struct Case {
    const char* pattern;
    const char* unit;
    const char* param;
    bool matches;
  };
  const Case cases[] = {
      {"embed", "embed", "embed_tokens.weight", true},  // a unit and all below it
      {"embed", "embed_extra", "w", false},             // not a prefix of a name part
      {"layers.1", "layers.1", "mlp.up_proj.weight", true},
      {"layers.1", "layers.10", "mlp.up_proj.weight", false},
      {"layers.*.mlp.*", "layers.7", "mlp.down_proj.weight", true},
      {"layers.*.mlp.*", "layers.7", "self_attn.q_proj.weight", false},
      {"*lora_?.weight", "h.3", "attn.c_attn.lora_B.weight", true},
      {"*lora_?.weight", "h.3", "attn.c_attn.weight", false},
      {"layers.2.self_attn.q_proj.weight", "layers.2", "self_attn.q_proj.weight", true},
      {"layers.2.self_attn.q_proj", "layers.2", "self_attn.q_proj.weight", true},
      {"layers.2.self_attn.q", "layers.2", "self_attn.q_proj.weight", false},
      {"*", "final_norm", "norm.weight", true},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FreezePatternMatches(c.pattern, c.unit, c.param), c.matches)
        << c.pattern << " vs " << c.unit << "." << c.param;
  }
}

struct States {
  int64_t params, grads, master, optimizer;
};

// bf16 mixed: 2-byte params (all), and for trainable params a 2-byte
// gradient, a 4-byte fp32 master and two 4-byte moments; stage 1 shards the
// optimizer state over n GPUs, stage 2 the gradient too, stage 3 the params.
States HandStates(int64_t all, int64_t trainable, int stage, int64_t n) {
  return {stage >= 3 ? 2 * all / n : 2 * all, stage >= 2 ? 2 * trainable / n : 2 * trainable,
          stage >= 1 ? 4 * trainable / n : 4 * trainable,
          stage >= 1 ? 8 * trainable / n : 8 * trainable};
}

void ExpectStates(const ModelDescription& model, int gpus, int64_t all, int64_t trainable) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(absl::StrCat(model.name, " stage ", stage, " on ", gpus, " GPUs; ", SeedTrace()));
    PlanOptions options;
    options.stage = stage;
    options.offload = Offload::kNone;
    options.tp = options.pp = 1;
    ClusterSpec cluster;
    cluster.gpus = gpus;
    cluster.gpus_per_node = gpus;
    auto plan = Planner::Plan(model, cluster, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->params, all);
    EXPECT_EQ(plan->trainable_params, trainable);
    EXPECT_EQ(plan->frozen_params, all - trainable);
    ASSERT_EQ(plan->candidates.size(), 1u);
    const MemoryBreakdown& m = plan->candidates[0].per_gpu;
    const States hand = HandStates(all, trainable, stage, gpus);
    EXPECT_EQ(m.params, hand.params);
    EXPECT_EQ(m.grads, hand.grads);
    EXPECT_EQ(m.master, hand.master);
    EXPECT_EQ(m.optimizer, hand.optimizer);
  }
}

// A Llama-style config with fresh sizes, all multiples of 1024 elements per
// unit (so the layout pads nothing at up to 8 GPUs).
struct LlamaSizes {
  int64_t h = 1024, kv = 256, f = 0, vocab = 0, layers = 0;
  std::string Config(bool tied) const {
    return absl::StrFormat(
        R"({"architectures": ["LlamaForCausalLM"], "hidden_size": %d, "num_hidden_layers": %d,
            "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": %d,
            "vocab_size": %d, "max_position_embeddings": 2048, "tie_word_embeddings": %s})",
        h, layers, f, vocab, tied ? "true" : "false");
  }
  // q, o [h, h]; k, v [kv, h]; gate, up, down h x f; two RMSNorms.
  int64_t Layer() const { return 2 * h * h + 2 * kv * h + 3 * h * f + 2 * h; }
};

TEST(FineTuningTest, TiedEmbeddingIsCountedOnceAtEveryStage) {
  std::mt19937_64 rng(Seed());
  LlamaSizes s;
  s.f = 1024 * std::uniform_int_distribution<int64_t>(2, 6)(rng);
  s.vocab = 1024 * std::uniform_int_distribution<int64_t>(8, 40)(rng);
  s.layers = std::uniform_int_distribution<int64_t>(2, 6)(rng);
  const int gpus = 1 << std::uniform_int_distribution<int>(0, 3)(rng);
  const int64_t embedding = s.vocab * s.h;
  // Embedding once (the head is the same tensor), layers, final norm.
  const int64_t tied_params = embedding + s.layers * s.Layer() + s.h;
  auto tied = ModelFromHfConfig(s.Config(true), "tied.json");
  ASSERT_TRUE(tied.ok()) << tied.status();
  ExpectStates(*tied, gpus, tied_params, tied_params);
  auto untied = ModelFromHfConfig(s.Config(false), "untied.json");
  ASSERT_TRUE(untied.ok()) << untied.status();
  ExpectStates(*untied, gpus, tied_params + embedding, tied_params + embedding);
  // LoRA on the tied model: the embedding is frozen, still stored once.
  const int64_t r = 4 * std::uniform_int_distribution<int64_t>(1, 8)(rng);
  ASSERT_TRUE(AddLoraAdapters(*tied, r).ok());
  const int64_t adapters =
      s.layers * (r * (2 * (s.h + s.h) + 2 * (s.h + s.kv)) + r * (2 * (s.h + s.f) + (s.f + s.h)));
  ExpectStates(*tied, gpus, tied_params + adapters, adapters);
}

// A custom spec whose LM head names the embedding's table (ParamSpec::
// tied_to): the table is stored, sharded and trained once.
TEST(FineTuningTest, TiedToParamIsStoredOnce) {
  std::mt19937_64 rng(Seed());
  const int64_t h = 1024 * std::uniform_int_distribution<int64_t>(1, 3)(rng);
  const int64_t vocab = 1024 * std::uniform_int_distribution<int64_t>(1, 50)(rng);
  const bool head_bias = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
  const int gpus = 1 << std::uniform_int_distribution<int>(0, 3)(rng);
  ModelDescription model;
  model.name = "tied-spec";
  ParamSpec table{"table", {vocab, h}};
  model.spec.units.push_back({"embed", {table}});
  model.spec.units.push_back({"block", {ParamSpec{"w", {h, h}}, ParamSpec{"b", {h}}}});
  ParamSpec head_w{"w", {vocab, h}};
  head_w.tied_to = ParamRef{"embed", "table"};
  UnitSpec head{"head", {head_w}};
  if (head_bias) head.params.push_back(ParamSpec{"bias", {vocab}});
  model.spec.units.push_back(head);
  ASSERT_TRUE(model.spec.Validate().ok()) << model.spec.Validate();
  const int64_t stored = vocab * h + h * h + h + (head_bias ? vocab : 0);
  ExpectStates(model, gpus, stored, stored);

  // Freezing the alias freezes the one tensor: the embedding's table.
  ASSERT_TRUE(FreezeParams(model.spec, "head.w").ok());
  EXPECT_FALSE(model.spec.units[0].params[0].trainable);
  ASSERT_TRUE(model.spec.Validate().ok()) << model.spec.Validate();
  const ParamCounts counts = CountParams(model.spec);
  EXPECT_EQ(counts.frozen, vocab * h);
  EXPECT_EQ(counts.trainable, stored - vocab * h);
  ExpectStates(model, gpus, stored, stored - vocab * h);
}

TEST(FineTuningTest, FreezeRefusesAPatternThatMatchesNothing) {
  auto model = ModelFromPreset("gpt2");
  ASSERT_TRUE(model.ok());
  const absl::Status s = FreezeParams(model->spec, "h.*.mlp.c_fcx");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'h.*.mlp.c_fcx' matches no param"), std::string::npos) << s;
  EXPECT_NE(s.message().find("e.g. 'embed.wte.weight'"), std::string::npos) << s;
  for (const UnitSpec& u : model->spec.units) {
    for (const ParamSpec& p : u.params) EXPECT_TRUE(p.trainable) << u.name << "." << p.name;
  }
}

// A frozen param has no weight gradient: 4 FLOPs per token (forward and
// input gradient) instead of 6. Llama-2-7B, all but the attention frozen.
TEST(FineTuningTest, FrozenParamsSkipTheWeightGradientFlops) {
  auto full = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(full.ok());
  ModelDescription frozen = *full;
  std::mt19937_64 rng(Seed());
  const int layer = std::uniform_int_distribution<int>(0, 31)(rng);
  ASSERT_TRUE(FreezeParams(frozen.spec, "*mlp*").ok());
  ASSERT_TRUE(FreezeParams(frozen.spec, absl::StrCat("layers.", layer)).ok());
  ASSERT_TRUE(FreezeParams(frozen.spec, "embed").ok());
  const double n = 6738415616.0;
  const double h = 4096, seq = 4096;
  // Trainable: q, k, v, o and two norms in 31 layers, the final norm, the
  // LM head.
  const double trainable = 31 * (4 * h * h + 2 * h) + h + 32000 * h;
  const double attention = 12 * seq * 32 * 128 * 32;  // 12 s (a d) L per token
  PlanOptions options;
  options.seq = static_cast<int64_t>(seq);
  options.recompute = Recompute::kNone;
  options.stage = 0;
  options.offload = Offload::kNone;
  options.tp = options.pp = 1;
  ClusterSpec cluster;
  cluster.gpus = cluster.gpus_per_node = 8;
  auto full_plan = Planner::Plan(*full, cluster, options);
  auto frozen_plan = Planner::Plan(frozen, cluster, options);
  ASSERT_TRUE(full_plan.ok() && frozen_plan.ok());
  const double ratio =
      frozen_plan->candidates[0].time.compute / full_plan->candidates[0].time.compute;
  EXPECT_NEAR(ratio, (4 * n + 2 * trainable + attention) / (6 * n + attention), 1e-12)
      << SeedTrace();
}

// Tensor parallelism splits an adapter where it splits its weight: B along
// the output of a column-parallel weight, A along the input of a
// row-parallel one; the rank side is never split.
TEST(FineTuningTest, LoraAdaptersFollowTheirWeightsTensorSplit) {
  auto model = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE(AddLoraAdapters(*model, 16).ok());
  int64_t layers = 0;
  const ModelSpec slice = internal::RankSlice(*model, 4, 1, 0, &layers);
  auto shape_of = [&](const std::string& name) {
    for (const ParamSpec& p : slice.units[1].params) {
      if (p.name == name) return p.shape;
    }
    ADD_FAILURE() << name << " not in " << slice.units[1].name;
    return std::vector<int64_t>{};
  };
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(shape_of("self_attn.q_proj.lora_A.weight"), (Shape{16, 4096}));
  EXPECT_EQ(shape_of("self_attn.q_proj.lora_B.weight"), (Shape{1024, 16}));
  EXPECT_EQ(shape_of("self_attn.o_proj.lora_A.weight"), (Shape{16, 1024}));
  EXPECT_EQ(shape_of("self_attn.o_proj.lora_B.weight"), (Shape{4096, 16}));
  EXPECT_EQ(shape_of("mlp.up_proj.lora_B.weight"), (Shape{2752, 16}));
  EXPECT_EQ(shape_of("mlp.down_proj.lora_A.weight"), (Shape{16, 2752}));
  EXPECT_EQ(shape_of("mlp.down_proj.lora_B.weight"), (Shape{4096, 16}));

  auto gpt2 = ModelFromPreset("gpt2");
  ASSERT_TRUE(gpt2.ok());
  ASSERT_TRUE(AddLoraAdapters(*gpt2, 8).ok());
  const ModelSpec gpt2_slice = internal::RankSlice(*gpt2, 2, 1, 0, &layers);
  for (const ParamSpec& p : gpt2_slice.units[1].params) {
    // Conv1D c_attn [768, 2304] is column-parallel: B [2304 / 2, 8].
    if (p.name == "attn.c_attn.lora_B.weight") {
      EXPECT_EQ(p.shape, (Shape{1152, 8}));
    }
    if (p.name == "attn.c_attn.lora_A.weight") {
      EXPECT_EQ(p.shape, (Shape{8, 768}));
    }
    // mlp.c_proj [3072, 768] is row-parallel: A [8, 3072 / 2].
    if (p.name == "mlp.c_proj.lora_A.weight") {
      EXPECT_EQ(p.shape, (Shape{8, 1536}));
    }
    if (p.name == "mlp.c_proj.lora_B.weight") {
      EXPECT_EQ(p.shape, (Shape{768, 8}));
    }
    EXPECT_EQ(p.trainable, p.name.find("lora_") != std::string::npos) << p.name;
  }
  // Adapters twice: refused (the names would repeat), the model unchanged.
  const int64_t before = gpt2->spec.NumParams();
  const absl::Status again = AddLoraAdapters(*gpt2, 4);
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument) << again;
  EXPECT_EQ(gpt2->spec.NumParams(), before);
  EXPECT_EQ(gpt2->name, "gpt2 + LoRA r8");
}

}  // namespace
}  // namespace zeroshard
