// `zeroshard estimate --lora R` and `--freeze PATTERN`, run as a user runs
// them: the trainable and frozen counts and the model-state bytes per GPU at
// ZeRO stages 0-3 against counts written here by hand from the published
// architectures (never from the planner's own functions).
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/command_runner.h"
#include "tests/test_seed.h"

namespace {

using zeroshard::testing::Seed;
using zeroshard::testing::SeedTrace;

using Result = zeroshard::testing::CommandResult;

Result RunCli(const std::string& args) {
  return zeroshard::testing::RunCommand(std::string(ZS_BINARY) + " " + args);
}

// Llama-2-7B (config.json of meta-llama/Llama-2-7b-hf): hidden 4096, 32
// layers, 32 heads (no grouped k/v), intermediate 11008, vocabulary 32000,
// untied LM head, RMSNorm without bias, no linear biases.
constexpr int64_t kH = 4096, kLayers = 32, kF = 11008, kV = 32000;
// Per layer: q, k, v, o [h, h]; gate, up [f, h]; down [h, f]; two norms.
constexpr int64_t kAttention = 4 * kH * kH;
constexpr int64_t kMlp = 3 * kH * kF;
constexpr int64_t kNorms = 2 * kH;
constexpr int64_t kBase = kV * kH + kLayers * (kAttention + kMlp + kNorms) + kH + kV * kH;

// Model-state bytes of one GPU under bf16 mixed precision (the estimator's
// default): 2-byte params for every param, and for the trainable ones only
// a 2-byte gradient, a 4-byte fp32 master and two 4-byte Adam moments.
// Stage 1 shards the optimizer state (master and moments), stage 2 also the
// gradient, stage 3 also the params, each over the N data-parallel GPUs.
// The sizes here are multiples of 1024 elements per unit, so the layout's
// padding (a shard is a multiple of 128 elements) adds nothing at N <= 8.
struct States {
  int64_t params, grads, master, optimizer;
};
States HandStates(int64_t all, int64_t trainable, int stage, int64_t n) {
  return {stage >= 3 ? 2 * all / n : 2 * all, stage >= 2 ? 2 * trainable / n : 2 * trainable,
          stage >= 1 ? 4 * trainable / n : 4 * trainable,
          stage >= 1 ? 8 * trainable / n : 8 * trainable};
}

// Runs `model_args` at `stage` on `gpus` GPUs, alone (no offload, no split),
// and checks the counts and the model-state bytes of the one candidate.
void ExpectPlan(const std::string& model_args, int stage, int gpus, int64_t all,
                int64_t trainable) {
  SCOPED_TRACE(absl::StrCat(model_args, " --stage ", stage, " --gpus ", gpus, "; ", SeedTrace()));
  const Result r =
      RunCli(absl::StrCat("estimate ", model_args, " --gpus ", gpus, " --stage ", stage,
                          " --offload none --tp 1 --pp 1 --gpu-mem 1TiB --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << r.out.substr(0, 400);
  EXPECT_EQ(doc["params"].get<int64_t>(), all);
  EXPECT_EQ(doc["trainable_params"].get<int64_t>(), trainable);
  EXPECT_EQ(doc["frozen_params"].get<int64_t>(), all - trainable);
  ASSERT_EQ(doc["candidates"].size(), 1u);
  const nlohmann::json& bytes = doc["candidates"][0]["per_gpu_bytes"];
  const States hand = HandStates(all, trainable, stage, gpus);
  EXPECT_EQ(bytes["params"].get<int64_t>(), hand.params);
  EXPECT_EQ(bytes["grads"].get<int64_t>(), hand.grads);
  EXPECT_EQ(bytes["master"].get<int64_t>(), hand.master);
  EXPECT_EQ(bytes["optimizer"].get<int64_t>(), hand.optimizer);
}

// The gradient staging slots (2 by default; every micro-batch at stage 2)
// hold the trainable params of the largest unit: a frozen param has no
// gradient to stage.
void ExpectStagingOf(const std::string& model_args, int64_t largest_trainable_unit) {
  SCOPED_TRACE(model_args);
  const Result r = RunCli(absl::StrCat("estimate ", model_args,
                                       " --gpus 8 --stage 2 --offload none --tp 1 --pp 1 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  int64_t staging = -1;
  for (const nlohmann::json& b : doc["candidates"][0]["buffers"]) {
    if (b["name"] == "grad_staging") staging = b["numel"].get<int64_t>();
  }
  EXPECT_EQ(staging, 2 * largest_trainable_unit);
}

TEST(EstimateFineTuningCliTest, LoraOnLlama2_7bMatchesAHandCount) {
  ASSERT_EQ(kBase, 6738415616);  // the published count
  std::mt19937_64 rng(Seed());
  // Rank 16 (the acceptance case), then a fresh rank: a multiple of 4 keeps
  // every unit a multiple of 1024 elements.
  const int64_t ranks[] = {16, 4 * std::uniform_int_distribution<int64_t>(1, 16)(rng)};
  const int gpu_counts[] = {1, 2, 4, 8};
  for (int64_t r : ranks) {
    // A [r, in] and B [out, r] on q, k, v, o (in = out = h) and on gate, up
    // (in h, out f) and down (in f, out h).
    const int64_t adapters_per_layer = 4 * r * (kH + kH) + 3 * r * (kH + kF);
    const int64_t trainable = kLayers * adapters_per_layer;
    if (r == 16) {
      ASSERT_EQ(trainable, 39976960);
    }
    const int gpus = gpu_counts[std::uniform_int_distribution<int>(0, 3)(rng)];
    for (int stage = 0; stage <= 3; ++stage) {
      ExpectPlan(absl::StrCat("--preset llama-2-7b --lora ", r), stage, gpus, kBase + trainable,
                 trainable);
      ExpectPlan(absl::StrCat("--preset llama-2-7b --lora ", r), stage, 8, kBase + trainable,
                 trainable);
    }
    ExpectStagingOf(absl::StrCat("--preset llama-2-7b --lora ", r), adapters_per_layer);
  }
}

TEST(EstimateFineTuningCliTest, FreezePatternsMatchAHandCount) {
  std::mt19937_64 rng(Seed());
  // Freeze the embedding, every MLP and one whole layer among 1-3: the
  // pattern "layers.1" must not also freeze layers 10-19.
  const int layer = std::uniform_int_distribution<int>(1, 3)(rng);
  const bool head = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
  std::string args = absl::StrCat("--preset llama-2-7b --freeze embed --freeze 'layers.*.mlp.*' ",
                                  "--freeze=layers.", layer);
  // What stays trainable: attention and norms of the other 31 layers, the
  // final norm and (unless frozen) the LM head.
  int64_t trainable = (kLayers - 1) * (kAttention + kNorms) + kH;
  if (head) {
    absl::StrAppend(&args, " --freeze lm_head");
  } else {
    trainable += kV * kH;
  }
  for (int stage = 0; stage <= 3; ++stage) ExpectPlan(args, stage, 8, kBase, trainable);
  // The largest trainable unit: the LM head, else a layer's attention.
  ExpectStagingOf(args, head ? kAttention + kNorms : kV * kH);

  // The table says it too.
  const Result table = RunCli(absl::StrCat("estimate ", args, " --gpus 8"));
  EXPECT_TRUE(absl::StrContains(table.out, "trainable ")) << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, ", frozen ")) << table.out;
}

TEST(EstimateFineTuningCliTest, LoraOnGpt2UsesItsConv1DShapes) {
  // GPT-2 small: hidden 768, 12 layers, MLP 3072; c_attn [768, 2304],
  // attn.c_proj [768, 768], c_fc [768, 3072], mlp.c_proj [3072, 768] (Conv1D
  // stores [in, out]); adapters A [r, in], B [out, r].
  const int64_t r = 8;
  const int64_t per_layer = r * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768));
  const Result res = RunCli("estimate --preset gpt2 --lora 8 --json");
  ASSERT_EQ(res.exit_code, 0) << res.err;
  const nlohmann::json doc = nlohmann::json::parse(res.out);
  EXPECT_EQ(doc["trainable_params"].get<int64_t>(), 12 * per_layer);
  EXPECT_EQ(doc["params"].get<int64_t>(), 124439808 + 12 * per_layer);
}

// --freeze on a JSON spec (--spec): the same counting as for a transformer.
TEST(EstimateFineTuningCliTest, FreezeWorksOnAJsonSpec) {
  std::mt19937_64 rng(Seed());
  // Units of whole 1024-element multiples: no padding at up to 8 GPUs.
  const int64_t rows_in = 16 * std::uniform_int_distribution<int64_t>(1, 64)(rng);
  const int64_t rows_block = 16 * std::uniform_int_distribution<int64_t>(1, 64)(rng);
  const int64_t rows_out = 16 * std::uniform_int_distribution<int64_t>(1, 64)(rng);
  const std::string spec = absl::StrCat(
      R"({"name": "three", "units": [)", R"({"name": "in", "params": [{"name": "w", "shape": [)",
      rows_in, R"(, 64]}]},)", R"({"name": "block.0", "params": [{"name": "w", "shape": [)",
      rows_block, R"(, 64]}, {"name": "b", "shape": [1024]}]},)",
      R"({"name": "out", "params": [{"name": "w", "shape": [)", rows_out, R"(, 64]}]}]})");
  const char* dir = std::getenv("TMPDIR");
  const std::string path =
      std::string(dir != nullptr ? dir : "/tmp") + "/zs_estimate_fine_tuning_spec.json";
  std::ofstream(path) << spec;
  const int64_t all = 64 * (rows_in + rows_block + rows_out) + 1024;
  const int64_t trainable = 64 * rows_out + 1024;  // block.0's bias stays trainable
  for (int stage = 0; stage <= 3; ++stage) {
    ExpectPlan(absl::StrCat("--spec ", path, " --freeze in --freeze block.0.w"), stage, 4, all,
               trainable);
  }
  std::remove(path.c_str());
}

void ExpectRefused(const std::string& args, const std::string& needle) {
  SCOPED_TRACE(args);
  const Result r = RunCli(args);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(absl::StrContains(r.err, needle)) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(EstimateFineTuningCliTest, BadFineTuningInputIsOneErrorLine) {
  ExpectRefused("estimate --preset llama-2-7b --freeze 'layers.*.mlpx'",
                "--freeze: freeze pattern 'layers.*.mlpx' matches no param");
  // The first patterns match; the bad one is named.
  ExpectRefused("estimate --preset llama-2-7b --freeze embed --freeze layers.32",
                "pattern 'layers.32' matches no param");
  ExpectRefused("estimate --preset llama-2-7b --freeze", "--freeze needs a value");
  ExpectRefused("estimate --preset llama-2-7b --lora 0", "--lora");
  ExpectRefused("estimate --preset llama-2-7b --lora 4097",
                "exceeds the smaller side (4096) of layers.0.self_attn.q_proj.weight");
  ExpectRefused("estimate --params 7B --lora 8", "LoRA adapters need a transformer");
  ExpectRefused("estimate --preset llama-2-7b --lora 8 --lora 16", "--lora is given twice");
}

}  // namespace
