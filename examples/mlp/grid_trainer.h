// The residual-MLP trainer on a dp x tp x pp process grid
// (docs/parallelism.md, "The trainer and the 1F1B schedule"): tensor
// parallelism inside each block (Megatron-LM's column-parallel W1,
// row-parallel W2), pipeline stages of whole blocks run on the 1F1B
// schedule, and the engine's ZeRO sharding over the data-parallel ranks of
// each (tp, pp) shard.
//
// Data convention (the planner's, PlanOptions::grad_accum_steps): a run of
// `world` ranks with grad_accum_steps A on a grid of tp x pp runs
// A x tp x pp micro-batches per data-parallel rank per step, so the global
// batch (world x A micro-batches) is that of a dp-only run of the same world
// and of a one-rank run with accumulation world x A. The dp rank d takes
// global micro-batches d*M .. d*M + M - 1 (M = A x tp x pp, the engine's
// grad_accum_steps): DistributedSampler(cfg, dp, d, M). Every tp rank of a
// tp group sees the same micro-batches; the first stage draws the inputs,
// the last stage the targets (the sampler is a pure function of the seeds).
#ifndef ZEROSHARD_EXAMPLES_MLP_GRID_TRAINER_H_
#define ZEROSHARD_EXAMPLES_MLP_GRID_TRAINER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/mlp/data_loader.h"
#include "examples/mlp/internal/block_math.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/pipeline_schedule.h"
#include "zeroshard/communicator.h"
#include "zeroshard/engine.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/process_grid.h"

namespace zeroshard {
namespace mlp {

// Micro-batches per data-parallel rank per step on `shape` for a run whose
// dp-only equivalent accumulates `accum` per rank: accum x tp x pp (the
// engine's TrainSpec::grad_accum_steps on the grid).
inline int GridMicroBatches(int accum, const GridShape& shape) {
  return accum * shape.tp * shape.pp;
}

// The part of BuildModelSpec(cfg) that grid position `coord` holds
// (ShardModelSpec). Errors: ShardModelSpec's (4 * hidden or hidden not
// divisible by tp, more stages than blocks).
absl::StatusOr<ModelSpec> BuildShardModelSpec(const MlpConfig& cfg, const GridShape& shape,
                                              const GridCoord& coord);

// The slice of a full tensor of spec `param` that tp rank `tp_rank` of `tp`
// holds: dimension param.tp_split_dim divided into tp equal parts (row-major
// order kept), the whole tensor for a replicated param or tp == 1. The
// caller guarantees the sizes (ShardModelSpec checked them).
std::vector<float> SliceForTensorParallel(const ParamSpec& param, const std::vector<float>& full,
                                          int tp, int tp_rank);
// The inverse: the full tensor from its tp slices concatenated in tp order
// (an all-gather's result). A replicated param: the first slice.
std::vector<float> JoinTensorParallel(const ParamSpec& param, const std::vector<float>& slices,
                                      int tp);

// SetParam of every param of the shard engine with its slice of
// InitialParam, so that a grid run starts from the one-rank run's weights.
// Call before engine.Start(). Errors: the engine's; InvalidArgument when the
// engine's model is not BuildShardModelSpec(cfg, grid).
absl::Status InitShardEngineParams(Engine& engine, const MlpConfig& cfg, const ProcessGrid& grid);

// The full fp32 weights of the model, [unit * 4 + param] like
// RunResult::params, on every rank: each stage's engines GetParam their
// units (over dp), the tp slices are all-gathered and joined, and each
// unit is broadcast from its stage over pp. Collective over the whole grid.
absl::StatusOr<std::vector<std::vector<float>>> GatherGridParams(Engine& engine,
                                                                 const MlpConfig& cfg,
                                                                 ProcessGrid& grid);

// Trains this rank's shard. Not thread-safe: one trainer per rank thread.
// `engine` must have been created with BuildShardModelSpec(cfg, grid),
// grid.dp() as communicator and ModelParallelOptions{&grid.model_parallel(),
// grid.coord().tp == 0}, initialised and Start()ed; engine and grid must
// outlive the trainer. Every ZeRO stage and fp32 / bf16 / fp16 views.
class GridMlpTrainer {
 public:
  // InvalidArgument when the engine's model is not this rank's shard.
  static absl::StatusOr<std::unique_ptr<GridMlpTrainer>> Create(const MlpConfig& cfg,
                                                                Engine& engine, ProcessGrid& grid);
  ~GridMlpTrainer();

  // One optimizer step: the stage's 1F1B schedule over the engine's
  // grad_accum_steps micro-batches, then engine.Step(). A forward is, per
  // unit of the stage, Gather, the first half of the block, the tp
  // all-reduce of the partial output, the second half, Release; a backward
  // the same in reverse with GradView / ReduceGrads. Activations go to the
  // next stage and their gradients to the previous one by Send on
  // grid.pp(); the Recv for the next op is issued as soon as its buffer is
  // free, and the time spent waiting for one goes to
  // engine.RecordPipelineWait. The loss is computed on the last stage (its
  // backward seed scaled by engine.loss_scale()); the returned value is the
  // mean micro-batch loss of the global batch, the same on every rank (an
  // all-reduce over grid.world(): every rank must call). Errors: the
  // engine's or the communicators'.
  absl::StatusOr<double> TrainStep();

  const StepResult& last_step() const { return last_step_; }
  int64_t step() const { return engine_.steps(); }
  // This stage's schedule for one step.
  const std::vector<PipelineOp>& schedule() const { return schedule_; }

 private:
  // The buffers of one micro-batch in flight on this stage.
  struct Slot;

  GridMlpTrainer(const MlpConfig& cfg, Engine& engine, ProcessGrid& grid, int first_unit,
                 int num_units);

  absl::Status Forward(int micro, float loss_scale, double* loss_sum);
  absl::Status Backward(int micro);
  // Issues every Recv whose buffer is free, in op order.
  void IssueRecvs();
  // Waits for a point-to-point handle; the time goes to the pipeline bubble.
  absl::Status WaitPipeline(CommHandle& handle);
  // Sums `data` (batch x hidden floats) over the tp group, in place.
  absl::Status TensorParallelSum(float* data);

  MlpConfig cfg_;
  Engine& engine_;
  ProcessGrid& grid_;
  int first_unit_;  // global index of this stage's first block
  int num_units_;
  int64_t inner_;  // 4h / tp
  int micro_batches_;
  bool first_stage_;
  bool last_stage_;
  std::unique_ptr<MicroBatchLoader> loader_;  // first and last stage: they read data
  std::vector<PipelineOp> schedule_;
  std::vector<int64_t> param_sizes_;  // one shard unit's params, in BlockParam order
  std::vector<std::unique_ptr<Slot>> slots_;
  // Per step: Recvs issued and backwards done, per kind, in micro order.
  int forward_recvs_ = 0;
  int backward_recvs_ = 0;
  int backwards_done_ = 0;
  StepResult last_step_;
  std::vector<float> work_a_, work_b_, scratch_, weight_copy_, grads_;
};

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_GRID_TRAINER_H_
