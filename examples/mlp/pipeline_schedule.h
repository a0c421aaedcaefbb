// The 1F1B pipeline schedule (PipeDream-Flush, Narayanan et al. 2021; the
// non-interleaved schedule of Megatron-LM) as data: which forward and
// backward passes each stage runs, in which order, for one optimizer step.
#ifndef ZEROSHARD_EXAMPLES_MLP_PIPELINE_SCHEDULE_H_
#define ZEROSHARD_EXAMPLES_MLP_PIPELINE_SCHEDULE_H_

#include <vector>

#include "absl/status/statusor.h"

namespace zeroshard {
namespace mlp {

enum class PipelineOpKind { kForward, kBackward };

// One pass of one micro-batch through this stage's units.
struct PipelineOp {
  PipelineOpKind kind = PipelineOpKind::kForward;
  int micro = 0;  // 0-based micro-batch of the step

  bool operator==(const PipelineOp& o) const { return kind == o.kind && micro == o.micro; }
};

// The ops stage `stage` of `stages` runs for `micro_batches` micro-batches:
//   warm-up:   min(stages - stage - 1, micro_batches) forwards,
//   steady:    one forward, one backward, until every forward is issued,
//   cool-down: the remaining backwards.
// Forwards and backwards each come in micro-batch order, every micro-batch
// has its forward before its backward, and at most stages - stage
// micro-batches are in flight (forward done, backward not) on the stage: the
// activation memory 1F1B bounds, unlike GPipe's all-forwards-first. Empty
// for arguments out of range (stages < 1, stage not in [0, stages),
// micro_batches < 1).
std::vector<PipelineOp> OneFOneBSchedule(int stages, int stage, int micro_batches);

// Runs the per-stage op lists of a pipeline in simulated time: an op starts
// when its stage is free and its input is there (a forward of micro-batch m
// on stage s > 0 after that forward on stage s - 1; a backward on stage
// s < stages - 1 after that backward on stage s + 1), and lasts forward_time
// or backward_time. Returns the makespan (the last op's end).
// FailedPrecondition when the lists deadlock (an op waits for one that can
// never run), naming the stage and op; InvalidArgument for an empty list
// or non-positive times.
absl::StatusOr<double> SimulatePipeline(const std::vector<std::vector<PipelineOp>>& stage_ops,
                                        double forward_time, double backward_time);

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_PIPELINE_SCHEDULE_H_
