// LossScaler: the dynamic loss scale of fp16 mixed precision, as a value.
//
// The trainer multiplies its loss by scale() before the backward; the
// engine divides the gradients by it again. A step whose gradients are not
// finite is skipped and counts against the scale: after `hysteresis` such
// steps the scale backs off (never below min_scale); `growth_interval`
// clean steps in a row grow it. Too many skipped steps in a row at the
// minimum scale is an error: the model diverged or the data holds inf/NaN.
// Without fp16 the scale is 1 and never changes.
#ifndef ZEROSHARD_RUNTIME_LOSS_SCALER_H_
#define ZEROSHARD_RUNTIME_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::internal {

class LossScaler {
 public:
  // The scale and its counters (a checkpoint saves and restores them).
  struct State {
    double scale = 1.0;
    int hysteresis_left = 1;
    int64_t clean_steps = 0;
    int skips_at_min_scale = 0;
    bool operator==(const State& o) const {
      return scale == o.scale && hysteresis_left == o.hysteresis_left &&
             clean_steps == o.clean_steps && skips_at_min_scale == o.skips_at_min_scale;
    }
  };

  // Dynamic when `precision` is fp16 mixed (starting at
  // spec.initial_scale), else fixed at 1.
  LossScaler(Precision precision, const LossScaleSpec& spec);

  bool dynamic() const { return dynamic_; }
  double scale() const { return state_.scale; }
  const State& state() const { return state_; }
  void Restore(const State& state) { state_ = state; }

  // After step `step` (1-based, for the message): `overflow` says its
  // gradients were not finite (the step was skipped). FailedPrecondition
  // after max_skips_at_min_scale skipped steps in a row at min_scale.
  absl::Status Update(bool overflow, int64_t step);

 private:
  bool dynamic_;
  LossScaleSpec spec_;
  State state_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_LOSS_SCALER_H_
