// GridGptTrainer on the grids of issue 23 against the one-rank GptTrainer run
// of the same global batch (and, with tp 1, against the data-parallel run
// that accumulates the same micro-batches per dp rank), local backend, with
// the tie across pipeline stages checked after every step.
//
// Bitwise (tp 1). A pipeline changes no arithmetic: each stage's engine
// accumulates its units' gradients over the same micro-batches in the same
// order, the dp reductions add the same values in rank order, the head's
// gradient reaches the first stage's engine through its tied alias in the
// one-rank call order (head, then embedding), and the norm is exact. So a
// pp run is bitwise the GptTrainer run on dp ranks accumulating pp
// micro-batches each, at the same ZeRO stage, and with dp 1 bitwise the
// one-rank run.
//
// Tolerance (tp > 1). Tensor parallelism changes summation orders only:
// each row-parallel product (attention and MLP output projections) and each
// LayerNorm-output gradient is a sum of tp partial dot products added in
// rank order instead of one dot product, and the head's input gradient sums
// V'/tp-term partial products over the ranks. Each such sum is within
// gamma_n sum|terms| of the exact value in either order (Higham 3.1), so
// one forward's loss moves by at most about 2 (L gamma_{4C} + gamma_{V'})
// relative (4C terms in the longest block sum, V' in the head's), and, as
// the MLP grid test argues, Adam carries a relative gradient difference e
// into a relative update difference of about e per step, accumulated
// linearly: bound = steps x 2 (L gamma_{4C} + gamma_{V'}), on the largest
// relative loss difference and on the weights' relative L2 distance (L2:
// an element whose gradient is near zero can take an lr-sized Adam step of
// the other sign, which no rounding bound covers). The vocab-parallel
// cross-entropy sums its exponentials per rank then over ranks in double
// (a 1e-16 relative change, far below). Against the one-rank run the dp
// ranks' accumulation order changes the sums too (the same gamma bound
// per gradient sum, dp x M terms): covered by the same steps factor.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/segment_reader.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_trainer.h"
#include "examples/gpt/grid_trainer.h"
#include "examples/gpt/internal/vocab_parallel.h"
#include "examples/gpt/text_data.h"
#include "gtest/gtest.h"
#include "tests/examples/gpt_test_text.h"
#include "tests/grid_test_util.h"
#include "tests/test_env.h"
#include "tests/test_seed.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/process_grid.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

constexpr int kSteps = 4;
// Validation windows: a multiple of every world size x micro-batch here (8
// ranks x 2), so that every run counts the same windows.
constexpr int64_t kValWindows = 16;

using testing_text::RandomText;

// The validation split: the text's first 200 bytes (24 windows of 8 + 1).
std::vector<uint8_t> ValText(const std::vector<uint8_t>& text) {
  return std::vector<uint8_t>(text.begin(), text.begin() + 200);
}

// 4 blocks (7 units: pp 4 fits), 4 heads (tp 4 divides them), a vocabulary
// of 259 (byte tokens and 3 more), which tp 2 and 4 pad to 260.
GptConfig GridConfig() {
  absl::StatusOr<GptConfig> cfg = ParseGptConfig(
      GptConfigJson(/*layers=*/4, /*heads=*/4, /*width=*/16, /*positions=*/8, /*vocab=*/259),
      "grid.json");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return *cfg;
}

GptRunOptions RunOptions() {
  GptRunOptions ro;
  ro.micro_batch = 2;
  ro.seq = 8;
  return ro;
}

TrainSpec MakeTrain(int stage, int accum, Precision precision = Precision::kFp32) {
  TrainSpec t;
  t.zero_stage = stage;
  t.precision = precision;
  t.optimizer.lr = 3e-3;
  t.optimizer.weight_decay = 0.1;
  t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
  t.schedule.warmup_steps = 1;
  t.schedule.total_steps = kSteps;
  t.schedule.min_lr_ratio = 0.1;
  t.max_grad_norm = 1.0;
  t.grad_accum_steps = accum;
  return t;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // stored params, BuildGptModelSpec order
  int tie_checks = 0;                      // steps after which TieHolds was true
  double val_loss = 0.0;                   // ValLoss over kValWindows at the end
};

