#include "examples/mlp/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zeroshard {
namespace mlp {

std::vector<PipelineOp> OneFOneBSchedule(int stages, int stage, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) return {};
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineOp> ops;
  ops.reserve(2 * static_cast<size_t>(micro_batches));
  int next_forward = 0;
  int next_backward = 0;
  for (; next_forward < warmup; ++next_forward) {
    ops.push_back({PipelineOpKind::kForward, next_forward});
  }
  // Steady state: the forward that enters the pipeline, then the backward of
  // the oldest micro-batch in flight, which frees its activations.
  for (; next_forward < micro_batches; ++next_forward, ++next_backward) {
    ops.push_back({PipelineOpKind::kForward, next_forward});
    ops.push_back({PipelineOpKind::kBackward, next_backward});
  }
  for (; next_backward < micro_batches; ++next_backward) {
    ops.push_back({PipelineOpKind::kBackward, next_backward});
  }
  return ops;
}

absl::StatusOr<double> SimulatePipeline(const std::vector<std::vector<PipelineOp>>& stage_ops,
                                        double forward_time, double backward_time) {
  const int stages = static_cast<int>(stage_ops.size());
  if (stages == 0) return absl::InvalidArgumentError("SimulatePipeline: no stages");
  if (!(forward_time > 0) || !(backward_time > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("SimulatePipeline: op times must be > 0, got ",
                                                   forward_time, " and ", backward_time));
  }
  // End time of (stage, kind, micro) once it has run.
  std::map<std::tuple<int, int, int>, double> done;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0.0);
  size_t remaining = 0;
  for (const auto& ops : stage_ops) remaining += ops.size();
  double makespan = 0.0;
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < stages; ++s) {
      // Run this stage's ops in its order for as long as their inputs are known.
      while (next[s] < stage_ops[s].size()) {
        const PipelineOp& op = stage_ops[s][next[s]];
        const bool forward = op.kind == PipelineOpKind::kForward;
        const int source = forward ? s - 1 : s + 1;
        double ready = 0.0;
        if (source >= 0 && source < stages) {
          const auto it = done.find({source, forward ? 0 : 1, op.micro});
          if (it == done.end()) break;
          ready = it->second;
        }
        const double end = std::max(ready, free_at[s]) + (forward ? forward_time : backward_time);
        free_at[s] = end;
        done[{s, forward ? 0 : 1, op.micro}] = end;
        makespan = std::max(makespan, end);
        ++next[s];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      for (int s = 0; s < stages; ++s) {
        if (next[s] < stage_ops[s].size()) {
          const PipelineOp& op = stage_ops[s][next[s]];
          return absl::FailedPreconditionError(
              absl::StrCat("SimulatePipeline: deadlock: stage ", s, " waits at op ", next[s], " (",
                           op.kind == PipelineOpKind::kForward ? "forward" : "backward",
                           " of micro-batch ", op.micro, ") for an op that never runs"));
        }
      }
    }
  }
  return makespan;
}

}  // namespace mlp
}  // namespace zeroshard
