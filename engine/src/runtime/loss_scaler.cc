#include "engine/src/runtime/loss_scaler.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace zeroshard::internal {

LossScaler::LossScaler(Precision precision, const LossScaleSpec& spec)
    : dynamic_(precision == Precision::kFp16Mixed), spec_(spec) {
  if (dynamic_) {
    state_.scale = spec_.initial_scale;
    state_.hysteresis_left = spec_.hysteresis;
  }
}

absl::Status LossScaler::Update(bool overflow, int64_t step) {
  if (!dynamic_) return absl::OkStatus();
  State& s = state_;
  if (overflow) {
    s.clean_steps = 0;
    if (s.scale <= spec_.min_scale && ++s.skips_at_min_scale >= spec_.max_skips_at_min_scale) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Step %d: %d steps in a row had non-finite gradients at the minimum loss scale %g; the "
          "model has diverged or the data holds inf/NaN (lower the learning rate, check the "
          "inputs, or train in bf16)",
          step, s.skips_at_min_scale, spec_.min_scale));
    }
    if (--s.hysteresis_left <= 0) {
      s.scale = std::max(spec_.min_scale, s.scale * spec_.backoff_factor);
      s.hysteresis_left = spec_.hysteresis;
    }
    return absl::OkStatus();
  }
  s.skips_at_min_scale = 0;
  if (++s.clean_steps >= spec_.growth_interval) {
    s.scale *= spec_.growth_factor;
    s.clean_steps = 0;
    s.hysteresis_left = spec_.hysteresis;
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
