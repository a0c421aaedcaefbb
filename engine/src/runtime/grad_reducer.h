// GradReducer: the gradients of a step, from the trainer's GradView to the
// reduced gradient the optimizer reads.
//
// It owns the staging slots (micro-batch gradients waiting for their
// reduction), the per-unit micro-batch counts and open views, and ONE queue
// of reductions in flight, in issue order:
//   - stages 0-1: one all-reduce (or reduce-scatter, stage 1) per unit and
//     step, of the gradient summed over the micro-batches, in place in the
//     gradient buffer; its entry holds no slot;
//   - stage 2: one reduce-scatter per unit and micro-batch from a staging
//     slot; the first writes straight into the gradient shard, later ones
//     reduce in place in the slot and are added to the shard when the slot
//     retires (retiring in issue order adds the micro-batches in order).
// The queue retires through one path, blocking (Drain, or GradView wanting
// a slot) or polling (Poll, after every ReduceGrads). When a unit's
// gradient is final (its last micro-batch reduced, and added), the
// final-gradient hook runs, exactly once per unit and step: the engine
// queues the unit's norm block sums there, so that they overlap the
// backward of the units before it.
#ifndef ZEROSHARD_RUNTIME_GRAD_REDUCER_H_
#define ZEROSHARD_RUNTIME_GRAD_REDUCER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/runtime/runtime_services.h"
#include "engine/src/runtime/shard_buffers.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

class GradReducer {
 public:
  // Runs when unit `unit`'s reduced gradient is final; an error fails the
  // call that retired the reduction.
  using FinalGradHook = std::function<absl::Status(int unit)>;

  // Every reference must outlive the reducer. `accum_steps`: micro-batches
  // per step (TrainSpec::grad_accum_steps).
  GradReducer(const ModelSpec& model, const FlatLayout& layout, const BufferPlan& plan, int rank,
              DType grad_dtype, int accum_steps, const ShardBuffers& buffers,
              RuntimeServices& services);
  // Waits for every reduction still in flight (peers may read our buffers).
  ~GradReducer();

  void set_final_grad_hook(FinalGradHook hook) { hook_ = std::move(hook); }

  // The memory the trainer writes unit `unit`'s gradient of the next
  // micro-batch into (in segment coordinates of the unit): the gradient
  // buffer itself (stages 0-1, first micro-batch) or a staging slot, whose
  // padding is zeroed. Waits for the oldest reduction when every slot is
  // busy. FailedPrecondition: a view already open, all micro-batches of the
  // step done, every slot held by an open view.
  absl::StatusOr<void*> OpenView(int unit);
  // Reduces the open view's gradient (asynchronously), then retires the
  // reductions that have completed. FailedPrecondition without a view.
  absl::Status Reduce(int unit);
  // Retires, without blocking, the reductions that have completed, in issue
  // order.
  absl::Status Poll();
  // Retires every reduction in flight, in issue order (WaitSite::kStepReductions).
  absl::Status Drain();
  // After Step: the next step's micro-batches begin.
  void BeginNextStep();

  int reduced_count(int unit) const { return reduced_count_[unit]; }
  bool view_open(int unit) const { return open_view_[unit] != kNoView; }
  int reductions_in_flight() const { return static_cast<int>(queue_.size()); }

 private:
  static constexpr int kNoView = -2;      // no view open for the unit
  static constexpr int kDirectView = -1;  // view into the gradient buffer itself

  // A reduction in flight.
  struct Reduction {
    int unit = -1;
    int slot = -1;  // the staging slot it reads (stage 2), -1 for none
    int micro = 0;  // the micro-batch it reduces
    CommHandle handle;
  };

  absl::StatusOr<int> AcquireSlot();
  // Finishes the oldest reduction: waits for it, adds a later micro-batch's
  // shard into the gradient shard (stage 2), frees its slot, and runs the
  // hook when it completed its unit's gradient.
  absl::Status RetireOldest(WaitSite site);
  absl::Status GradFinal(int unit);

  const ModelSpec& model_;
  const FlatLayout& layout_;
  const BufferPlan& plan_;
  int rank_;
  int world_;
  DType grad_dtype_;
  int accum_steps_;
  const ShardBuffers& buffers_;
  RuntimeServices& services_;
  FinalGradHook hook_;

  std::vector<int> reduced_count_;  // per unit: Reduce calls this step
  std::vector<int> open_view_;      // per unit: slot of an open view, kDirectView, kNoView
  std::deque<int> free_slots_;
  std::deque<Reduction> queue_;  // in issue order
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_GRAD_REDUCER_H_