// Checkpoints of a run: save after step `save_at` into `save_dir`, or
// start from `load_dir` (and run the steps after its step).
struct Checkpointing {
  std::string save_dir;
  int save_at = 0;
  std::string load_dir;
  std::string resave_dir;  // grid: saved again right after the load
};

std::string WindowsState(int64_t consumed) {
  return absl::StrFormat("{\"windows_consumed\": %d}", consumed);
}

absl::StatusOr<int64_t> WindowsFrom(const CheckpointInfo& info) {
  const size_t at = info.trainer_state.find(':');
  if (at == std::string::npos) return absl::DataLossError("no windows_consumed");
  return std::stoll(info.trainer_state.substr(at + 1));
}

// GptTrainer on `world` ranks accumulating `accum` micro-batches each.
absl::StatusOr<Outcome> TrainDp(const GptConfig& cfg, const std::vector<uint8_t>& text, int world,
                                int stage, int accum, uint64_t seed, const Checkpointing& ckpt = {},
                                Precision precision = Precision::kFp32) {
  Outcome out;
  ZS_RETURN_IF_ERROR(RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(
        std::unique_ptr<Engine> engine,
        Engine::Create(BuildGptModelSpec(cfg), MakeTrain(stage, accum, precision), *device, comm));
    ZS_ASSIGN_OR_RETURN(WindowSampler sampler,
                        WindowSampler::Create(&text, RunOptions().seq, seed));
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<GptTrainer> trainer,
                        GptTrainer::Create(cfg, RunOptions(), *engine, comm, *device, &sampler));
    if (ckpt.load_dir.empty()) {
      ZS_RETURN_IF_ERROR(InitGptParams(*engine, cfg, seed));
    } else {
      ZS_ASSIGN_OR_RETURN(const CheckpointInfo info, engine->Load(ckpt.load_dir));
      ZS_ASSIGN_OR_RETURN(const int64_t consumed, WindowsFrom(info));
      trainer->set_windows_consumed(consumed);
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    while (engine->steps() < kSteps) {
      ZS_ASSIGN_OR_RETURN(const double loss, trainer->TrainStep());
      if (rank == 0) out.losses.push_back(loss);
      if (!ckpt.save_dir.empty() && engine->steps() == ckpt.save_at) {
        ZS_RETURN_IF_ERROR(engine->Save(ckpt.save_dir, WindowsState(trainer->windows_consumed())));
        ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
      }
    }
    ZS_ASSIGN_OR_RETURN(const double val_loss, trainer->ValLoss(ValText(text), kValWindows));
    if (rank == 0) out.val_loss = val_loss;
    const ModelSpec& spec = engine->model();
    for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
      for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
        if (spec.units[u].params[p].tied_to.has_value()) continue;
        ZS_ASSIGN_OR_RETURN(std::vector<float> v, engine->GetParam(u, p));
        if (rank == 0) out.params.push_back(std::move(v));
      }
    }
    return absl::OkStatus();
  }));
  return out;
}

// GridGptTrainer on `shape`, one micro-batch per rank of the global batch.
absl::StatusOr<Outcome> TrainGrid(const GptConfig& cfg, const std::vector<uint8_t>& text,
                                  const GridShape& shape, int stage, uint64_t seed,
                                  const Checkpointing& ckpt = {},
                                  Precision precision = Precision::kFp32) {
  Outcome out;
  std::vector<int> tie_checks(shape.world(), 0);
  ZS_RETURN_IF_ERROR(
      RunLocalRanks(shape.world(), [&](int rank, Communicator& world) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGrid> grid, ProcessGrid::Create(world, shape));
        std::unique_ptr<Device> device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(const ModelSpec shard,
                            BuildGptShardModelSpec(cfg, shape, grid->coord()));
        ZS_ASSIGN_OR_RETURN(
            std::unique_ptr<Engine> engine,
            Engine::Create(shard, MakeTrain(stage, shape.tp * shape.pp, precision), *device,
                           grid->dp(),
                           ModelParallelOptions{&grid->model_parallel(), grid->coord().tp == 0}));
        int64_t consumed = 0;
        if (ckpt.load_dir.empty()) {
          ZS_RETURN_IF_ERROR(InitGptShardParams(*engine, cfg, *grid, seed));
        } else {
          ZS_ASSIGN_OR_RETURN(
              const CheckpointInfo info,
              engine->LoadSlices(ckpt.load_dir, GptParamOrigins(shard, shape, grid->coord())));
          ZS_ASSIGN_OR_RETURN(consumed, WindowsFrom(info));
        }
        ZS_RETURN_IF_ERROR(engine->Start());
        ZS_ASSIGN_OR_RETURN(WindowSampler sampler,
                            WindowSampler::Create(&text, RunOptions().seq, seed));
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<GridGptTrainer> trainer,
                            GridGptTrainer::Create(cfg, RunOptions(), *engine, *grid, &sampler));
        trainer->set_windows_consumed(consumed);
        CheckpointOptions now;
        now.background = false;
        if (!ckpt.resave_dir.empty()) {
          ZS_RETURN_IF_ERROR(trainer->Save(ckpt.resave_dir, WindowsState(consumed), now));
        }
        while (engine->steps() < kSteps) {
          ZS_ASSIGN_OR_RETURN(const double loss, trainer->TrainStep());
          if (rank == 0) out.losses.push_back(loss);
          // The head the last stage computes with is wte, bit for bit.
          ZS_ASSIGN_OR_RETURN(const bool tied, trainer->TieHolds());
          tie_checks[rank] += tied ? 1 : 0;
          if (!ckpt.save_dir.empty() && engine->steps() == ckpt.save_at) {
            ZS_RETURN_IF_ERROR(
                trainer->Save(ckpt.save_dir, WindowsState(trainer->windows_consumed()), now));
          }
        }
        ZS_ASSIGN_OR_RETURN(const double val_loss, trainer->ValLoss(ValText(text), kValWindows));
        if (rank == 0) out.val_loss = val_loss;
        ZS_ASSIGN_OR_RETURN(std::vector<std::vector<float>> params,
                            GatherGptGridParams(*engine, cfg, *grid));
        if (rank == 0) out.params = std::move(params);
        return absl::OkStatus();
      }));
  out.tie_checks = tie_checks[0];
  for (int c : tie_checks) out.tie_checks = std::min(out.tie_checks, c);
  return out;
}

std::string FirstDifference(const Outcome& a, const Outcome& b) {
  if (a.params.size() != b.params.size() || a.losses.size() != b.losses.size()) {
    return "different sizes";
  }
  for (size_t s = 0; s < a.losses.size(); ++s) {
    if (std::memcmp(&a.losses[s], &b.losses[s], 8) != 0) {
      return absl::StrFormat("loss of step %d: %.17g vs %.17g", s + 1, a.losses[s], b.losses[s]);
    }
  }
  for (size_t t = 0; t < a.params.size(); ++t) {
    if (a.params[t].size() != b.params[t].size()) return absl::StrFormat("param %d's size", t);
    for (size_t i = 0; i < a.params[t].size(); ++i) {
      if (std::memcmp(&a.params[t][i], &b.params[t][i], 4) != 0) {
        return absl::StrFormat("param %d element %d: %.9g vs %.9g", t, i, a.params[t][i],
                               b.params[t][i]);
      }
    }
  }
  return "";
}

using testing::Distance;

Distance Measure(const Outcome& run, const Outcome& ref) {
  return testing::MeasureDistance(run.losses, run.params, ref.losses, ref.params);
}

// The bound of the file comment: steps x 2 (L gamma_{4C} + gamma_{V'}).
double TensorParallelBound(const GptConfig& cfg, int tp) {
  const double u = 0x1p-24;
  auto gamma = [&](double n) { return n * u / (1 - n * u); };
  const double v = static_cast<double>(internal::PaddedVocab(cfg.vocab, tp));
  return kSteps * 2.0 * (cfg.layers * gamma(4.0 * cfg.width) + gamma(v));
}

struct GridCase {
  GridShape shape;
  int stage;
};

std::string Name(const GridCase& c) {
  return absl::StrFormat("%s, ZeRO stage %d", c.shape.ToString(), c.stage);
}

