// StepTimeline: where one engine's step time goes (StepTimes in
// zeroshard/engine.h), booked so that the parts cannot overlap.
//
// Every instant comes from one monotonic clock. A step runs from its
// boundary (the end of Start(), or the instant the previous Step() ended the
// step) to the instant its own Step() ends it. Within a step:
//   engine time      wall time inside engine calls (an engine call made from
//                    another, e.g. Save's WaitForCheckpoint, counts once);
//   exposed comm     waits on collectives (WaitComm), always inside a call;
//   optimizer        Step()'s norm, clipping and update, less the comm waits
//                    inside it;
//   engine other     the rest of the engine time;
//   input wait,      reported by the trainer; a report books at most the time
//   pipeline bubble  outside engine calls since the boundary not already
//                    booked as a wait (the excess, e.g. a wait that began
//                    before the boundary or overlapped an engine call, goes
//                    to unplaced_wait);
//   compute          the rest of the time outside engine calls.
// Each is an interval count of the same clock, so every part is >= 0 and the
// six add up to total exactly (absl::Duration is an integer count).
// Nothing before BeginSteps() (SetParam, Load, Start's own exchanges, waits
// reported then) belongs to any step.
//
// Not thread-safe: the rank's thread only.
#ifndef ZEROSHARD_RUNTIME_STEP_TIMELINE_H_
#define ZEROSHARD_RUNTIME_STEP_TIMELINE_H_

#include "absl/time/time.h"
#include "zeroshard/engine.h"

namespace zeroshard::internal {

class StepTimeline {
 public:
  // A monotonic clock: the time since an arbitrary, fixed origin.
  using Clock = absl::Duration (*)();
  static absl::Duration SteadyNow();

  explicit StepTimeline(Clock clock = &SteadyNow) : clock_(clock) {}

  absl::Duration Now() const { return clock_(); }

  // The first step begins now; what was booked before is dropped.
  void BeginSteps();
  bool running() const { return running_; }

  // Brackets one engine call (see Call below). Calls nest; only the
  // outermost books its wall time.
  void EnterCall();
  void ExitCall();

  // A wait on a collective that took `d`, measured with Now() inside an
  // engine call. Outside a call or before BeginSteps it is not a step's.
  void AddCommWait(absl::Duration d);
  // Optimizer time (the caller has taken out the comm waits inside it),
  // measured with Now() inside an engine call.
  void AddOptimizer(absl::Duration d);
  // The running sum of this step's comm waits (to take them out of an
  // interval that contains some).
  absl::Duration comm_wait() const { return comm_wait_; }

  // Trainer-reported waits (RecordInputWait, RecordPipelineWait), clamped
  // as described above. Negative durations count as zero.
  void AddInputWait(absl::Duration d) { AddTrainerWait(d, &input_wait_); }
  void AddPipelineWait(absl::Duration d) { AddTrainerWait(d, &pipeline_wait_); }

  // Ends the step now (from inside Step(), an engine call) and begins the
  // next one at the same instant: the rest of the current call belongs to
  // the next step. `comm_busy` is copied into the result as is.
  StepTimes EndStep(absl::Duration comm_busy);

  // RAII bracket for one engine call.
  class Call {
   public:
    explicit Call(StepTimeline& timeline) : timeline_(timeline) { timeline_.EnterCall(); }
    ~Call() { timeline_.ExitCall(); }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    StepTimeline& timeline_;
  };

 private:
  void AddTrainerWait(absl::Duration d, absl::Duration* part);
  // Engine time of the current step so far, the open call's part included.
  absl::Duration EngineTimeAt(absl::Duration now) const;
  bool Booking() const { return running_ && depth_ > 0; }

  Clock clock_;
  bool running_ = false;
  int depth_ = 0;
  absl::Duration step_begin_;
  absl::Duration call_begin_;   // the outermost open call's start, or step_begin_ if later
  absl::Duration engine_time_;  // closed calls of this step
  absl::Duration comm_wait_;
  absl::Duration optimizer_;
  absl::Duration input_wait_;
  absl::Duration pipeline_wait_;
  absl::Duration unplaced_wait_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_STEP_TIMELINE_H_
