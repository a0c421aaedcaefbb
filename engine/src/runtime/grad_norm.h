// GradNorm: this rank's part of the global gradient norm, exactly.
//
// Every rank sums squares over its shard of every unit, whatever the stage,
// so each element is counted once; block sums (kernels/cpu/norm.h) and an
// exact integer accumulator make the sum independent of the shard
// boundaries and of the order of units and ranks. Without model
// parallelism each unit's block sums are enqueued on the compute stream as
// soon as its gradient is final (OnGradFinal, GradReducer's hook), into the
// unit's own part of norm_blocks, and LocalSum waits once and adds them
// all. With model parallelism a unit's segment may be cut into runs that
// count in this rank's norm and runs that do not (replicated params, when
// count_replicated is false; their non-finite values still count), so the
// sums are taken in LocalSum, run by run; AddModelParallel then adds the
// group's sums.
#ifndef ZEROSHARD_RUNTIME_GRAD_NORM_H_
#define ZEROSHARD_RUNTIME_GRAD_NORM_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/runtime/runtime_services.h"
#include "engine/src/runtime/shard_buffers.h"
#include "kernels/cpu/norm.h"
#include "zeroshard/engine.h"

namespace zeroshard::internal {

class GradNorm {
 public:
  // `host_accessible`: the device's memory is host memory (else the block
  // sums are copied to the host). Every reference must outlive the norm.
  GradNorm(const FlatLayout& layout, int rank, DType grad_dtype, bool host_accessible,
           const ShardBuffers& buffers, RuntimeServices& services);

  // Model parallelism (Engine::Create with ModelParallelOptions): the
  // group AddModelParallel sums over, and without count_replicated the
  // runs of `model`'s replicated params (tp_split_dim < 0) left out of this
  // rank's sum.
  void SetModelParallel(const ModelSpec& model, const ModelParallelOptions& parallel);

  // The final-gradient hook: unit `unit`'s reduced gradient (this rank's
  // shard) is final; once per unit and step.
  absl::Status OnGradFinal(int unit);
  // This rank's exact sum of squares (normalized; the non-finite count in
  // its last limb). InternalError when a unit's gradient was not final.
  absl::StatusOr<kernels::ExactSum> LocalSum();
  // With model parallelism, adds the group's sums into `total` (one int64
  // all-reduce, WaitSite::kModelParallel); nothing without.
  absl::Status AddModelParallel(kernels::ExactSum& total);
  // After Step: no unit's gradient is final.
  void BeginNextStep() { units_final_ = 0; }

 private:
  // A run of a unit's segment that counts in this rank's norm, or not.
  struct NormRange {
    ElementRange range;  // segment coordinates
    bool counted = true;
  };
  // See the file comment: enqueue at OnGradFinal, or sum run by run.
  bool EarlyNorm() const { return norm_ranges_.empty(); }
  // The block sums in host memory, `blocks` long (a copy when the device's
  // memory is not host memory), after the compute stream finished them.
  absl::StatusOr<const double*> BlocksOnHost(int64_t blocks);
  // Adds the squares of this rank's shard of unit `u` to `sum`, block by
  // block; of its runs that do not count only the number of non-finite
  // values.
  absl::Status AddShardSquares(int u, kernels::ExactSum& sum);

  const FlatLayout& layout_;
  int rank_;
  DType grad_dtype_;
  bool host_accessible_;
  const ShardBuffers& buffers_;
  RuntimeServices& services_;
  std::vector<double> host_blocks_;  // when norm_blocks is not host memory
  int trainable_segments_ = 0;       // the layout's (frozen ones have no gradient)
  int units_final_ = 0;              // this step's OnGradFinal calls
  Communicator* model_parallel_ = nullptr;
  // Per unit (model parallelism only): its runs; empty for a unit whose
  // elements all count.
  std::vector<std::vector<NormRange>> norm_ranges_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_GRAD_NORM_H_
