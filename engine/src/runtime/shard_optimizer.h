// ShardOptimizer: the update of this rank's owned range of every unit
// (fused Adam / AdamW), its per-run constants and its step count.
//
// The owned range is cut into DecayRuns, runs with one weight-decay setting
// (params marked no_decay get none), merged where neighbours agree, so that
// one kernel call covers as much as it can. The update reads the gradients
// and writes the master, the moments and the params in place (ShardBuffers).
#ifndef ZEROSHARD_RUNTIME_SHARD_OPTIMIZER_H_
#define ZEROSHARD_RUNTIME_SHARD_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "engine/src/device/device_ops.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/runtime/shard_buffers.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::internal {

// A run of a rank's owned range with one weight-decay setting.
struct DecayRun {
  int unit = 0;
  ElementRange range;  // segment coordinates
  bool decay = true;
};

// The runs of `owned(u)` for every unit u, in unit then element order,
// covering each owned range exactly: each param's run also takes the
// alignment gap before it, the tail padding joins the last run (padding is
// zero, so its decay is moot), and neighbouring runs of one unit and one
// setting are merged.
std::vector<DecayRun> BuildDecayRuns(const FlatLayout& layout, const ModelSpec& model,
                                     const std::function<ElementRange(int)>& owned);

class ShardOptimizer {
 public:
  ShardOptimizer(const TrainSpec& train, std::vector<DecayRun> runs);

  // One update of every run with learning rate `lr`, the gradients
  // multiplied by `grad_scale` first (the mean over micro-batches and ranks,
  // the loss scale and the clipping, in one factor). Counts an applied step
  // (Adam's bias correction) first. Enqueued on `ops`' stream; the caller
  // syncs before anything reads the params.
  absl::Status Apply(const ShardBuffers& buffers, DeviceOps& ops, double grad_scale, double lr);

  // Updates applied so far (skipped steps do not count); a checkpoint saves
  // and restores it.
  int64_t applied_steps() const { return applied_steps_; }
  void set_applied_steps(int64_t steps) { applied_steps_ = steps; }
  const std::vector<DecayRun>& runs() const { return runs_; }
  // Replaces the runs (the params frozen by Engine::SetTrainable left out).
  void set_runs(std::vector<DecayRun> runs) { runs_ = std::move(runs); }

 private:
  OptimizerSpec spec_;
  DType param_dtype_;
  DType grad_dtype_;
  bool mixed_;
  std::vector<DecayRun> runs_;
  int64_t applied_steps_ = 0;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_SHARD_OPTIMIZER_H_