// The grids, each with ZeRO stages 1 and 3 over dp 2
// (ZS_TEST_LIGHT=1: tp 2 x pp 2 at stage 3 and pp 2 at stage 1 only).
std::vector<GridCase> Cases() {
  if (testing::LightMode()) return {{GridShape{2, 2, 2}, 3}, {GridShape{2, 1, 2}, 1}};
  std::vector<GridCase> cases;
  for (const GridShape& shape : {GridShape{2, 2, 1}, GridShape{2, 4, 1}, GridShape{2, 1, 2},
                                 GridShape{2, 1, 4}, GridShape{2, 2, 2}}) {
    for (int stage : {1, 3}) cases.push_back({shape, stage});
  }
  return cases;
}

TEST(GridGptTrainer, EveryGridTrainsTheOneRankModel) {
  const uint64_t seed = Seed();
  const GptConfig cfg = GridConfig();
  const std::vector<uint8_t> text = RandomText(seed, 6000);
  for (const GridCase& c : Cases()) {
    const int world = c.shape.world();
    absl::StatusOr<Outcome> baseline = TrainDp(cfg, text, 1, 0, world, seed);
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    absl::StatusOr<Outcome> run = TrainGrid(cfg, text, c.shape, c.stage, seed);
    ASSERT_TRUE(run.ok()) << Name(c) << ": " << run.status() << SeedTrace();
    ASSERT_EQ(run->params.size(), baseline->params.size()) << Name(c);
    // The loss starts near log(V) (an untrained model's), and the weights
    // moved: a grid that trained nothing would sit at the initial weights,
    // far outside the bound below.
    EXPECT_NEAR(run->losses.front(), std::log(259.0), 0.5) << Name(c) << SeedTrace();
    EXPECT_EQ(run->tie_checks, kSteps) << Name(c) << ": the head and wte differ" << SeedTrace();
    const Distance d = Measure(*run, *baseline);
    const double bound = TensorParallelBound(cfg, c.shape.tp);
    const std::string diff = FirstDifference(*run, *baseline);
    std::printf("%s: loss rel diff %.3g, weights rel L2 %.3g (bound %.3g), bitwise %s\n",
                Name(c).c_str(), d.loss_rel, d.weight_rel_l2, bound, diff.empty() ? "yes" : "no");
    EXPECT_LE(d.loss_rel, bound) << Name(c) << SeedTrace();
    EXPECT_LE(d.weight_rel_l2, bound) << Name(c) << SeedTrace();
    // The validation loss of the trained weights, forward only through the
    // pipeline: the one-rank run's within the same bound.
    EXPECT_LE(std::fabs(run->val_loss - baseline->val_loss) / baseline->val_loss, bound)
        << Name(c) << ": val loss " << run->val_loss << " vs " << baseline->val_loss << SeedTrace();
    if (c.shape.tp == 1) {
      // A pipeline is bitwise the dp-only run accumulating its micro-batches.
      absl::StatusOr<Outcome> dp = TrainDp(cfg, text, c.shape.dp, c.stage, c.shape.pp, seed);
      ASSERT_TRUE(dp.ok()) << dp.status();
      EXPECT_EQ(FirstDifference(*run, *dp), "") << Name(c) << SeedTrace();
    }
  }
}

// With one dp rank a pipeline is bitwise the one-rank run itself, at every
// ZeRO stage (the tie's two uses summed in the one-rank order).
TEST(GridGptTrainer, PipelineAloneIsBitwiseTheOneRankRun) {
  const uint64_t seed = Seed();
  const GptConfig cfg = GridConfig();
  const std::vector<uint8_t> text = RandomText(seed, 6000);
  for (int pp : {2, 4}) {
    absl::StatusOr<Outcome> baseline = TrainDp(cfg, text, 1, 0, pp, seed);
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    for (int stage : {0, 1, 2, 3}) {
      absl::StatusOr<Outcome> run = TrainGrid(cfg, text, GridShape{1, 1, pp}, stage, seed);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_EQ(run->tie_checks, kSteps) << "pp " << pp << SeedTrace();
      EXPECT_EQ(FirstDifference(*run, *baseline), "")
          << "pp " << pp << ", ZeRO stage " << stage << SeedTrace();
      // One dp rank: the validation loss sums the same micro-batch losses
      // in the same order.
      EXPECT_EQ(run->val_loss, baseline->val_loss) << "pp " << pp << SeedTrace();
    }
  }
}

// bf16 and fp16 views (fp32 math): a pipeline over dp 2 is still bitwise
// the dp-only run accumulating its micro-batches, loss scale and skipped
// steps included, and the head keeps wte's 16-bit bits (the replica is
// written from the first stage's fp32 master, rounded as the first stage's
// params are).
TEST(GridGptTrainer, SixteenBitPipelinesAreBitwiseTheDataParallelRun) {
  const uint64_t seed = Seed();
  const GptConfig cfg = GridConfig();
  const std::vector<uint8_t> text = RandomText(seed, 6000);
  for (Precision precision : {Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    absl::StatusOr<Outcome> dp = TrainDp(cfg, text, 2, 1, 2, seed, {}, precision);
    ASSERT_TRUE(dp.ok()) << dp.status();
    absl::StatusOr<Outcome> run = TrainGrid(cfg, text, GridShape{2, 1, 2}, 1, seed, {}, precision);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->tie_checks, kSteps) << PrecisionName(precision) << SeedTrace();
    EXPECT_EQ(FirstDifference(*run, *dp), "") << PrecisionName(precision) << SeedTrace();
  }
}

// A checkpoint of the whole model (a dp-only run of 4 ranks at ZeRO stage 1
// or 3, saved after step 2) resumed on every grid of the issue at stages 1
// and 3 with LoadSlices: on (4,1,1) at the saving stage it continues the
// uninterrupted run bit for bit; with tp 1 it is bitwise the dp-only run
// of dp ranks accumulating pp micro-batches that loads the same checkpoint
// (Load); with tp > 1 within the tensor-parallel bound of the uninterrupted
// run.
TEST(GridGptTrainer, AWholeModelCheckpointResumesOnEveryGrid) {
  const uint64_t seed = Seed();
  const GptConfig cfg = GridConfig();
  const std::vector<uint8_t> text = RandomText(seed, 6000);
  const std::string root = ::testing::TempDir() + "/gpt_grid_resume_" + std::to_string(seed);
  // ZS_TEST_LIGHT=1: the checkpoint of stage 3 only.
  for (int saved_stage : {1, 3}) {
    if (testing::LightMode() && saved_stage == 1) continue;
    const std::string dir = absl::StrFormat("%s_s%d", root, saved_stage);
    std::filesystem::remove_all(dir);
    absl::StatusOr<Outcome> whole =
        TrainDp(cfg, text, 4, saved_stage, 1, seed, Checkpointing{dir, 2, "", ""});
    ASSERT_TRUE(whole.ok()) << whole.status();
    Outcome expected = *whole;
    expected.losses.erase(expected.losses.begin(), expected.losses.begin() + 2);
    for (const GridShape& shape : {GridShape{4, 1, 1}, GridShape{2, 2, 1}, GridShape{2, 1, 2},
                                   GridShape{1, 2, 2}, GridShape{1, 4, 1}, GridShape{1, 1, 4}}) {
      for (int stage : {1, 3}) {
        const std::string name = absl::StrFormat("saved at stage %d, resumed on %s at stage %d",
                                                 saved_stage, shape.ToString(), stage);
        absl::StatusOr<Outcome> run =
            TrainGrid(cfg, text, shape, stage, seed, Checkpointing{"", 0, dir, ""});
        ASSERT_TRUE(run.ok()) << name << ": " << run.status() << SeedTrace();
        ASSERT_EQ(run->losses.size(), 2u) << name;
        EXPECT_EQ(run->tie_checks, 2) << name << SeedTrace();
        if (shape.tp == 1 && shape.pp == 1 && stage == saved_stage) {
          EXPECT_EQ(FirstDifference(*run, expected), "") << name << SeedTrace();
        }
        if (shape.tp == 1) {
          absl::StatusOr<Outcome> dp =
              TrainDp(cfg, text, shape.dp, stage, shape.pp, seed, Checkpointing{"", 0, dir, ""});
          ASSERT_TRUE(dp.ok()) << dp.status();
          EXPECT_EQ(FirstDifference(*run, *dp), "") << name << SeedTrace();
        } else {
          const Distance d = Measure(*run, expected);
          const double bound = TensorParallelBound(cfg, shape.tp);
          std::printf("%s: loss rel diff %.3g, weights rel L2 %.3g (bound %.3g)\n", name.c_str(),
                      d.loss_rel, d.weight_rel_l2, bound);
          EXPECT_LE(d.loss_rel, bound) << name << SeedTrace();
          EXPECT_LE(d.weight_rel_l2, bound) << name << SeedTrace();
        }
      }
    }
    std::filesystem::remove_all(dir);
  }
}

