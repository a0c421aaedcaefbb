// MlpTrainer's variants on the real engine: --recompute (the same bits as
// keeping the activations), the tied-embedding language model (--vocab) and
// LoRA (--lora: frozen base, trained adapters), each at ZeRO stages 0-3 on
// 1-4 ranks against the one-rank baseline that accumulates the same
// micro-batches (invariant 2 of docs/architecture.md), as mlp_trainer_test
// does for the regression model.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

struct Outcome {
  std::vector<double> losses;
  std::vector<std::string> names;          // "unit.param" of each entry of params
  std::vector<std::vector<float>> params;  // every param but tied aliases, ModelSpec order
  std::vector<bool> trainable;
  std::vector<std::vector<float>> initial;  // InitialParam of each entry
  int64_t activation_bytes = 0;
};

MlpConfig Small() {
  MlpConfig cfg;
  cfg.hidden = 16;
  cfg.blocks = 3;
  cfg.micro_batch = 4;
  return cfg;
}

absl::StatusOr<Outcome> Train(const MlpConfig& cfg, int world, int stage, int accum, int steps) {
  Outcome out;
  TrainSpec train;
  train.zero_stage = stage;
  train.grad_accum_steps = accum;
  train.optimizer.lr = 1e-2;
  train.optimizer.weight_decay = 0.01;
  train.max_grad_norm = 1.0;
  absl::Status status = RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, CreateMlpEngine(cfg, train, *device, comm));
    MlpTrainer trainer(cfg, *engine, comm);
    ZS_RETURN_IF_ERROR(engine->Start(TrainerSettings(cfg)));
    for (int s = 0; s < steps; ++s) {
      ZS_ASSIGN_OR_RETURN(const double loss, trainer.TrainStep());
      if (rank == 0) out.losses.push_back(loss);
    }
    if (rank == 0) out.activation_bytes = trainer.activation_bytes();
    const ModelSpec& spec = engine->model();
    for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
      for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
        const ParamSpec& param = spec.units[u].params[p];
        if (param.tied_to.has_value()) continue;
        ZS_ASSIGN_OR_RETURN(std::vector<float> values, engine->GetParam(u, p));
        if (rank != 0) continue;
        out.names.push_back(spec.units[u].name + "." + param.name);
        out.params.push_back(std::move(values));
        out.trainable.push_back(param.trainable);
        out.initial.push_back(InitialParam(cfg, u, p));
      }
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameWeights(const Outcome& run, const Outcome& baseline, const std::string& what) {
  ASSERT_EQ(run.params.size(), baseline.params.size()) << what;
  for (size_t t = 0; t < run.params.size(); ++t) {
    EXPECT_TRUE(SameBits(run.params[t], baseline.params[t])) << what << ": " << run.names[t];
  }
  EXPECT_EQ(run.losses, baseline.losses) << what;
}

// Every stage on 1-4 ranks, one micro-batch per rank, fp32: the bits of the
// one-rank run that accumulates the same micro-batches.
void ExpectEveryStageMatchesBaseline(const MlpConfig& cfg, int steps) {
  for (int world = 1; world <= 4; ++world) {
    absl::StatusOr<Outcome> baseline = Train(cfg, 1, 0, world, steps);
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    for (int stage = 0; stage <= 3; ++stage) {
      absl::StatusOr<Outcome> run = Train(cfg, world, stage, 1, steps);
      ASSERT_TRUE(run.ok()) << "world " << world << " stage " << stage << ": " << run.status();
      ExpectSameWeights(*run, *baseline,
                        "world " + std::to_string(world) + " stage " + std::to_string(stage));
    }
  }
}

// Recompute: the backward recomputes each block's forward from its saved
// input; every op sees the same inputs in the same order, so the gradients,
// and so the weights, are the same bits, at stage 3 (gathers twice per
// block's backward) too; and the trainer keeps fewer activation bytes.
TEST(MlpVariants, RecomputeIsBitwiseTheSameTraining) {
  for (int stage : {0, 3}) {
    MlpConfig cfg = Small();
    absl::StatusOr<Outcome> keep = Train(cfg, 2, stage, 2, 4);
    cfg.recompute = true;
    absl::StatusOr<Outcome> recompute = Train(cfg, 2, stage, 2, 4);
    ASSERT_TRUE(keep.ok()) << keep.status();
    ASSERT_TRUE(recompute.ok()) << recompute.status();
    ExpectSameWeights(*recompute, *keep, "recompute, stage " + std::to_string(stage));
    EXPECT_LT(recompute->activation_bytes, keep->activation_bytes);
    // Not a run that did nothing.
    EXPECT_FALSE(SameBits(keep->params[0], keep->initial[0]));
  }
}

MlpConfig SmallLm() {
  MlpConfig cfg = Small();
  cfg.vocab = 24;
  return cfg;
}

MlpConfig SmallLora() {
  MlpConfig cfg = Small();
  cfg.lora_rank = 2;
  cfg.lora_alpha = 4.0;
  cfg.adapter_lr_scale = 2.0;
  cfg.adapter_weight_decay = 0.05;
  return cfg;
}

TEST(MlpVariants, LanguageModelLossFalls) {
  MlpConfig cfg = SmallLm();
  absl::StatusOr<Outcome> run = Train(cfg, 2, 2, 1, 60);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_LT(run->losses.back(), 0.5 * run->losses.front());
}

TEST(MlpVariants, TiedLanguageModelEveryStageMatchesBaselineBitwise) {
  ExpectEveryStageMatchesBaseline(SmallLm(), 3);
}

TEST(MlpVariants, TiedLanguageModelWithRecomputeAtStage3MatchesStage0) {
  MlpConfig cfg = SmallLm();
  absl::StatusOr<Outcome> stage0 = Train(cfg, 2, 0, 1, 3);
  cfg.recompute = true;
  absl::StatusOr<Outcome> stage3 = Train(cfg, 2, 3, 1, 3);
  ASSERT_TRUE(stage0.ok()) << stage0.status();
  ASSERT_TRUE(stage3.ok()) << stage3.status();
  ExpectSameWeights(*stage3, *stage0, "stage 3 + recompute vs stage 0");
}

// After N steps the frozen params are their initial bits, the adapters have
// moved, and (next test) equal the one-rank baseline's.
void ExpectFrozenKeptAdaptersTrained(const Outcome& run) {
  int adapters = 0;
  for (size_t t = 0; t < run.params.size(); ++t) {
    if (!run.trainable[t]) {
      EXPECT_TRUE(SameBits(run.params[t], run.initial[t])) << run.names[t] << " moved";
    } else {
      ++adapters;
      EXPECT_FALSE(SameBits(run.params[t], run.initial[t])) << run.names[t] << " did not train";
    }
  }
  EXPECT_GT(adapters, 0);
}

TEST(MlpVariants, LoraKeepsFrozenParamsAndTrainsAdapters) {
  for (const MlpConfig& base : {SmallLora(), SmallLm()}) {
    MlpConfig cfg = base;
    cfg.lora_rank = 2;  // for the LM: embedding and head frozen too (all-frozen units)
    for (int stage = 0; stage <= 3; ++stage) {
      absl::StatusOr<Outcome> run = Train(cfg, 2, stage, 1, 4);
      ASSERT_TRUE(run.ok()) << "stage " << stage << ": " << run.status();
      ExpectFrozenKeptAdaptersTrained(*run);
    }
  }
}

TEST(MlpVariants, LoraEveryStageMatchesBaselineBitwise) {
  ExpectEveryStageMatchesBaseline(SmallLora(), 3);
  MlpConfig lm = SmallLm();
  lm.lora_rank = 2;
  ExpectEveryStageMatchesBaseline(lm, 2);
}

TEST(MlpVariants, LoraLossFalls) {
  MlpConfig cfg = SmallLora();
  absl::StatusOr<Outcome> run = Train(cfg, 2, 2, 1, 60);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_LT(run->losses.back(), 0.8 * run->losses.front());
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard
