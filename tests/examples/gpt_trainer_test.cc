// GptTrainer on the engine: every ZeRO stage at world sizes 1-4 against the
// one-rank run that accumulates the same micro-batches (bitwise at fp32,
// one micro-batch per rank), recompute against keeping the activations
// (bitwise), a checkpoint resumed mid-run (bitwise, at another world size
// too), the tie kept (the head's view is wte), the param groups, bf16 near
// fp32, and the validation loss against its definition.
#include "examples/gpt/gpt_trainer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/text_data.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/examples/gpt_test_text.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

using testing_text::RandomText;

GptConfig SmallConfig() {
  absl::StatusOr<GptConfig> cfg =
      ParseGptConfig(GptConfigJson(/*layers=*/2, /*heads=*/2, /*width=*/16, /*positions=*/12,
                                   /*vocab=*/256),
                     "small.json");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return *cfg;
}

struct RunSpec {
  int world = 1;
  int stage = 0;
  int accum = 1;
  bool recompute = false;
  Precision precision = Precision::kFp32;
  int64_t steps = 3;
  int64_t micro_batch = 2;
  int64_t seq = 8;
  std::string save_dir;  // save after `save_at` steps
  int64_t save_at = 0;
  std::string load_dir;     // resume from it
  int64_t val_windows = 8;  // validation windows (all ranks together)
};

struct RunOut {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // stored params, spec order
  double val_loss = 0.0;
  std::vector<float> head_view;  // the head's gathered view at the end (rank 0)
  int64_t act_bytes = 0, ws_bytes = 0;
};

TrainSpec MakeTrain(const RunSpec& r) {
  TrainSpec t;
  t.zero_stage = r.stage;
  t.precision = r.precision;
  t.optimizer.lr = 3e-3;
  t.optimizer.weight_decay = 0.1;
  t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
  t.schedule.warmup_steps = r.steps > 1 ? 1 : 0;
  t.schedule.total_steps = r.steps;
  t.schedule.min_lr_ratio = 0.1;
  t.max_grad_norm = 1.0;
  t.grad_accum_steps = r.accum;
  return t;
}

RunOut RunGpt(const GptConfig& cfg, const std::vector<uint8_t>& text, const RunSpec& r,
              uint64_t seed) {
  RunOut out;
  const std::vector<uint8_t> val(text.begin(), text.begin() + 200);
  absl::Status status = RunLocalRanks(r.world, [&](int rank, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(BuildGptModelSpec(cfg), MakeTrain(r), *device, comm));
    ZS_ASSIGN_OR_RETURN(WindowSampler sampler, WindowSampler::Create(&text, r.seq, seed));
    GptRunOptions ro;
    ro.micro_batch = r.micro_batch;
    ro.seq = r.seq;
    ro.recompute = r.recompute;
    // The engine's own workspace, before the trainer adds its arrays.
    const int64_t engine_ws = device->ledger().current(MemoryCategory::kWorkspace);
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<GptTrainer> trainer,
                        GptTrainer::Create(cfg, ro, *engine, comm, *device, &sampler));
    if (!r.load_dir.empty()) {
      ZS_ASSIGN_OR_RETURN(CheckpointInfo info, engine->Load(r.load_dir));
      const nlohmann::json state = nlohmann::json::parse(info.trainer_state);
      trainer->set_windows_consumed(state.at("windows_consumed").get<int64_t>());
    } else {
      ZS_RETURN_IF_ERROR(InitGptParams(*engine, cfg, seed));
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    while (engine->steps() < r.steps) {
      ZS_ASSIGN_OR_RETURN(const double loss, trainer->TrainStep());
      if (rank == 0) out.losses.push_back(loss);
      if (!r.save_dir.empty() && engine->steps() == r.save_at) {
        ZS_RETURN_IF_ERROR(engine->Save(r.save_dir, absl::StrFormat("{\"windows_consumed\": %d}",
                                                                    trainer->windows_consumed())));
        ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
      }
    }
    ZS_ASSIGN_OR_RETURN(const double val_loss, trainer->ValLoss(val, r.val_windows));
    const ModelSpec& spec = engine->model();
    for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
      for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
        if (spec.units[u].params[p].tied_to.has_value()) continue;
        ZS_ASSIGN_OR_RETURN(std::vector<float> v, engine->GetParam(u, p));
        if (rank == 0) out.params.push_back(std::move(v));
      }
    }
    if (rank == 0) {
      out.val_loss = val_loss;
      out.act_bytes = device->ledger().peak(MemoryCategory::kActivations);
      out.ws_bytes = device->ledger().peak(MemoryCategory::kWorkspace) - engine_ws;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status << SeedTrace();
  return out;
}

