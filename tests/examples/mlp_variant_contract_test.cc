// MlpTrainer's --vocab and --lora variants against a one-rank fake engine
// that keeps the engine's contract for tied and frozen params
// (zeroshard/model_spec.h, engine.h) and applies plain SGD: a tied alias's
// view is its owner's memory and each use writes its own gradient view,
// summed into the owner in ReduceGrads order; a frozen param's gradient
// entry is null; an all-frozen unit has no GradView / ReduceGrads (a call
// is a violation). Checks the call sequence and that both variants learn,
// independently of the real engine (mlp_variant_trainer_test runs that).
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/examples/fake_engine.h"
#include "zeroshard/communicator.h"
#include "zeroshard/engine.h"

namespace zeroshard {
namespace mlp {
namespace {

class SgdFakeEngine final : public testing::FakeEngineBase {
 public:
  SgdFakeEngine(const MlpConfig& cfg, double lr) : FakeEngineBase(BuildModelSpec(cfg)), lr_(lr) {
    for (int u = 0; u < static_cast<int>(model_.units.size()); ++u) {
      for (int p = 0; p < static_cast<int>(model_.units[u].params.size()); ++p) {
        const ParamSpec& spec = model_.units[u].params[p];
        owner_.push_back(Owner(u, p));
        values_.push_back(InitialParam(cfg, u, p));
        grads_.emplace_back(spec.trainable ? spec.NumElements() : 0);
        acc_.emplace_back(static_cast<size_t>(spec.NumElements()), 0.0f);
        index_.push_back(values_.size() - 1);
      }
    }
  }

  absl::StatusOr<UnitView> Gather(int unit) override {
    NoteGather(unit);
    UnitView view;
    for (int p = 0; p < NumParams(unit); ++p) {
      std::vector<float>& v = values_[owner_[Flat(unit, p)]];
      view.params.push_back(TensorView{v.data(), DType::kFloat32, static_cast<int64_t>(v.size()),
                                       &model_.units[unit].params[p].shape});
    }
    return view;
  }
  absl::StatusOr<UnitView> GradView(int unit) override {
    Log("V", unit);
    if (gathered_ != unit || !Trains(unit)) ++violations_;
    UnitView view;
    for (int p = 0; p < NumParams(unit); ++p) {
      std::vector<float>& g = grads_[Flat(unit, p)];
      // NaN: an element the trainer does not overwrite shows up.
      std::fill(g.begin(), g.end(), std::numeric_limits<float>::quiet_NaN());
      view.params.push_back(TensorView{g.empty() ? nullptr : g.data(), DType::kFloat32,
                                       static_cast<int64_t>(g.size()),
                                       &model_.units[unit].params[p].shape});
    }
    return view;
  }
  absl::Status ReduceGrads(int unit) override {
    Log("D", unit);
    if (!Trains(unit)) ++violations_;
    for (int p = 0; p < NumParams(unit); ++p) {
      const std::vector<float>& g = grads_[Flat(unit, p)];
      std::vector<float>& acc = acc_[owner_[Flat(unit, p)]];
      for (size_t i = 0; i < g.size(); ++i) acc[i] += g[i];
    }
    return absl::OkStatus();
  }
  absl::StatusOr<StepResult> Step() override {
    for (size_t t = 0; t < values_.size(); ++t) {
      for (size_t i = 0; i < acc_[t].size(); ++i) {
        if (!std::isfinite(acc_[t][i])) ++violations_;
        values_[t][i] -= static_cast<float>(lr_) * acc_[t][i];
        acc_[t][i] = 0.0f;
      }
    }
    return CountStep();
  }
  absl::StatusOr<std::vector<float>> GetParam(int unit, int param) override {
    return values_[owner_[Flat(unit, param)]];
  }

