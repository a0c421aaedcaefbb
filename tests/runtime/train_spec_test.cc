#include "zeroshard/train_spec.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard {
namespace {

TEST(LrScheduleTest, ConstantIsThePeak) {
  LrSchedule s;
  for (int64_t step : {1, 10, 100000}) EXPECT_EQ(s.LrAt(step, 3e-4), 3e-4);
}

TEST(LrScheduleTest, WarmupIsLinearThenCosineDecaysToTheFloor) {
  LrSchedule s;
  s.kind = LrSchedule::Kind::kWarmupCosine;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1;
  const double peak = 2e-3;
  for (int64_t step = 1; step <= 10; ++step) {
    EXPECT_DOUBLE_EQ(s.LrAt(step, peak), peak * step / 10.0) << step;
  }
  // Half-way through the decay: the mean of peak and floor.
  EXPECT_NEAR(s.LrAt(60, peak), 0.5 * (peak + 0.1 * peak), 1e-15);
  for (int64_t step = 11; step < 110; ++step) {
    const double progress = (step - 10) / 100.0;
    const double expected = 0.1 * peak + 0.5 * (0.9 * peak) * (1.0 + std::cos(M_PI * progress));
    EXPECT_NEAR(s.LrAt(step, peak), expected, 1e-15) << step;
    EXPECT_LT(s.LrAt(step + 1, peak), s.LrAt(step, peak)) << step;
  }
  EXPECT_DOUBLE_EQ(s.LrAt(110, peak), 0.1 * peak);
  EXPECT_DOUBLE_EQ(s.LrAt(5000, peak), 0.1 * peak);
}

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::nan("");

TEST(TrainSpecTest, ValidationNamesTheField) {
  struct Case {
    void (*mutate)(TrainSpec&);
    const char* field;
  };
  const Case cases[] = {
      {[](TrainSpec& t) { t.zero_stage = 4; }, "zero_stage"},
      {[](TrainSpec& t) { t.optimizer.eps = 0; }, "eps"},
      {[](TrainSpec& t) { t.optimizer.beta2 = 1.0; }, "beta2"},
      {[](TrainSpec& t) { t.optimizer.lr = -1; }, "lr"},
      {[](TrainSpec& t) { t.grad_accum_steps = 0; }, "grad_accum_steps"},
      {[](TrainSpec& t) { t.grad_dtype = DType::kBFloat16; }, "grad_dtype"},
      {[](TrainSpec& t) { t.prefetch_units = -1; }, "prefetch_units"},
      {[](TrainSpec& t) { t.loss_scale.backoff_factor = 1.5; }, "backoff_factor"},
      {[](TrainSpec& t) { t.loss_scale.min_scale = 1e9; }, "min_scale"},
      {[](TrainSpec& t) {
         t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
         t.schedule.warmup_steps = 10;
         t.schedule.total_steps = 10;
       },
       "warmup"},
      // Non-finite values, each named.
      {[](TrainSpec& t) { t.optimizer.weight_decay = kInf; }, "optimizer.weight_decay"},
      {[](TrainSpec& t) { t.optimizer.eps = kInf; }, "optimizer.eps"},
      {[](TrainSpec& t) { t.optimizer.lr = kNaN; }, "optimizer.lr"},
      {[](TrainSpec& t) { t.optimizer.beta1 = kNaN; }, "optimizer.beta1"},
      {[](TrainSpec& t) { t.max_grad_norm = kInf; }, "max_grad_norm"},
      {[](TrainSpec& t) { t.loss_scale.growth_factor = kInf; }, "loss_scale.growth_factor"},
      {[](TrainSpec& t) { t.loss_scale.initial_scale = kInf; }, "loss_scale.initial_scale"},
      {[](TrainSpec& t) { t.loss_scale.backoff_factor = kNaN; }, "loss_scale.backoff_factor"},
      {[](TrainSpec& t) {
         t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
         t.schedule.total_steps = 10;
         t.schedule.min_lr_ratio = kNaN;
       },
       "min_lr_ratio"},
      // Enum values the engine does not know.
      {[](TrainSpec& t) { t.precision = static_cast<Precision>(7); }, "precision 7"},
      {[](TrainSpec& t) { t.optimizer.kind = static_cast<OptimizerKind>(9); }, "optimizer.kind 9"},
      {[](TrainSpec& t) { t.schedule.kind = static_cast<LrSchedule::Kind>(5); }, "schedule.kind 5"},
      {[](TrainSpec& t) { t.grad_dtype = DType::kInt64; }, "grad_dtype"},
      {[](TrainSpec& t) { t.grad_dtype = static_cast<DType>(200); }, "grad_dtype 200"},
      // Counts beyond any real run.
      {[](TrainSpec& t) { t.grad_accum_steps = 1 << 30; }, "grad_accum_steps"},
      {[](TrainSpec& t) { t.num_grad_buffers = 1000; }, "num_grad_buffers"},
      {[](TrainSpec& t) { t.prefetch_units = 1 << 30; }, "prefetch_units"},
      {[](TrainSpec& t) { t.loss_scale.hysteresis = 0; }, "loss_scale.hysteresis"},
      {[](TrainSpec& t) { t.loss_scale.growth_interval = 0; }, "loss_scale.growth_interval"},
  };
  for (const Case& c : cases) {
    TrainSpec t;
    c.mutate(t);
    const absl::Status status = t.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string::npos) << status;
  }
  TrainSpec fp16;
  fp16.precision = Precision::kFp16Mixed;
  EXPECT_EQ(fp16.param_dtype(), DType::kFloat16);
  EXPECT_EQ(fp16.effective_grad_dtype(), DType::kFloat16);
  fp16.grad_dtype = DType::kFloat32;
  EXPECT_TRUE(fp16.Validate().ok());
  EXPECT_EQ(std::string(PrecisionName(Precision::kFp16Mixed)), "fp16");
  EXPECT_EQ(*ParsePrecision("bf16"), Precision::kBf16Mixed);
  EXPECT_FALSE(ParsePrecision("fp8").ok());
}

