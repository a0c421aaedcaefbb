// The parts of a one-rank fake Engine that the example trainers' tests
// share: the calls a trainer's loop does not use return OK or
// Unimplemented, the accessors return fixed values, and every Gather,
// Release, GradView, ReduceGrads and Step is logged ("G0", "R0", "V0", "D0",
// "S") with a count of contract violations (a second unit gathered, a
// Release of a unit that is not gathered). A test's fake derives from it
// and says what its views hold and what Step does.
#ifndef ZEROSHARD_TESTS_EXAMPLES_FAKE_ENGINE_H_
#define ZEROSHARD_TESTS_EXAMPLES_FAKE_ENGINE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "zeroshard/engine.h"

namespace zeroshard::testing {

class FakeEngineBase : public Engine {
 public:
  explicit FakeEngineBase(ModelSpec model) : model_(std::move(model)) {}

  absl::Status SetParam(int, int, absl::Span<const float>) override { return absl::OkStatus(); }
  absl::Status Start(absl::Span<const TrainerSetting>) override { return absl::OkStatus(); }
  absl::Status Save(const std::string&, const std::string&, const CheckpointOptions&) override {
    return absl::UnimplementedError("not in the fake");
  }
  absl::Status WaitForCheckpoint() override { return absl::OkStatus(); }
  absl::Status PrepareCheckpointDirectory(const std::string&) override { return absl::OkStatus(); }
  absl::Status PrepareCheckpointDirectory(const std::string&, Communicator&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<CheckpointInfo> Load(const std::string&) override {
    return absl::UnimplementedError("not in the fake");
  }
  absl::Status SetEvalMode(bool) override { return absl::UnimplementedError("fake engine"); }
  absl::Status SetTrainable(int, int, bool) override {
    return absl::UnimplementedError("not in the fake");
  }
  absl::Status SetFrozenParam(int, int, absl::Span<const float>) override {
    return absl::UnimplementedError("not in the fake");
  }
  absl::Status SaveSlices(const std::string&, const std::string&, const ModelSpec&,
                          const std::vector<std::vector<ParamOrigin>>&, Communicator&,
                          const CheckpointOptions&) override {
    return absl::UnimplementedError("not in the fake");
  }
  absl::StatusOr<CheckpointInfo> LoadSlices(const std::string&,
                                            const std::vector<std::vector<ParamOrigin>>&) override {
    return absl::UnimplementedError("not in the fake");
  }
  // Logs the Release; a unit that is not the gathered one is a violation.
  absl::Status Release(int unit) override {
    Log("R", unit);
    if (gathered_ != unit) ++violations_;
    gathered_ = -1;
    return absl::OkStatus();
  }
  double loss_scale() const override { return 1.0; }
  void RecordInputWait(absl::Duration) override {}
  void RecordPipelineWait(absl::Duration) override {}
  const ModelSpec& model() const override { return model_; }
  const TrainSpec& train() const override { return train_; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int64_t steps() const override { return steps_; }
  EngineStats Stats() const override { return EngineStats{}; }
  const MemoryLedger& ledger() const override { return ledger_; }
  const MemoryLedger& tier_ledger(MemoryTier tier) const override {
    return tier == MemoryTier::kDevice ? ledger_ : other_tiers_;
  }

  // The calls so far, space-separated ("G0 R0 ... S").
  std::string calls() const { return absl::StrJoin(calls_, " "); }
  int violations() const { return violations_; }

 protected:
  void Log(const char* what, int unit) { calls_.push_back(absl::StrCat(what, unit)); }
  // Logs a Gather; a second unit gathered at once is a violation.
  void NoteGather(int unit) {
    Log("G", unit);
    if (gathered_ != -1) ++violations_;
    gathered_ = unit;
  }
  // Logs a Step and counts it: the StepResult to return.
  StepResult CountStep() {
    calls_.push_back("S");
    StepResult result;
    result.step = ++steps_;
    return result;
  }

  ModelSpec model_;
  TrainSpec train_;  // grad_accum_steps 1
  MemoryLedger ledger_;
  MemoryLedger other_tiers_;  // always empty: the fake offloads nothing
  std::vector<std::string> calls_;
  int gathered_ = -1;
  int violations_ = 0;
  int64_t steps_ = 0;
};

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_EXAMPLES_FAKE_ENGINE_H_