 private:
  int NumParams(int unit) const { return static_cast<int>(model_.units[unit].params.size()); }
  size_t Flat(int unit, int param) const {
    size_t flat = 0;
    for (int u = 0; u < unit; ++u) flat += model_.units[u].params.size();
    return flat + static_cast<size_t>(param);
  }
  // The flat index of the tensor (unit, param) is stored as: its own, or its
  // tied owner's.
  size_t Owner(int unit, int param) const {
    const ParamSpec& spec = model_.units[unit].params[param];
    if (!spec.tied_to.has_value()) return Flat(unit, param);
    for (int u = 0; u < unit; ++u) {
      if (model_.units[u].name != spec.tied_to->unit) continue;
      for (int p = 0; p < NumParams(u); ++p) {
        if (model_.units[u].params[p].name == spec.tied_to->param) return Flat(u, p);
      }
    }
    return Flat(unit, param);
  }
  bool Trains(int unit) const {
    for (const ParamSpec& p : model_.units[unit].params) {
      if (p.trainable) return true;
    }
    return false;
  }

  double lr_;
  std::vector<size_t> owner_, index_;
  std::vector<std::vector<float>> values_, grads_, acc_;
};

MlpConfig SmallLm() {
  MlpConfig cfg;
  cfg.hidden = 16;
  cfg.blocks = 2;
  cfg.micro_batch = 8;
  cfg.vocab = 12;
  return cfg;
}

// Runs `steps` TrainSteps on the fake; returns the losses.
std::vector<double> TrainOnFake(const MlpConfig& cfg, SgdFakeEngine& engine, int steps) {
  std::vector<double> losses;
  absl::Status status = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    MlpTrainer trainer(cfg, engine, comm);
    for (int s = 0; s < steps; ++s) {
      absl::StatusOr<double> loss = trainer.TrainStep();
      if (!loss.ok()) return loss.status();
      losses.push_back(*loss);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return losses;
}

// The LM: embed (unit 0), blocks 1-2, head (unit 3); each trained unit is
// reduced once per micro-batch, head before embed (the tied weight's uses
// in that order).
TEST(MlpVariantContract, LanguageModelCallSequence) {
  const MlpConfig cfg = SmallLm();
  SgdFakeEngine engine(cfg, 0.1);
  TrainOnFake(cfg, engine, 1);
  EXPECT_EQ(engine.calls(),
            "G0 R0 G1 R1 G2 R2 G3 R3 G3 V3 D3 R3 G2 V2 D2 R2 G1 V1 D1 R1 G0 V0 D0 R0 S");
  EXPECT_EQ(engine.violations(), 0);
}

// LoRA on the LM: the embedding and head are all frozen: gathered for the
// forward and backward, never given a GradView or a reduction.
TEST(MlpVariantContract, LoraLeavesAllFrozenUnitsUnreduced) {
  MlpConfig cfg = SmallLm();
  cfg.lora_rank = 2;
  SgdFakeEngine engine(cfg, 0.1);
  TrainOnFake(cfg, engine, 1);
  EXPECT_EQ(engine.calls(), "G0 R0 G1 R1 G2 R2 G3 R3 G3 R3 G2 V2 D2 R2 G1 V1 D1 R1 G0 R0 S");
  EXPECT_EQ(engine.violations(), 0);
}

TEST(MlpVariantContract, LanguageModelLearnsOnPlainSgd) {
  const MlpConfig cfg = SmallLm();
  SgdFakeEngine engine(cfg, 0.05);
  const std::vector<double> losses = TrainOnFake(cfg, engine, 150);
  EXPECT_EQ(engine.violations(), 0);
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << losses.front() << " -> " << losses.back();
}

TEST(MlpVariantContract, LoraLearnsAndKeepsTheBase) {
  MlpConfig cfg;
  cfg.hidden = 16;
  cfg.blocks = 2;
  cfg.micro_batch = 8;
  cfg.lora_rank = 4;
  SgdFakeEngine engine(cfg, 0.05);
  const std::vector<double> losses = TrainOnFake(cfg, engine, 150);
  EXPECT_EQ(engine.violations(), 0);
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << losses.front() << " -> " << losses.back();
  for (int u = 0; u < cfg.blocks; ++u) {
    for (int p = 0; p < kNumBlockParams; ++p) {
      EXPECT_EQ(*engine.GetParam(u, p), InitialParam(cfg, u, p)) << u << " " << p;
    }
  }
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard
