// Tests of MlpTrainer: its call sequence and the gradients it writes, against
// a scripted fake engine (no engine needed), then training runs on the real
// engine across ZeRO stages, precisions and world sizes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "examples/mlp/internal/block_math.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/examples/fake_engine.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

// fp32 -> the bits a `dtype` element holds, written with the public
// conversions (not the trainer's helpers, which are what is under test).
void Encode(const std::vector<float>& values, DType dtype, std::vector<uint8_t>* bytes) {
  bytes->resize(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes->data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::kFloat16 ? Fp32ToFp16(values[i]) : Fp32ToBf16(values[i]);
      std::memcpy(bytes->data() + 2 * i, &h, 2);
    }
  }
}

std::vector<float> Decode(const std::vector<uint8_t>& bytes, DType dtype) {
  std::vector<float> values(bytes.size() / DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&values[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      values[i] = dtype == DType::kFloat16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
    }
  }
  return values;
}

// A one-rank engine that applies no update: it hands out the initial params
// in `dtype`, keeps the bytes the trainer writes to each gradient view, logs
// every call ("G0" Gather(0), "R0" Release, "V0" GradView, "D0" ReduceGrads,
// "S" Step) and counts contract violations (a second unit gathered, a
// release or gradient view of a unit that is not gathered).
class FakeEngine final : public testing::FakeEngineBase {
 public:
  FakeEngine(const MlpConfig& cfg, DType dtype, double loss_scale)
      : FakeEngineBase(BuildModelSpec(cfg)), dtype_(dtype), loss_scale_(loss_scale) {
    for (int u = 0; u < cfg.blocks; ++u) {
      for (int p = 0; p < kNumBlockParams; ++p) {
        master_.push_back(InitialParam(cfg, u, p));
        params_.emplace_back();
        Encode(master_.back(), dtype, &params_.back());
        grads_.emplace_back(params_.back().size());
        written_.emplace_back();
      }
    }
  }

  absl::StatusOr<UnitView> Gather(int unit) override {
    NoteGather(unit);
    return View(unit, params_);
  }
  absl::StatusOr<UnitView> GradView(int unit) override {
    Log("V", unit);
    if (gathered_ != unit) ++violations_;
    // All-ones bytes are a NaN in every dtype: an element the trainer does
    // not overwrite shows up.
    for (int p = 0; p < kNumBlockParams; ++p) {
      std::vector<uint8_t>& g = grads_[Index(unit, p)];
      std::fill(g.begin(), g.end(), uint8_t{0xff});
    }
    return View(unit, grads_);
  }
  absl::Status ReduceGrads(int unit) override {
    Log("D", unit);
    for (int p = 0; p < kNumBlockParams; ++p) written_[Index(unit, p)] = grads_[Index(unit, p)];
    return absl::OkStatus();
  }
  absl::StatusOr<StepResult> Step() override { return CountStep(); }
  double loss_scale() const override { return loss_scale_; }
  absl::StatusOr<std::vector<float>> GetParam(int unit, int param) override {
    return master_[Index(unit, param)];
  }

  // The bytes last written to the gradient view of (unit, param).
  const std::vector<uint8_t>& written(int unit, int param) const {
    return written_[Index(unit, param)];
  }

 private:
  static size_t Index(int unit, int param) {
    return static_cast<size_t>(unit) * kNumBlockParams + param;
  }
  UnitView View(int unit, std::vector<std::vector<uint8_t>>& storage) {
    UnitView view;
    for (int p = 0; p < kNumBlockParams; ++p) {
      TensorView t;
      t.data = storage[Index(unit, p)].data();
      t.dtype = dtype_;
      t.numel = static_cast<int64_t>(master_[Index(unit, p)].size());
      t.shape = &model_.units[unit].params[p].shape;
      view.params.push_back(t);
    }
    return view;
  }

  DType dtype_;
  double loss_scale_;
  std::vector<std::vector<float>> master_;
  std::vector<std::vector<uint8_t>> params_, grads_, written_;
};

MlpConfig SmallConfig() {
  MlpConfig cfg;
  cfg.hidden = 16;
  cfg.blocks = 3;
  cfg.micro_batch = 4;
  return cfg;
}

