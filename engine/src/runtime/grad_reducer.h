// GradReducer: the gradients of a step, from the trainer's GradView to the
// reduced gradient the optimizer reads.
//
// The trainer opens and reduces the gradient of a ModelSpec unit; the
// reducer works on the layout's trainable storage segments (flat_layout.h)
// the unit writes: its own trainable params' segment and the tied params'
// segments it uses (frozen segments have no gradient). A tied segment has
// several uses per micro-batch (the units that write it): the first use's
// view is the micro-batch's gradient itself, later uses' views are staging
// slots added to it at their ReduceGrads, in call order, and the micro-batch
// gradient is complete after the last use; a segment with one use is
// complete at its ReduceGrads.
//
// It owns the staging slots (micro-batch gradients waiting for their
// reduction), the per-unit and per-segment counts and open views, and ONE
// queue of reductions in flight, in issue order:
//   - stages 0-1: one all-reduce (or reduce-scatter, stage 1) per segment
//     and step, of the gradient summed over the micro-batches, in place in
//     the gradient buffer; its entry holds no slot;
//   - stage 2: one reduce-scatter per segment and micro-batch from a staging
//     slot (or a tied segment's accumulator); the first writes straight into
//     the gradient shard, later ones reduce in place and are added to the
//     shard when the entry retires (retiring in issue order adds the
//     micro-batches in order). With qgZ (plan.quantized_grad_bits) the
//     reduce-scatter is a QuantizedReduceScatter, quantized at issue and run
//     to its end on the reducer's QuantizedReduceWorker, holding a scratch
//     slot of kGradQuantBuffer until it retires.
// The queue retires through one path, blocking (Drain, or GradView wanting
// a slot) or polling (Poll, after every ReduceGrads). When a segment's
// gradient is final (its last micro-batch reduced, and added), the
// final-gradient hook runs, exactly once per segment and step: the engine
// queues the segment's norm block sums there, so that they overlap the
// backward of the units before it.
#ifndef ZEROSHARD_RUNTIME_GRAD_REDUCER_H_
#define ZEROSHARD_RUNTIME_GRAD_REDUCER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/runtime/quantized_reduce_scatter.h"
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

  // Whether spec unit `unit` writes a gradient (it uses a trainable
  // segment); a unit of frozen params only has no view.
  bool HasGrads(int unit) const { return !grad_segments_[unit].empty(); }
  // The memory the trainer writes unit `unit`'s gradient of the next
  // micro-batch into: per segment of layout.SegmentsOf(unit), in segment
  // coordinates, nullptr for a frozen one: the gradient buffer itself
  // (stages 0-1, first micro-batch), a staging slot or a tied segment's
  // accumulator, whose padding is zeroed. Waits for the oldest reduction
  // when every slot is busy. FailedPrecondition: a view already open, all
  // micro-batches of the step done, a tied segment's view open through
  // another unit, every slot held by an open view, a unit without grads.
  absl::StatusOr<std::vector<void*>> OpenView(int unit);
  // Adds or reduces the open view's gradient (asynchronously), then retires
  // the reductions that have completed. FailedPrecondition without a view.
  absl::Status Reduce(int unit);
  // Retires, without blocking, the reductions that have completed, in issue
  // order.
  absl::Status Poll();
  // Retires every reduction in flight, in issue order (WaitSite::kStepReductions).
  absl::Status Drain();
  // After Step: the next step's micro-batches begin.
  void BeginNextStep();

  int reduced_count(int unit) const { return reduced_count_[unit]; }
  bool view_open(int unit) const { return !open_view_[unit].empty(); }
  int reductions_in_flight() const { return static_cast<int>(queue_.size()); }

 private:
  static constexpr int kDirectView = -1;  // view into the gradient buffer itself
  static constexpr int kAccumView = -3;   // a tied segment's accumulator

  // One segment's view of an open unit view.
  struct SegmentView {
    int segment = -1;
    int slot = kDirectView;  // a staging slot, kDirectView or kAccumView
  };
  // A reduction in flight.
  struct Reduction {
    int unit = -1;  // the segment
    int slot = -1;  // the staging slot it reads (stage 2), kAccumView, -1 for none
    int micro = 0;  // the micro-batch it reduces
    CommHandle handle;
    int quant_slot = -1;  // qgZ: its scratch slot
  };

  absl::StatusOr<int> AcquireSlot();
  // qgZ: a free scratch slot, retiring the oldest reduction when none is.
  absl::StatusOr<int> AcquireQuantSlot();
  absl::StatusOr<SegmentView> OpenSegment(int segment);
  absl::Status ReduceSegment(const SegmentView& view);
  // The micro-batch gradient of segment `segment` is complete in `data`
  // (view kind `slot`; `added_on_compute`: the compute stream still adds
  // into it): accumulate or reduce it.
  absl::Status MicroComplete(int segment, int micro, int slot, void* data, bool added_on_compute);
  void* ViewData(int segment, int slot) const;
  // Finishes the oldest reduction: waits for it, adds a later micro-batch's
  // shard into the gradient shard (stage 2), frees its slot, and runs the
  // hook when it completed its segment's gradient.
  absl::Status RetireOldest(WaitSite site);
  absl::Status GradFinal(int segment);

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

  std::vector<std::vector<int>> grad_segments_;      // per spec unit: trainable segments it writes
  std::vector<int> reduced_count_;                   // per spec unit: Reduce calls this step
  std::vector<std::vector<SegmentView>> open_view_;  // per spec unit: its open view, or empty
  std::vector<int> uses_;           // per segment: users per micro-batch (0 when frozen)
  std::vector<int> contributions_;  // per segment: Reduce calls of its users this step
  std::vector<int> open_use_;       // per segment: the unit whose view is open on it, -1
  std::vector<char> accum_busy_;    // per segment: a stage-2 reduction reads its accumulator
  std::deque<int> free_slots_;
  int quant_ranks_per_node_ = 1;  // qgZ's hierarchy (QgzRanksPerNode)
  std::deque<int> free_quant_slots_;
  std::unique_ptr<QuantizedReduceWorker> quant_worker_;
  std::deque<Reduction> queue_;  // in issue order
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_GRAD_REDUCER_H_