void ExpectBitwise(const RunOut& a, const RunOut& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << what << " step " << i + 1 << SeedTrace();
  }
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (size_t p = 0; p < a.params.size(); ++p) {
    ASSERT_EQ(a.params[p].size(), b.params[p].size());
    size_t diff = 0;
    for (size_t i = 0; i < a.params[p].size(); ++i) diff += a.params[p][i] != b.params[p][i];
    EXPECT_EQ(diff, 0u) << what << ": param " << p << " differs in " << diff << " elements"
                        << SeedTrace();
  }
}

TEST(GptTrainerTest, EveryStageAndWorldSizeEqualsTheOneRankRunBitwise) {
  const uint64_t seed = Seed();
  const GptConfig cfg = SmallConfig();
  const std::vector<uint8_t> text = RandomText(seed, 4000);
  for (int world = 1; world <= 4; ++world) {
    RunSpec base;
    base.accum = world;
    const RunOut baseline = RunGpt(cfg, text, base, seed);
    ASSERT_EQ(baseline.losses.size(), 3u);
    // The model learns at all (the loss moves) and starts near log(256).
    EXPECT_NEAR(baseline.losses[0], std::log(256.0), 0.5) << SeedTrace();
    for (int stage = 0; stage <= 3; ++stage) {
      RunSpec r;
      r.world = world;
      r.stage = stage;
      ExpectBitwise(RunGpt(cfg, text, r, seed), baseline,
                    absl::StrFormat("world %d stage %d", world, stage));
    }
  }
}

TEST(GptTrainerTest, RecomputeIsBitwiseTheRunThatKeepsActivations) {
  const uint64_t seed = Seed();
  const GptConfig cfg = SmallConfig();
  const std::vector<uint8_t> text = RandomText(seed, 4000);
  for (int stage : {1, 3}) {
    RunSpec keep;
    keep.world = 2;
    keep.stage = stage;
    RunSpec recompute = keep;
    recompute.recompute = true;
    const RunOut a = RunGpt(cfg, text, keep, seed);
    const RunOut b = RunGpt(cfg, text, recompute, seed);
    ExpectBitwise(b, a, absl::StrFormat("recompute, stage %d", stage));
    // Recompute keeps one block's activations instead of L.
    const internal::GptDims d = Dims(cfg, keep.micro_batch, keep.seq);
    EXPECT_EQ(a.act_bytes - b.act_bytes,
              (cfg.layers - 1) * internal::BlockActsFloats(d) * int64_t{sizeof(float)});
  }
}

TEST(GptTrainerTest, ActivationsAreTheDocumentedArraysInTheLedger) {
  const uint64_t seed = Seed();
  const GptConfig cfg = SmallConfig();
  const std::vector<uint8_t> text = RandomText(seed, 4000);
  RunSpec r;
  r.steps = 1;
  const RunOut out = RunGpt(cfg, text, r, seed);
  const internal::GptDims d = Dims(cfg, r.micro_batch, r.seq);
  const int64_t n = d.rows(), c = d.width, l = cfg.layers;
  // Hand count of gpt_trainer.h's list.
  const int64_t floats =
      (l + 1) * n * c + l * internal::BlockActsFloats(d) + (n * c + 2 * n) + n * d.vocab;
  EXPECT_EQ(out.act_bytes, floats * 4 + 2 * n * 4);
  // The largest unit: a block (12 C^2 + 13 C) or the embedding ((V + P) C).
  const int64_t largest_unit = std::max(12 * c * c + 13 * c, (d.vocab + cfg.positions) * c);
  EXPECT_EQ(out.ws_bytes, (2 * n * c + internal::BlockScratchFloats(d) + largest_unit) * 4);
}

TEST(GptTrainerTest, AResumedRunContinuesBitwiseAtTheSameAndAtAnotherWorldSize) {
  const uint64_t seed = Seed();
  const GptConfig cfg = SmallConfig();
  const std::vector<uint8_t> text = RandomText(seed, 4000);
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrFormat("gpt_resume_%d", getpid()))
          .string();
  std::filesystem::remove_all(dir);
  RunSpec whole;
  whole.world = 2;
  whole.stage = 2;
  whole.steps = 4;
  const RunOut uninterrupted = RunGpt(cfg, text, whole, seed);
  RunSpec first = whole;
  first.save_dir = dir;
  first.save_at = 2;
  RunGpt(cfg, text, first, seed);
  // Same world size and stage.
  RunSpec second = whole;
  second.load_dir = dir;
  RunOut resumed = RunGpt(cfg, text, second, seed);
  ASSERT_EQ(resumed.losses.size(), 2u);
  resumed.losses.insert(resumed.losses.begin(), uninterrupted.losses.begin(),
                        uninterrupted.losses.begin() + 2);
  ExpectBitwise(resumed, uninterrupted, "resumed on 2 ranks, stage 2");
  // One rank accumulating both ranks' micro-batches, stage 0: the same
  // windows (the sampler position is in windows) and the same sums.
  RunSpec one = whole;
  one.world = 1;
  one.accum = 2;
  one.stage = 0;
  one.load_dir = dir;
  RunOut moved = RunGpt(cfg, text, one, seed);
  moved.losses.insert(moved.losses.begin(), uninterrupted.losses.begin(),
                      uninterrupted.losses.begin() + 2);
  ExpectBitwise(moved, uninterrupted, "resumed on 1 rank accumulating 2, stage 0");
  std::filesystem::remove_all(dir);
}

TEST(GptTrainerTest, Bf16TracksFp32) {
  const uint64_t seed = Seed();
  const GptConfig cfg = SmallConfig();
  const std::vector<uint8_t> text = RandomText(seed, 4000);
  RunSpec fp32;
  fp32.world = 2;
  fp32.stage = 3;
  fp32.steps = 4;
  RunSpec bf16 = fp32;
  bf16.precision = Precision::kBf16Mixed;
  const RunOut a = RunGpt(cfg, text, fp32, seed);
  const RunOut b = RunGpt(cfg, text, bf16, seed);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    // bf16 weights carry 8 bits of mantissa: the loss moves by ~1e-3 relative.
    EXPECT_NEAR(b.losses[i], a.losses[i], 0.01 * a.losses[i]) << "step " << i + 1 << SeedTrace();
    EXPECT_NE(b.losses[i], a.losses[i]) << "bf16 should round somewhere" << SeedTrace();
  }
}

TEST(GptTrainerTest, ValidationSplitsTheWindowsAcrossRanks) {
  const uint64_t seed = Seed();
  const GptConfig cfg = SmallConfig();
  const std::vector<uint8_t> text = RandomText(seed, 4000);
  // One step trains the same model on every world size (bitwise, above), so
  // the validation losses over the same 8 windows differ only in the order
  // of the final sums: a rank reading another's windows would move them.
  for (int world : {2, 4}) {
    RunSpec one;
    one.steps = 1;
    one.accum = world;
    const RunOut a = RunGpt(cfg, text, one, seed);
    RunSpec r = one;
    r.world = world;
    r.accum = 1;
    const RunOut b = RunGpt(cfg, text, r, seed);
    EXPECT_NEAR(b.val_loss, a.val_loss, 1e-12 * a.val_loss) << "world " << world << SeedTrace();
    EXPECT_GT(a.val_loss, 1.0);
  }
}

TEST(GptTrainerTest, WeightDecayOnTheFourMatmulWeightsOfEachBlockOnly) {
  const GptConfig cfg = SmallConfig();
  const ModelSpec spec = BuildGptModelSpec(cfg);
  int decayed = 0;
  for (const UnitSpec& u : spec.units) {
    for (const ParamSpec& p : u.params) {
      const bool matmul = p.shape.size() == 2 && u.name.rfind("h.", 0) == 0;
      EXPECT_EQ(!p.no_decay, matmul) << u.name << " " << p.name;
      decayed += !p.no_decay;
    }
  }
  EXPECT_EQ(decayed, 4 * cfg.layers);
  ASSERT_TRUE(spec.units.back().params[0].tied_to.has_value());
  EXPECT_EQ(spec.units.back().params[0].tied_to->unit, "embed");
  EXPECT_EQ(spec.units.back().params[0].tied_to->param, "wte.weight");
}

}  // namespace
}  // namespace gpt
}  // namespace zeroshard