// Runs one TrainStep of a trainer over `engine`; returns the loss.
absl::StatusOr<double> OneStep(const MlpConfig& cfg, Engine& engine) {
  double loss = 0.0;
  ZS_RETURN_IF_ERROR(RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    MlpTrainer trainer(cfg, engine, comm);
    ZS_ASSIGN_OR_RETURN(loss, trainer.TrainStep());
    return absl::OkStatus();
  }));
  return loss;
}

TEST(MlpTrainerContract, GathersOneUnitAtATimeForwardAndBackward) {
  const MlpConfig cfg = SmallConfig();
  FakeEngine engine(cfg, DType::kFloat32, 1.0);
  absl::StatusOr<double> loss = OneStep(cfg, engine);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(engine.calls(),
            "G0 R0 G1 R1 G2 R2 "                    // forward
            "G2 V2 D2 R2 G1 V1 D1 R1 G0 V0 D0 R0 "  // backward gathers again
            "S");
  EXPECT_EQ(engine.violations(), 0);
}

// The gradients the trainer writes are those of the params the views hold
// (widened from the view dtype), times the loss scale, rounded once to the
// view dtype; the loss it returns is unscaled. Checked bit for bit against
// the block math run directly: scaling the backward's seed by a power of two
// scales every gradient exactly.
TEST(MlpTrainerContract, WritesScaledGradientsRoundedToTheViewDType) {
  const MlpConfig cfg = SmallConfig();
  const int64_t b = cfg.micro_batch, h = cfg.hidden;
  struct Case {
    DType dtype;
    double scale;
  };
  for (const Case c :
       {Case{DType::kFloat32, 1.0}, Case{DType::kFloat32, 256.0}, Case{DType::kBFloat16, 1.0},
        Case{DType::kFloat16, 1.0}, Case{DType::kFloat16, 1024.0}}) {
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " loss scale ", c.scale));
    FakeEngine engine(cfg, c.dtype, c.scale);
    absl::StatusOr<double> loss = OneStep(cfg, engine);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_EQ(engine.violations(), 0);

    // Reference: the params as the views hold them, the same micro-batch.
    std::vector<std::vector<float>> weights;
    std::vector<internal::BlockWeights> blocks;
    for (int u = 0; u < cfg.blocks; ++u) {
      for (int p = 0; p < kNumBlockParams; ++p) {
        std::vector<uint8_t> bytes;
        Encode(InitialParam(cfg, u, p), c.dtype, &bytes);
        weights.push_back(Decode(bytes, c.dtype));
      }
    }
    for (int u = 0; u < cfg.blocks; ++u) {
      const auto* w = &weights[static_cast<size_t>(u) * kNumBlockParams];
      blocks.push_back({w[kW1].data(), w[kB1].data(), w[kW2].data(), w[kB2].data()});
    }
    std::vector<float> x(static_cast<size_t>(b * h)), target(x.size());
    DistributedSampler(cfg, 1, 0, 1).Fill(0, 0, x.data(), target.data());
    internal::ForwardState state;
    state.Resize(cfg.blocks, b, h);
    internal::NetworkForward(blocks, b, h, x.data(), &state);
    std::vector<float> dy(x.size()), dx(x.size()), scratch(4 * x.size());
    const double ref_loss =
        internal::MseLoss(state.output().data(), target.data(), b * h, dy.data());
    EXPECT_EQ(std::memcmp(&*loss, &ref_loss, sizeof(double)), 0) << *loss << " vs " << ref_loss;

    int64_t nonzero = 0;
    for (int u = cfg.blocks - 1; u >= 0; --u) {
      std::vector<std::vector<float>> g(kNumBlockParams);
      for (int p = 0; p < kNumBlockParams; ++p)
        g[p].resize(weights[u * kNumBlockParams + p].size());
      internal::BlockBackward(blocks[u], b, h, state.inputs[u].data(), state.pre[u].data(),
                              state.act[u].data(), dy.data(), scratch.data(), dx.data(),
                              {g[kW1].data(), g[kB1].data(), g[kW2].data(), g[kB2].data()});
      std::swap(dy, dx);
      for (int p = 0; p < kNumBlockParams; ++p) {
        for (float& v : g[p]) v *= static_cast<float>(c.scale);
        std::vector<uint8_t> expected;
        Encode(g[p], c.dtype, &expected);
        const std::vector<uint8_t>& got = engine.written(u, p);
        ASSERT_EQ(got.size(), expected.size());
        EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size()), 0)
            << "block " << u << " param " << p;
        for (float v : Decode(got, c.dtype)) {
          ASSERT_TRUE(std::isfinite(v)) << "block " << u << " param " << p;
          nonzero += v != 0.0f;
        }
      }
    }
    EXPECT_GT(nonzero, 0);
  }
}

// Trains `steps` steps on `world` local ranks and returns rank 0's losses and
// final weights.
struct TrainOutcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
  std::vector<bool> skipped;      // StepResult::skipped of each step
  double final_loss_scale = 0.0;  // EngineStats of rank 0 after training
  int64_t skipped_steps = 0;
};

// `tweak`, when given, edits the TrainSpec (prefetch depth, loss scaling).
// `data`: the trainer's data loader (default: a background thread).
absl::StatusOr<TrainOutcome> Train(const MlpConfig& cfg, int world, int stage, int accum,
                                   Precision precision, int steps,
                                   const std::function<void(TrainSpec&)>& tweak = nullptr,
                                   const DataLoaderOptions& data = {}) {
  TrainOutcome outcome;
  TrainSpec train;
  train.zero_stage = stage;
  train.precision = precision;
  train.grad_accum_steps = accum;
  train.optimizer.lr = 1e-2;
  train.optimizer.weight_decay = 0.01;
  train.max_grad_norm = 1.0;
  if (tweak) tweak(train);
  absl::Status status = RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(BuildModelSpec(cfg), train, *device, comm));
    ZS_RETURN_IF_ERROR(InitEngineParams(*engine, cfg));
    ZS_RETURN_IF_ERROR(engine->Start());
    MlpTrainer trainer(cfg, *engine, comm, data);
    for (int s = 0; s < steps; ++s) {
      ZS_ASSIGN_OR_RETURN(const double loss, trainer.TrainStep());
      if (rank == 0) {
        outcome.losses.push_back(loss);
        outcome.skipped.push_back(trainer.last_step().skipped);
      }
    }
    if (trainer.step() != steps) return absl::InternalError("trainer.step() is off");
    if (rank == 0) {
      outcome.final_loss_scale = engine->Stats().loss_scale;
      outcome.skipped_steps = engine->Stats().skipped_steps;
    }
    for (int u = 0; u < cfg.blocks; ++u) {
      for (int p = 0; p < kNumBlockParams; ++p) {
        ZS_ASSIGN_OR_RETURN(std::vector<float> values, engine->GetParam(u, p));
        if (rank == 0) outcome.params.push_back(std::move(values));
      }
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return outcome;
}

TEST(MlpTrainer, LossDecreases) {
  absl::StatusOr<TrainOutcome> run = Train(SmallConfig(), 2, 2, 1, Precision::kFp32, 30);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->losses.size(), 30u);
  EXPECT_LT(run->losses.back(), 0.5 * run->losses.front());
}

// Invariant 2 of the architecture: one micro-batch per rank per step, fp32:
// every stage gives the bits of the one-rank run that accumulates the same
// micro-batches in rank order.
TEST(MlpTrainer, EveryStageMatchesOneRankBaselineBitwise) {
  const MlpConfig cfg = SmallConfig();
  const int world = 3, steps = 4;
  absl::StatusOr<TrainOutcome> baseline = Train(cfg, 1, 0, world, Precision::kFp32, steps);
  ASSERT_TRUE(baseline.ok()) << baseline.status();
  for (int stage = 0; stage <= 3; ++stage) {
    absl::StatusOr<TrainOutcome> run = Train(cfg, world, stage, 1, Precision::kFp32, steps);
    ASSERT_TRUE(run.ok()) << "stage " << stage << ": " << run.status();
    ASSERT_EQ(run->params.size(), baseline->params.size());
    for (size_t t = 0; t < run->params.size(); ++t) {
      ASSERT_EQ(run->params[t].size(), baseline->params[t].size());
      EXPECT_EQ(std::memcmp(run->params[t].data(), baseline->params[t].data(),
                            run->params[t].size() * sizeof(float)),
                0)
          << "stage " << stage << " block " << t / kNumBlockParams << " param "
          << t % kNumBlockParams;
    }
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(run->losses[s], baseline->losses[s], 1e-12 * baseline->losses[s]) << s;
    }
  }
}

