#include "engine/src/runtime/step_timeline.h"

#include <algorithm>
#include <chrono>

namespace zeroshard::internal {

absl::Duration StepTimeline::SteadyNow() {
  // Not absl::Now(): the wall clock may step (NTP), and a step backwards
  // would make an interval negative.
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

void StepTimeline::BeginSteps() {
  running_ = true;
  step_begin_ = Now();
  call_begin_ = step_begin_;
  engine_time_ = comm_wait_ = optimizer_ = input_wait_ = pipeline_wait_ = unplaced_wait_ =
      absl::ZeroDuration();
}

void StepTimeline::EnterCall() {
  if (depth_++ == 0) call_begin_ = Now();
}

void StepTimeline::ExitCall() {
  if (--depth_ > 0) return;
  const absl::Duration now = Now();
  // A call that began before the step boundary (Start is not bracketed, so
  // only Step's own tail) books from the boundary on.
  if (running_) engine_time_ += now - std::max(call_begin_, step_begin_);
}

void StepTimeline::AddCommWait(absl::Duration d) {
  if (Booking()) comm_wait_ += d;
}

void StepTimeline::AddOptimizer(absl::Duration d) {
  if (Booking()) optimizer_ += d;
}

absl::Duration StepTimeline::EngineTimeAt(absl::Duration now) const {
  if (depth_ == 0) return engine_time_;
  return engine_time_ + (now - std::max(call_begin_, step_begin_));
}

void StepTimeline::AddTrainerWait(absl::Duration d, absl::Duration* part) {
  if (!running_ || d <= absl::ZeroDuration()) return;
  const absl::Duration now = Now();
  // The time outside engine calls since the boundary that no earlier report
  // has claimed: a wait can only have happened there.
  const absl::Duration free_outside =
      (now - step_begin_) - EngineTimeAt(now) - input_wait_ - pipeline_wait_;
  const absl::Duration booked = std::min(d, std::max(absl::ZeroDuration(), free_outside));
  *part += booked;
  unplaced_wait_ += d - booked;
}

StepTimes StepTimeline::EndStep(absl::Duration comm_busy) {
  const absl::Duration now = Now();
  StepTimes t;
  const absl::Duration engine = EngineTimeAt(now);
  t.total = now - step_begin_;
  t.exposed_comm = comm_wait_;
  t.optimizer = optimizer_;
  t.engine_other = engine - comm_wait_ - optimizer_;
  t.input_wait = input_wait_;
  t.pipeline_bubble = pipeline_wait_;
  t.compute = t.total - engine - input_wait_ - pipeline_wait_;
  t.comm_busy = comm_busy;
  t.hidden_comm = std::max(absl::ZeroDuration(), comm_busy - comm_wait_);
  t.unplaced_wait = unplaced_wait_;
  // The next step begins at this instant; the open call (Step itself) books
  // its remaining time into it from here on.
  step_begin_ = now;
  engine_time_ = comm_wait_ = optimizer_ = input_wait_ = pipeline_wait_ = unplaced_wait_ =
      absl::ZeroDuration();
  return t;
}

}  // namespace zeroshard::internal