// LoadSlices refuses origins that do not fit the checkpoint's model,
// naming the param; the refusals leave the engine loadable.
TEST(GridGptTrainer, LoadSlicesRefusesOriginsThatDoNotFit) {
  const uint64_t seed = Seed();
  const GptConfig cfg = GridConfig();
  const std::vector<uint8_t> text = RandomText(seed, 6000);
  const std::string dir = ::testing::TempDir() + "/gpt_grid_refuse_" + std::to_string(seed);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(TrainDp(cfg, text, 1, 0, 1, seed, Checkpointing{dir, 1, "", ""}).ok());
  const GridShape shape{1, 2, 1};
  const absl::Status status =
      RunLocalRanks(shape.world(), [&](int, Communicator& world) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGrid> grid, ProcessGrid::Create(world, shape));
        std::unique_ptr<Device> device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(const ModelSpec shard,
                            BuildGptShardModelSpec(cfg, shape, grid->coord()));
        ZS_ASSIGN_OR_RETURN(
            std::unique_ptr<Engine> engine,
            Engine::Create(shard, MakeTrain(1, 2), *device, grid->dp(),
                           ModelParallelOptions{&grid->model_parallel(), grid->coord().tp == 0}));
        const std::vector<std::vector<ParamOrigin>> origins =
            GptParamOrigins(shard, shape, grid->coord());
        std::vector<std::vector<ParamOrigin>> bad = origins;
        bad[1][2].param = "attn.c_atn.weight";
        absl::Status s = engine->LoadSlices(dir, bad).status();
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        EXPECT_NE(s.message().find("h.0.attn.c_attn.weight"), std::string::npos) << s;
        EXPECT_NE(s.message().find("no param h.0.attn.c_atn.weight"), std::string::npos) << s;
        bad = origins;
        bad[1][2].parts = 3;
        s = engine->LoadSlices(dir, bad).status();
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        EXPECT_NE(s.message().find("ceil("), std::string::npos) << s;
        bad = origins;
        bad[0].pop_back();
        s = engine->LoadSlices(dir, bad).status();
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        return engine->LoadSlices(dir, origins).status();
      });
  EXPECT_TRUE(status.ok()) << status;
  std::filesystem::remove_all(dir);
}

// Every fp32 value a checkpoint holds (master, Adam m and v of every
// segment, whole), read back through the engine's own reader.
absl::StatusOr<std::vector<std::vector<float>>> ReadStates(const std::string& dir) {
  ZS_ASSIGN_OR_RETURN(const std::string step_dir, ResolveCheckpoint(dir));
  ZS_ASSIGN_OR_RETURN(const ::zeroshard::internal::Manifest m,
                      ::zeroshard::internal::ReadManifest(step_dir));
  ::zeroshard::internal::SegmentReader reader(step_dir, m);
  std::vector<std::vector<float>> states;
  for (size_t u = 0; u < m.used_numel.size(); ++u) {
    std::vector<float> t[::zeroshard::internal::kTensorsPerUnit];
    float* out[::zeroshard::internal::kTensorsPerUnit];
    for (int k = 0; k < ::zeroshard::internal::kTensorsPerUnit; ++k) {
      t[k].assign(static_cast<size_t>(m.used_numel[u]), 0.0f);
      out[k] = t[k].data();
    }
    ZS_RETURN_IF_ERROR(reader.Read(static_cast<int>(u), 0, m.used_numel[u], out));
    for (auto& v : t) states.push_back(std::move(v));
  }
  states.push_back({static_cast<float>(m.step), static_cast<float>(m.world_size)});
  return states;
}

std::string FirstStateDifference(const std::vector<std::vector<float>>& a,
                                 const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return absl::StrFormat("%d tensors vs %d", a.size(), b.size());
  for (size_t t = 0; t + 1 < a.size(); ++t) {
    if (a[t].size() != b[t].size()) return absl::StrFormat("tensor %d's size", t);
    for (size_t i = 0; i < a[t].size(); ++i) {
      if (std::memcmp(&a[t][i], &b[t][i], 4) != 0) {
        return absl::StrFormat("segment %d %s element %d: %.9g vs %.9g", t / 3,
                               t % 3 == 0 ? "master" : (t % 3 == 1 ? "adam_m" : "adam_v"), i,
                               a[t][i], b[t][i]);
      }
    }
  }
  return "";
}

// The reshard matrix (issue 23): a grid run of 4 steps saves one checkpoint
// of the whole model after step 2 on A, for A among the six grids at ZeRO
// stages 1 and 3; it resumes on every B (the six grids, stages 1 and 3),
// saves again at once, and trains to step 4.
//  - Every resumed grid writes back exactly the states it loaded (master,
//    m and v of every element: the reshard loses nothing, whatever the tp,
//    pp, dp and stage).
//  - B == A (grid and stage), and any B with one micro-batch per rank from
//    such an A ((4,1,1): the stages are bitwise alike): the continued run is
//    the uninterrupted one, bit for bit.
//  - tp 1: bitwise the dp-only run of dp ranks accumulating pp micro-batches
//    that loads the same checkpoint with Load.
//  - Otherwise (the summation order changes with tp, and with the stage
//    and dp under accumulation): within the tensor-parallel bound of the
//    uninterrupted run.
// ZS_TEST_LIGHT=1: A only (2,2,1) at stage 1 and (1,1,4) at stage 3.
TEST(GridGptTrainer, CheckpointsReshardBetweenEveryGridAndStage) {
  const uint64_t seed = Seed();
  const GptConfig cfg = GridConfig();
  const std::vector<uint8_t> text = RandomText(seed, 6000);
  const std::string root = ::testing::TempDir() + "/gpt_grid_matrix_" + std::to_string(seed);
  const std::vector<GridShape> shapes = {GridShape{4, 1, 1}, GridShape{2, 2, 1},
                                         GridShape{2, 1, 2}, GridShape{1, 2, 2},
                                         GridShape{1, 4, 1}, GridShape{1, 1, 4}};
  std::vector<GridCase> sources;
  for (const GridShape& shape : shapes) {
    for (int stage : {1, 3}) sources.push_back({shape, stage});
  }
  if (testing::LightMode()) sources = {{GridShape{2, 2, 1}, 1}, {GridShape{1, 1, 4}, 3}};
  double worst_loss = 0, worst_weights = 0;
  int bitwise = 0, bounded = 0;
  for (const GridCase& a : sources) {
    const std::string dir_a = absl::StrFormat("%s_a", root);
    std::filesystem::remove_all(dir_a);
    absl::StatusOr<Outcome> uninterrupted =
        TrainGrid(cfg, text, a.shape, a.stage, seed, Checkpointing{dir_a, 2, "", ""});
    ASSERT_TRUE(uninterrupted.ok()) << Name(a) << ": " << uninterrupted.status();
    Outcome expected = *uninterrupted;
    expected.losses.erase(expected.losses.begin(), expected.losses.begin() + 2);
    absl::StatusOr<std::vector<std::vector<float>>> saved = ReadStates(dir_a);
    ASSERT_TRUE(saved.ok()) << saved.status();
    for (const GridShape& shape : shapes) {
      for (int stage : {1, 3}) {
        const GridCase b{shape, stage};
        const std::string name = absl::StrFormat("%s -> %s", Name(a), Name(b));
        const std::string dir_b = absl::StrFormat("%s_b", root);
        std::filesystem::remove_all(dir_b);
        absl::StatusOr<Outcome> run =
            TrainGrid(cfg, text, b.shape, b.stage, seed, Checkpointing{"", 0, dir_a, dir_b});
        ASSERT_TRUE(run.ok()) << name << ": " << run.status() << SeedTrace();
        EXPECT_EQ(run->tie_checks, 2) << name << SeedTrace();
        absl::StatusOr<std::vector<std::vector<float>>> resaved = ReadStates(dir_b);
        ASSERT_TRUE(resaved.ok()) << resaved.status();
        EXPECT_EQ(FirstStateDifference(*resaved, *saved), "") << name << SeedTrace();
        const bool same = a.shape.dp == b.shape.dp && a.shape.tp == b.shape.tp &&
                          a.shape.pp == b.shape.pp && a.stage == b.stage;
        const bool one_micro = a.shape.tp * a.shape.pp == 1 && b.shape.tp * b.shape.pp == 1;
        if (same || one_micro) {
          EXPECT_EQ(FirstDifference(*run, expected), "") << name << SeedTrace();
          ++bitwise;
        } else if (b.shape.tp == 1) {
          absl::StatusOr<Outcome> dp = TrainDp(cfg, text, b.shape.dp, b.stage, b.shape.pp, seed,
                                               Checkpointing{"", 0, dir_a, ""});
          ASSERT_TRUE(dp.ok()) << dp.status();
          EXPECT_EQ(FirstDifference(*run, *dp), "") << name << SeedTrace();
          ++bitwise;
        } else {
          const Distance d = Measure(*run, expected);
          const double bound = TensorParallelBound(cfg, std::max(a.shape.tp, b.shape.tp));
          EXPECT_LE(d.loss_rel, bound) << name << SeedTrace();
          EXPECT_LE(d.weight_rel_l2, bound) << name << SeedTrace();
          worst_loss = std::max(worst_loss, d.loss_rel);
          worst_weights = std::max(worst_weights, d.weight_rel_l2);
          ++bounded;
        }
      }
    }
  }
  std::printf(
      "reshard matrix: %zu sources x 12 targets, every resave lossless; %d continued bitwise, "
      "%d within the bound %.3g: worst loss rel diff %.3g, weights rel L2 %.3g\n",
      sources.size(), bitwise, bounded, TensorParallelBound(cfg, 4), worst_loss, worst_weights);
  std::filesystem::remove_all(root + "_a");
  std::filesystem::remove_all(root + "_b");
}