// The params' tier names exactly the conditions it lacks: at stage 2 with
// the optimizer state on the host, only the stage (the defect: it also named
// "the optimizer state off the device", which was met).
TEST(TrainSpecTest, ParamsOffloadNamesOnlyTheUnmetConditions) {
  struct Case {
    int stage;
    MemoryTier optimizer, params;
    int64_t persistent;
    std::vector<std::string> named, not_named;
  };
  const std::string stage = "zero_stage 3";
  const std::string off_device = "the optimizer state off the device";
  const std::string on_nvme = "the optimizer state on nvme too";
  const std::string persistent = "persistent_unit_numel 0";
  const std::vector<Case> cases = {
      {2, MemoryTier::kHost, MemoryTier::kHost, 0, {stage}, {off_device, on_nvme, persistent}},
      {3, MemoryTier::kDevice, MemoryTier::kHost, 0, {off_device}, {stage, on_nvme}},
      {1, MemoryTier::kDevice, MemoryTier::kHost, 0, {stage, off_device}, {on_nvme}},
      {2, MemoryTier::kNvme, MemoryTier::kNvme, 0, {stage}, {on_nvme, persistent, off_device}},
      {3, MemoryTier::kHost, MemoryTier::kNvme, 0, {on_nvme}, {stage, persistent}},
      {3, MemoryTier::kNvme, MemoryTier::kNvme, 4096, {persistent}, {stage, on_nvme}},
  };
  for (const Case& c : cases) {
    TrainSpec t;
    t.zero_stage = c.stage;
    t.offload.optimizer = c.optimizer;
    t.offload.params = c.params;
    t.persistent_unit_numel = c.persistent;
    const absl::Status status = t.Validate();
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.stage;
    for (const std::string& part : c.named) {
      EXPECT_NE(status.message().find(part), std::string::npos) << part << ": " << status;
    }
    for (const std::string& part : c.not_named) {
      EXPECT_EQ(status.message().find(part), std::string::npos) << part << ": " << status;
    }
  }
  TrainSpec fine;
  fine.zero_stage = 3;
  fine.offload.optimizer = MemoryTier::kHost;
  fine.offload.params = MemoryTier::kHost;
  EXPECT_TRUE(fine.Validate().ok()) << fine.Validate();
}

}  // namespace
}  // namespace zeroshard
