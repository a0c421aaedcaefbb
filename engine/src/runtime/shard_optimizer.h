// ShardOptimizer: the update of this rank's owned range of every unit
// (fused Adam / AdamW), its per-group constants and its step count.
//
// The owned range is cut into UpdateRuns, runs of one param group (the
// params' lr_scale and weight decay, torch's param groups), merged where
// neighbours agree, so that one kernel call covers as much as it can. Each
// step derives the kernel constants once per distinct group and updates each
// run with its group's: the same single pass over memory as without groups.
// The update reads the gradients and writes the master, the moments and the
// params in place (ShardBuffers).
#ifndef ZEROSHARD_RUNTIME_SHARD_OPTIMIZER_H_
#define ZEROSHARD_RUNTIME_SHARD_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/src/device/device_ops.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/runtime/shard_buffers.h"
#include "kernels/common/adam_constants.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::internal {

// A param group as the spec gives it: the learning-rate scale and the
// weight decay (0 for no_decay params; nullopt: OptimizerSpec::weight_decay,
// resolved by ShardOptimizer).
struct ParamGroupSpec {
  double lr_scale = 1.0;
  std::optional<double> weight_decay;

  // The group of `param` (no_decay is a decay of 0).
  static ParamGroupSpec Of(const ParamSpec& param);
  bool operator==(const ParamGroupSpec& o) const {
    return lr_scale == o.lr_scale && weight_decay == o.weight_decay;
  }
  bool operator!=(const ParamGroupSpec& o) const { return !(*this == o); }
};

// A run of a rank's owned range with one param group.
struct UpdateRun {
  int unit = 0;
  ElementRange range;  // segment coordinates
  ParamGroupSpec group;
};

// The runs of `owned(u)` for every unit u, in unit then element order,
// covering each owned range exactly: each param's run also takes the
// alignment gap before it, the tail padding joins the last run (padding is
// zero, and an update leaves zeros zero whatever the group), and
// neighbouring runs of one unit and one group are merged. `model` is the
// ModelSpec `layout` was created from (each slot names the param it
// stores); frozen segments get no run.
std::vector<UpdateRun> BuildUpdateRuns(const FlatLayout& layout, const ModelSpec& model,
                                       const std::function<ElementRange(int)>& owned);

class ShardOptimizer {
 public:
  ShardOptimizer(const TrainSpec& train, std::vector<UpdateRun> runs);

  // One update of every run with the schedule's learning rate `lr`, times
  // the run's lr_scale, and the run's weight decay (AdamW: decoupled,
  // p *= 1 - lr * lr_scale * weight_decay; AdamL2: weight_decay * p added to
  // the gradient), the gradients multiplied by `grad_scale` first (the mean
  // over micro-batches and ranks, the loss scale and the clipping, in one
  // factor). Counts an applied step (Adam's bias correction) first.
  // Enqueued on `ops`' stream; the caller syncs before anything reads the
  // params.
  absl::Status Apply(const ShardBuffers& buffers, DeviceOps& ops, double grad_scale, double lr);

  // Apply in parts, for an update that streams the state (offload_optimizer.h):
  // BeginStep counts the step and derives the constants; then each run (or
  // piece of one: the update is element-wise) is one ops.Adam call with
  // variant() and run_constants(k), the same bits as Apply.
  void BeginStep(double grad_scale, double lr);
  AdamVariant variant() const;
  const kernels::AdamConstants& run_constants(size_t k) const { return constants_[run_group_[k]]; }
  bool mixed() const { return mixed_; }

  // Updates applied so far (skipped steps do not count); a checkpoint saves
  // and restores it.
  int64_t applied_steps() const { return applied_steps_; }
  void set_applied_steps(int64_t steps) { applied_steps_ = steps; }
  const std::vector<UpdateRun>& runs() const { return runs_; }
  // Replaces the runs (the params frozen by Engine::SetTrainable left out).
  void set_runs(std::vector<UpdateRun> runs);
  // The distinct (lr_scale, effective weight decay) pairs of the runs, in
  // increasing order: the kernel constants Apply derives per step.
  struct Group {
    double lr_scale;
    double weight_decay;
  };
  const std::vector<Group>& groups() const { return groups_; }

 private:
  // groups_ and run_group_ from runs_.
  void IndexGroups();

  OptimizerSpec spec_;
  DType param_dtype_;
  DType grad_dtype_;
  bool mixed_;
  std::vector<UpdateRun> runs_;
  std::vector<Group> groups_;
  std::vector<int> run_group_;                     // per run: its index in groups_
  std::vector<kernels::AdamConstants> constants_;  // per group, rebuilt each Apply
  int64_t applied_steps_ = 0;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_SHARD_OPTIMIZER_H_