// PrepareCheckpointDirectory(dir, world) checks the directory over the
// whole grid: positions that see different directories fail on every rank,
// naming the ranks; the engine's own check (its dp group: one rank here)
// would not see it.
TEST(GridGptTrainer, TheDirectoryCheckSpansTheGrid) {
  const GptConfig cfg = GridConfig();
  const std::string root = ::testing::TempDir() + "/gpt_grid_dircheck_" + std::to_string(Seed());
  const GridShape shape{1, 2, 1};
  std::vector<absl::Status> own(2), whole(2), same(2);
  const absl::Status status =
      RunLocalRanks(shape.world(), [&](int rank, Communicator& world) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGrid> grid, ProcessGrid::Create(world, shape));
        std::unique_ptr<Device> device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(const ModelSpec shard,
                            BuildGptShardModelSpec(cfg, shape, grid->coord()));
        ZS_ASSIGN_OR_RETURN(
            std::unique_ptr<Engine> engine,
            Engine::Create(shard, MakeTrain(1, 2), *device, grid->dp(),
                           ModelParallelOptions{&grid->model_parallel(), grid->coord().tp == 0}));
        const std::string mine = absl::StrFormat("%s_rank%d", root, rank);
        own[rank] = engine->PrepareCheckpointDirectory(mine);
        whole[rank] = engine->PrepareCheckpointDirectory(mine, grid->world());
        same[rank] = engine->PrepareCheckpointDirectory(root, grid->world());
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(own[r].ok()) << own[r];
    EXPECT_EQ(whole[r].code(), absl::StatusCode::kFailedPrecondition) << whole[r];
    EXPECT_NE(whole[r].message().find("rank 1"), std::string::npos) << whole[r];
    EXPECT_TRUE(same[r].ok()) << same[r];
  }
  for (const std::string& d : {root, root + "_rank0", root + "_rank1"}) {
    std::filesystem::remove_all(d);
  }
}

}  // namespace
}  // namespace gpt
}  // namespace zeroshard