// The data loader's thread makes the same micro-batches as the trainer's
// own thread (depth 0, the synchronous loader): the same bits, whatever the
// queue depth, with accumulation and several ranks.
TEST(MlpTrainer, LoaderDepthDoesNotChangeTheBits) {
  const MlpConfig cfg = SmallConfig();
  const int world = 2, accum = 3, steps = 3;
  absl::StatusOr<TrainOutcome> sync =
      Train(cfg, world, 2, accum, Precision::kFp32, steps, nullptr, DataLoaderOptions{0});
  ASSERT_TRUE(sync.ok()) << sync.status();
  for (int depth : {1, 2, 4}) {
    absl::StatusOr<TrainOutcome> run =
        Train(cfg, world, 2, accum, Precision::kFp32, steps, nullptr, DataLoaderOptions{depth});
    ASSERT_TRUE(run.ok()) << "depth " << depth << ": " << run.status();
    ASSERT_EQ(run->params.size(), sync->params.size());
    for (size_t t = 0; t < run->params.size(); ++t) {
      EXPECT_EQ(std::memcmp(run->params[t].data(), sync->params[t].data(),
                            run->params[t].size() * sizeof(float)),
                0)
          << "depth " << depth << " tensor " << t;
    }
    EXPECT_EQ(run->losses, sync->losses) << "depth " << depth;
  }
}

// With accumulation (and with bf16) the summation order or rounding differs:
// the runs agree within tolerance only. fp32: element-wise. bf16: Adam turns
// a rounding difference in a near-zero gradient into a full lr-sized step of
// either sign, so compare the losses and the weights' relative L2 distance.
TEST(MlpTrainer, AccumulationMatchesBaselineWithinTolerance) {
  const MlpConfig cfg = SmallConfig();
  absl::StatusOr<TrainOutcome> baseline = Train(cfg, 1, 0, 4, Precision::kFp32, 3);
  absl::StatusOr<TrainOutcome> run = Train(cfg, 2, 2, 2, Precision::kFp32, 3);
  ASSERT_TRUE(baseline.ok()) << baseline.status();
  ASSERT_TRUE(run.ok()) << run.status();
  for (size_t t = 0; t < run->params.size(); ++t) {
    for (size_t i = 0; i < run->params[t].size(); ++i) {
      ASSERT_NEAR(run->params[t][i], baseline->params[t][i], 1e-5)
          << "param " << t << " element " << i;
    }
  }
}

TEST(MlpTrainer, Bf16MatchesBaselineWithinTolerance) {
  const MlpConfig cfg = SmallConfig();
  const int steps = 10;
  absl::StatusOr<TrainOutcome> baseline = Train(cfg, 1, 0, 4, Precision::kBf16Mixed, steps);
  absl::StatusOr<TrainOutcome> run = Train(cfg, 2, 2, 2, Precision::kBf16Mixed, steps);
  ASSERT_TRUE(baseline.ok()) << baseline.status();
  ASSERT_TRUE(run.ok()) << run.status();
  for (int s = 0; s < steps; ++s) {
    EXPECT_NEAR(run->losses[s], baseline->losses[s], 1e-2 * baseline->losses[s]) << "step " << s;
  }
  double diff_sq = 0.0, norm_sq = 0.0;
  for (size_t t = 0; t < run->params.size(); ++t) {
    for (size_t i = 0; i < run->params[t].size(); ++i) {
      const double d = static_cast<double>(run->params[t][i]) - baseline->params[t][i];
      diff_sq += d * d;
      norm_sq += static_cast<double>(baseline->params[t][i]) * baseline->params[t][i];
    }
  }
  EXPECT_LT(std::sqrt(diff_sq / norm_sq), 1e-2);
  EXPECT_LT(baseline->losses.back(), baseline->losses.front());
}

// Stage 3 gathers every unit from shards (and prefetches ahead), but the
// params it hands out and the reductions are those of stage 0: fp32 runs on
// the same ranks agree bit for bit, whatever the prefetch depth.
TEST(MlpTrainer, Stage3MatchesStage0Bitwise) {
  const MlpConfig cfg = SmallConfig();
  const int steps = 4;
  for (int world : {2, 3}) {
    absl::StatusOr<TrainOutcome> stage0 = Train(cfg, world, 0, 1, Precision::kFp32, steps);
    ASSERT_TRUE(stage0.ok()) << "world " << world << ": " << stage0.status();
    for (int prefetch : {0, 1, 2}) {
      SCOPED_TRACE(absl::StrCat("world ", world, " prefetch ", prefetch));
      absl::StatusOr<TrainOutcome> stage3 =
          Train(cfg, world, 3, 1, Precision::kFp32, steps,
                [&](TrainSpec& t) { t.prefetch_units = prefetch; });
      ASSERT_TRUE(stage3.ok()) << stage3.status();
      ASSERT_EQ(stage3->params.size(), stage0->params.size());
      for (size_t t = 0; t < stage3->params.size(); ++t) {
        ASSERT_EQ(stage3->params[t].size(), stage0->params[t].size());
        EXPECT_EQ(std::memcmp(stage3->params[t].data(), stage0->params[t].data(),
                              stage3->params[t].size() * sizeof(float)),
                  0)
            << "block " << t / kNumBlockParams << " param " << t % kNumBlockParams;
      }
      ASSERT_EQ(stage3->losses.size(), stage0->losses.size());
      for (int s = 0; s < steps; ++s) {
        EXPECT_EQ(std::memcmp(&stage3->losses[s], &stage0->losses[s], sizeof(double)), 0)
            << "step " << s;
      }
    }
  }
}

// fp16 with the default dynamic loss scaling trains (stage 2 and 3), and
// follows the fp32 run closely.
TEST(MlpTrainer, Fp16TrainsWithLossScaling) {
  const MlpConfig cfg = SmallConfig();
  const int steps = 30;
  absl::StatusOr<TrainOutcome> fp32 = Train(cfg, 2, 2, 1, Precision::kFp32, steps);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  for (int stage : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    absl::StatusOr<TrainOutcome> run = Train(cfg, 2, stage, 1, Precision::kFp16Mixed, steps);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->losses.size(), static_cast<size_t>(steps));
    EXPECT_LT(run->losses.back(), 0.5 * run->losses.front());
    EXPECT_LT(run->skipped_steps, steps / 2);
    EXPECT_GE(run->final_loss_scale, 1.0);
    EXPECT_LE(run->final_loss_scale, TrainSpec().loss_scale.initial_scale);
    EXPECT_NEAR(run->losses.back(), fp32->losses.back(), 0.1 * fp32->losses.back());
  }
}

// A loss scale far too large overflows fp16 gradients: those steps are
// skipped on every rank, the scale backs off, and training proceeds.
TEST(MlpTrainer, Fp16OverflowBacksOffTheLossScaleAndTrains) {
  const MlpConfig cfg = SmallConfig();
  const int steps = 30;
  const double initial = std::ldexp(1.0, 28);
  absl::StatusOr<TrainOutcome> run =
      Train(cfg, 2, 3, 1, Precision::kFp16Mixed, steps, [&](TrainSpec& t) {
        t.loss_scale.initial_scale = initial;
        t.loss_scale.hysteresis = 1;
      });
  ASSERT_TRUE(run.ok()) << run.status();
  // 2^28 times gradients of order 0.1 overflows fp16 (65504) for sure.
  ASSERT_EQ(run->skipped.size(), static_cast<size_t>(steps));
  EXPECT_TRUE(run->skipped[0]);
  EXPECT_FALSE(run->skipped.back());
  EXPECT_EQ(run->skipped_steps, std::count(run->skipped.begin(), run->skipped.end(), true));
  EXPECT_LT(run->skipped_steps, steps / 2);
  EXPECT_LT(run->final_loss_scale, initial);
  EXPECT_GE(run->final_loss_scale, 1.0);
  for (double loss : run->losses) ASSERT_TRUE(std::isfinite(loss));
  EXPECT_LT(run->losses.back(), 0.5 * run->losses.front());
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard
