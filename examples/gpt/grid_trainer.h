// The GPT example on a dp x tp x pp process grid (docs/parallelism.md, "The
// GPT on the grid"): Megatron-LM tensor parallelism inside each block
// (internal/tensor_parallel_block.h) and over the vocabulary
// (internal/vocab_parallel.h), pipeline stages of whole units on the 1F1B
// schedule, and the engine's ZeRO sharding over the data-parallel ranks of
// each (tp, pp) position.
//
// The model as split (BuildGptGridModelSpec): BuildGptModelSpec's units and
// names, with
//   - wte (and the head) [V', C], V' = V padded to a multiple of tp, split
//     by rows; the padding rows are no token (zero, and they stay zero);
//   - the blocks' c_attn and c_fc column-parallel (c_attn: each rank the q,
//     k and v columns of its heads), attn.c_proj and mlp.c_proj
//     row-parallel, LayerNorms and the row-parallel biases whole;
//   - with pp > 1 the tie across stages: the first stage trains wte (one
//     fp32 master, one pair of moments) and the last stage holds the head as
//     a frozen replica of it (ParamSpec::trainable false). The first stage's
//     spec ends with an alias unit "lm_head" whose weight is tied to wte: per
//     micro-batch the last stage sends its head gradient to the first stage,
//     which hands it to the engine through that unit before the embedding's,
//     so that the engine sums the two uses exactly as one rank does. After
//     each step the first stage sends the updated wte to the last stage
//     (Engine::SetFrozenParam). The gradient norm counts the weight once.
//
// Data: the dp rank d takes the global micro-batches d M .. d M + M - 1 of
// the step (M = the engine's grad_accum_steps = A x tp x pp for a run
// whose dp-only equivalent accumulates A, as the MLP grid trainer), by
// FirstWindow(consumed, d, m, M, B): the global batch is that of a one-rank
// run accumulating dp x M micro-batches, in the same order. Every tp rank
// of a tp group, and the first and last stage, read the same windows.
#ifndef ZEROSHARD_EXAMPLES_GPT_GRID_TRAINER_H_
#define ZEROSHARD_EXAMPLES_GPT_GRID_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_trainer.h"
#include "examples/gpt/internal/gpt_math.h"
#include "examples/gpt/internal/vocab_parallel.h"
#include "examples/gpt/text_data.h"
#include "examples/mlp/pipeline_schedule.h"
#include "zeroshard/engine.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/process_grid.h"

namespace zeroshard {
namespace gpt {

// The whole model as the grid splits it (above): tp_split_dim set, wte and
// the head padded to V' rows, and with pp > 1 the head untied and frozen.
ModelSpec BuildGptGridModelSpec(const GptConfig& cfg, const GridShape& shape);

// The part of it that grid position `coord` holds (ShardModelSpec), the
// first stage's alias unit "lm_head" appended when pp > 1. InvalidArgument
// when tp does not divide the heads, or when there are more stages than
// units.
absl::StatusOr<ModelSpec> BuildGptShardModelSpec(const GptConfig& cfg, const GridShape& shape,
                                                 const GridCoord& coord);

// Full-model unit range [first, last) of each pipeline stage.
absl::StatusOr<std::vector<std::pair<int, int>>> GptStageUnits(const GptConfig& cfg,
                                                               const GridShape& shape);

// SetParam of every param of the shard engine with its share of
// InitialParam(cfg, ..., seed) (the padding rows zero), so that a grid run
// starts from the one-rank run's weights. Call before engine.Start().
absl::Status InitGptShardParams(Engine& engine, const GptConfig& cfg, const ProcessGrid& grid,
                                uint64_t seed);
// The same from any whole-model values: `whole_value(unit, param)` gives
// param `param` of unit `unit` of BuildGptModelSpec(cfg) whole (wte V rows;
// not called for the tied head). gpt_train --init-from passes a Hugging
// Face GPT-2's weights.
absl::Status SetGptShardParams(
    Engine& engine, const GptConfig& cfg, const ProcessGrid& grid,
    const std::function<std::vector<float>(int unit, int param)>& whole_value);

// The stored params of the whole model in BuildGptModelSpec's order (the
// tied head left out; wte V rows), fp32, on every rank: the stages' engines
// GetParam their units (over dp), the tp shares are all-gathered and
// joined, and each is broadcast from its stage over pp. Collective over the
// whole grid.
absl::StatusOr<std::vector<std::vector<float>>> GatherGptGridParams(Engine& engine,
                                                                    const GptConfig& cfg,
                                                                    ProcessGrid& grid);

// Where each param of `shard` = BuildGptShardModelSpec(cfg, shape, coord) lives in a
// checkpoint of the whole model (BuildGptModelSpec's: a one-rank or
// dp-only GptTrainer run's), for Engine::LoadSlices: wte and the head's
// replica rows of tp (the padding rows past V load as zeros), c_attn's q, k
// and v columns of this rank's heads, c_fc's columns, the projections'
// rows, the rest whole.
std::vector<std::vector<ParamOrigin>> GptParamOrigins(const ModelSpec& shard,
                                                      const GridShape& shape,
                                                      const GridCoord& coord);

// Trains this rank's shard. Not thread-safe: one trainer per rank thread.
// `engine` was created with BuildGptShardModelSpec(cfg, grid), grid.dp() as
// communicator and ModelParallelOptions{&grid.model_parallel(),
// grid.coord().tp == 0}, initialised and Start()ed; engine, grid and
// `train` outlive the trainer. fp32 math on the CPU (the engine's views of
// any precision are converted), every ZeRO stage.
class GridGptTrainer {
 public:
  // InvalidArgument when the engine's model is not this rank's shard, or
  // for a bad micro-batch / sequence length. With run.recompute each block keeps
  // only its input and runs its forward again in the backward (one block's
  // activations alive on the stage instead of every in-flight micro-batch's).
  static absl::StatusOr<std::unique_ptr<GridGptTrainer>> Create(const GptConfig& cfg,
                                                                const GptRunOptions& run,
                                                                Engine& engine, ProcessGrid& grid,
                                                                const WindowSampler* train);
  ~GridGptTrainer();

  // One optimizer step: the stage's 1F1B schedule over the engine's
  // grad_accum_steps micro-batches, engine.Step(), then (pp > 1) the
  // updated wte from the first stage to the last stage's replica. Returns
  // the mean micro-batch loss of the global batch, the same on every rank
  // (an all-reduce over grid.world(): every rank calls).
  absl::StatusOr<double> TrainStep();

  // Mean loss over the first `max_windows` validation windows, forward
  // only, as GptTrainer::ValLoss of the dp-only run of grid.world() ranks
  // counts them: the first W B floor(available / (W B)) windows, W =
  // world size, B the micro-batch. Each dp rank takes a contiguous share of
  // them as micro-batches that flow through the pipeline in order; every
  // rank returns the same value. FailedPrecondition when fewer than W B
  // windows exist. Collective over the grid.
  absl::StatusOr<double> ValLoss(const std::vector<uint8_t>& val, int64_t max_windows);

  // The logits [B, T, V] of `tokens` [B, T] (B the micro-batch), forward
  // only, on every rank (the tp ranks' columns gathered, broadcast from the
  // last stage). Collective over the grid. InvalidArgument for a wrong size
  // or a token outside the vocabulary.
  absl::StatusOr<std::vector<float>> Logits(const std::vector<int32_t>& tokens);

  // pp > 1: whether the head the last stage computes with (its gathered
  // view) has the bits of the first stage's wte (GetParam) in every
  // element; true on every rank when so. Collective over the grid. With
  // pp == 1 the engine stores the tie once: true.
  absl::StatusOr<bool> TieHolds();

  // Saves one checkpoint of the whole model (BuildGptModelSpec's, an
  // ordinary checkpoint: Load, LoadSlices onto any grid, inspect and export
  // read it) with `trainer_state`: Engine::SaveSlices over grid.world().
  // Collective over the grid; WaitForCheckpoint (on every rank) commits a
  // background save.
  absl::Status Save(const std::string& dir, const std::string& trainer_state,
                    const CheckpointOptions& options = {});

  int64_t windows_consumed() const { return consumed_; }
  void set_windows_consumed(int64_t n) { consumed_ = n; }
  const StepResult& last_step() const { return last_step_; }
  const std::vector<mlp::PipelineOp>& schedule() const { return schedule_; }

 private:
  struct Slot;
  enum class Kind { kEmbed, kBlock, kFinalNorm, kHead };

  GridGptTrainer(const GptConfig& cfg, const GptRunOptions& run, Engine& engine, ProcessGrid& grid,
                 const WindowSampler* train, int first_unit, int num_units);
  absl::Status Allocate();
  Kind KindOf(int local) const;
  // Where block `local`'s activations live for `slot`.
  float* BlockActsOf(Slot& slot, int local);
  absl::Status Forward(int micro, double* loss_sum);
  absl::Status Backward(int micro);
  absl::Status ForwardUnit(Slot& slot, int local, const float* const* p);
  absl::Status BackwardUnit(Slot& slot, int local, const float* const* p, float** dy, float** dx);
  absl::Status HandTieGradient(int micro);
  absl::Status SendUpdatedEmbedding();
  void IssueRecvs();
  absl::Status WaitPipeline(CommHandle& handle);
  absl::StatusOr<const float* const*> ParamsAsFp32(int local, const UnitView& view);

  GptConfig cfg_;
  GptRunOptions run_;
  internal::GptDims d_;
  Engine& engine_;
  ProcessGrid& grid_;
  const WindowSampler* train_;
  int first_unit_;  // full-model index of this stage's first unit
  int num_units_;   // the stage's units (the alias unit not counted)
  int micro_batches_;
  int tp_;
  bool first_stage_;
  bool last_stage_;
  bool tie_across_;  // pp > 1: the tie crosses stages
  internal::VocabShard vocab_;
  int64_t consumed_ = 0;
  StepResult last_step_;
  std::vector<mlp::PipelineOp> schedule_;
  std::vector<std::vector<int64_t>> unit_sizes_;  // per local unit (the alias included)
  std::vector<const float*> param_ptrs_;
  std::vector<float*> grad_ptrs_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int forward_recvs_ = 0;
  int backward_recvs_ = 0;
  int backwards_done_ = 0;
  int tie_recvs_ = 0;
  bool logits_only_ = false;  // Logits: the head leaves the cross-entropy out  // first stage:
                              // tie-gradient Recvs issued this step
  std::vector<float> param_copy_, grads_, scratch_, grad_a_, grad_b_;
  std::vector<float> recompute_acts_;  // run.recompute: one block's activations
  // The tie's head gradients in flight (two buffers each way).
  std::vector<std::vector<float>> tie_bufs_;
  std::vector<CommHandle> tie_handles_;
};

}  // namespace gpt
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_GPT_GRID_TRAINER_H_
