// A residual-MLP trainer that embeds the zeroshard engine through its public
// API only: the first example of how a trainer drives Gather / GradView /
// ReduceGrads / Release / Step.
//
// Model: `blocks` residual blocks on hidden size h,
//   y = x + W2 gelu(W1 x + b1) + b2   (exact, erf-based GELU),
// W1 [4h, h], b1 [4h], W2 [h, 4h], b2 [h]; block i is unit "block.<i>" of the
// ModelSpec with params "w1", "b1", "w2", "b2" (biases no_decay).
// Task: regress onto a fixed random teacher of the same architecture (own
// seed, never trained) applied to inputs x ~ N(0, 1); loss is the MSE over all
// output elements of a micro-batch.
//
// Variants (MlpConfig; the default is the regression model above):
// - vocab > 0, a tiny language model over `vocab` tokens: unit "embed"
//   (param "weight" [V, h], no_decay) before the blocks, unit "head" after
//   them with "weight" tied to embed.weight (ParamSpec::tied_to) and "bias"
//   [V] (no_decay); logits = blocks(E[token]) E^T + bias, mean cross-entropy
//   against the next token a fixed random teacher LM (teacher_seed, same
//   shape) predicts: the argmax of its logits over the tokens other than the
//   input token (internal/lm_math.h).
// - lora_rank R > 0: every block's w1, b1, w2, b2 frozen (trainable = false)
//   and four trainable adapters per block, lora_a1 [R, h], lora_b1 [4h, R],
//   lora_a2 [R, 4h], lora_b2 [h, R] (internal/lora_math.h); with vocab the
//   embedding and head are frozen too (all-frozen units).
#ifndef ZEROSHARD_EXAMPLES_MLP_MLP_H_
#define ZEROSHARD_EXAMPLES_MLP_MLP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/mlp/internal/block_math.h"
#include "zeroshard/communicator.h"
#include "zeroshard/engine.h"
#include "zeroshard/model_spec.h"

namespace zeroshard {
namespace mlp {

struct MlpConfig {
  int64_t hidden = 128;
  int blocks = 4;
  int micro_batch = 16;       // samples per micro-batch
  uint64_t init_seed = 1;     // the trained model's initial weights
  uint64_t teacher_seed = 2;  // the fixed teacher's weights
  uint64_t data_seed = 3;     // the inputs

  // The language-model mode (mlp_demo --vocab): tokens in [0, vocab); 0 =
  // the regression model.
  int64_t vocab = 0;
  // LoRA (mlp_demo --lora): adapter rank, 0 = none; W_eff = W + (alpha / R)
  // B A with alpha = lora_alpha (0: alpha = R, a scale of 1).
  int lora_rank = 0;
  double lora_alpha = 0.0;
  // The adapters' param group: lr_scale, and their own decoupled weight
  // decay (unset: the optimizer's weight_decay). ParamSpec::lr_scale and
  // ParamSpec::weight_decay.
  double adapter_lr_scale = 1.0;
  std::optional<double> adapter_weight_decay;
  // The trainer's activation checkpointing (mlp_demo --recompute): the
  // forward keeps only each block's input; the backward recomputes the
  // block's forward before its backward. Same bits, less memory. Changes
  // nothing in the ModelSpec.
  bool recompute = false;

  bool lm() const { return vocab > 0; }
  bool lora() const { return lora_rank > 0; }
  // alpha / R (1 without LoRA).
  float LoraScale() const;

  // hidden, blocks and micro_batch positive, vocab >= 0 (and below 2^24),
  // lora_rank in [0, hidden] (the adapted matrices' rank), lora_alpha, adapter_lr_scale and
  // adapter_weight_decay finite and >= 0; InvalidArgument naming the field.
  absl::Status Validate() const;
};

// OK for the regression model; Unimplemented naming `who` and the variant
// (vocab, lora_rank, recompute) otherwise: for the trainers that run the
// regression model only (GridMlpTrainer, gpu::CudaMlpTrainer).
absl::Status CheckRegressionModelOnly(const MlpConfig& cfg, const char* who);

// A config of the given shape, the seeds at their defaults.
inline MlpConfig MlpShape(int64_t hidden, int blocks, int micro_batch) {
  MlpConfig cfg;
  cfg.hidden = hidden;
  cfg.blocks = blocks;
  cfg.micro_batch = micro_batch;
  return cfg;
}

// Indices of a block's params within its unit, in ModelSpec order; with
// LoRA the four adapters follow the base params.
enum BlockParam : int { kW1 = 0, kB1 = 1, kW2 = 2, kB2 = 3, kNumBlockParams = 4 };
enum LoraParam : int {
  kLoraA1 = 4,
  kLoraB1 = 5,
  kLoraA2 = 6,
  kLoraB2 = 7,
  kNumLoraBlockParams = 8
};
// The language-model mode's units: "embed" (unit 0) and "head" (the last).
enum EmbedParam : int { kEmbedWeight = 0 };
enum HeadParam : int { kHeadWeight = 0, kHeadBias = 1 };

// Units of the model: the blocks, plus embed and head in the LM mode.
inline int NumUnits(const MlpConfig& cfg) { return cfg.blocks + (cfg.lm() ? 2 : 0); }
// The unit index of block `block`.
inline int BlockUnit(const MlpConfig& cfg, int block) { return block + (cfg.lm() ? 1 : 0); }
// The LM mode's embedding and head units.
inline int EmbedUnit() { return 0; }
inline int HeadUnit(const MlpConfig& cfg) { return cfg.blocks + 1; }

// One unit per block, named "block.<i>", params w1, b1, w2, b2, with
// Megatron's tensor-parallel split (ParamSpec::tp_split_dim): w1 and b1 by
// rows (column-parallel, 0), w2 by columns (row-parallel, 1), b2 replicated.
// With LoRA the base params are frozen and the adapters follow them (lr_scale
// and weight_decay from the config); with vocab, "embed" comes first and
// "head" last (see the top of this file).
ModelSpec BuildModelSpec(const MlpConfig& cfg);

// Deterministic initial value of param `param` of unit `unit` (the ModelSpec's
// index: block i is unit BlockUnit(cfg, i)), drawn from a counter-based
// generator keyed by cfg.init_seed: block weights N(0, 1/fan_in) (std
// 1/sqrt(fan_in)), biases N(0, 0.02^2), the embedding N(0, 1/h) (rows of
// norm about 1), the LoRA A factors N(0, 1/in) and the B factors 0 (LoRA's
// init: the adapted model starts as the base model). The tied head weight
// has the embedding's values (it is the same tensor). A block's values do
// not depend on the mode (keyed by the block's index). Empty when unit or
// param is out of range.
std::vector<float> InitialParam(const MlpConfig& cfg, int unit, int param);

// The same distribution under another seed (the teacher uses teacher_seed).
std::vector<float> RandomParam(const MlpConfig& cfg, uint64_t seed, int unit, int param);

// What every rank of an MLP run must share beyond what the engine checks
// itself (the model spec and initial weights): the micro-batch size and the
// teacher and data seeds. Pass them to Engine::Start so that a rank started
// with another --micro-batch or seed is refused by name.
std::vector<TrainerSetting> TrainerSettings(const MlpConfig& cfg);

// The BLAS the CPU trainer's products run on, for reports: the one line of
// examples::CpuBlasDescription() (library, kernel path, whether OpenBLAS
// detected it, the user forced it with OPENBLAS_CORETYPE or zeroshard chose
// it, the CPU, and a warning on a path slower than the CPU allows). The core
// picks the sgemm kernels: the compute time and, within a process, the bits.
std::string BlasDescription();

// SetParam for every param of every unit with InitialParam (a tied alias is
// set through its owner). Call before engine.Start(). Errors: the engine's (e.g. a ModelSpec that
// is not BuildModelSpec(cfg)).
absl::Status InitEngineParams(Engine& engine, const MlpConfig& cfg);

// The engine of an MLP run on this rank, ready to Start(): Engine::Create
// with BuildModelSpec(cfg), then InitEngineParams. The caller makes the
// trainer and calls Start() in its own order (mlp_demo makes the trainer
// first, so its set-up is not booked as the first step's time). Errors:
// Engine::Create's and InitEngineParams'.
absl::StatusOr<std::unique_ptr<Engine>> CreateMlpEngine(const MlpConfig& cfg,
                                                        const TrainSpec& train, Device& device,
                                                        Communicator& comm);

// Which samples rank `rank` of `world` trains on, and their data.
//
// Step s consumes a global batch of world*accum micro-batches of micro_batch
// samples. Rank r's local micro-batch m is global micro-batch r*accum + m, and
// holds samples s*world*accum*micro_batch + (r*accum + m)*micro_batch + k,
// k < micro_batch. Ranks get disjoint parts that cover the global batch, and
// a one-rank sampler with accum' = world*accum walks the same micro-batches
// in rank order.
class DistributedSampler {
 public:
  // world >= 1, 0 <= rank < world, accum >= 1 (not checked here: the trainer
  // takes them from a valid engine).
  DistributedSampler(const MlpConfig& cfg, int world, int rank, int accum);
  // Movable, not copyable (the teacher's views point into its own storage).
  DistributedSampler(const DistributedSampler&) = delete;
  DistributedSampler& operator=(const DistributedSampler&) = delete;
  DistributedSampler(DistributedSampler&&) = default;
  DistributedSampler& operator=(DistributedSampler&&) = default;

  // Sample ids of local micro-batch `micro` (< accum) of 0-based step `step`.
  std::vector<int64_t> SampleIds(int64_t step, int micro) const;

  // Writes the inputs x [micro_batch, hidden] of that micro-batch and the
  // teacher's outputs y [micro_batch, hidden] for them. Not thread-safe (it
  // reuses the teacher's activation buffers): one sampler per thread.
  // Regression mode only.
  void Fill(int64_t step, int micro, float* x, float* y) const;

  // The LM mode's micro-batch: the token of each sample, TokenAt, and the
  // teacher's next token for it, TargetOf (micro_batch ids each).
  void FillTokens(int64_t step, int micro, int32_t* tokens, int32_t* targets) const;

  // Input element j of sample `sample_id` (pure function of data_seed).
  float InputAt(int64_t sample_id, int64_t j) const;
  // The LM mode: the token of sample `sample_id`, uniform in [0, vocab)
  // (pure function of data_seed), and the teacher's next token after
  // `token`: the argmax of the teacher LM's logits over the other tokens.
  int32_t TokenAt(int64_t sample_id) const;
  int32_t TargetOf(int32_t token) const { return teacher_next_[static_cast<size_t>(token)]; }

 private:
  MlpConfig cfg_;
  int world_;
  int rank_;
  int accum_;
  std::vector<std::vector<float>> teacher_params_;  // [block * 4 + param]
  std::vector<internal::BlockWeights> teacher_;
  mutable internal::ForwardState teacher_state_;
  std::vector<int32_t> teacher_next_;  // the LM mode: the target of each token
};

// How a trainer gets its micro-batches (MicroBatchLoader, data_loader.h).
struct DataLoaderOptions {
  // Micro-batches made ahead on the loader's own thread, in a bounded queue
  // (1 to MicroBatchLoader::kMaxDepth; 2 lets the next step's first
  // micro-batch be ready while the current one trains). 0: each micro-batch
  // is made on the trainer's thread when it is needed, and all of that time
  // is reported as input wait (mlp_demo --sync-data: an input-bound run).
  // The data, and so the training, are the same bits for every depth.
  int depth = 2;
};

class MicroBatchLoader;

// Trains the MLP on one rank of an engine group. Not thread-safe: one trainer
// per rank thread. `engine` and `comm` (the engine's communicator) must
// outlive the trainer; the engine must have been Start()ed with
// BuildModelSpec(cfg). Works with every ZeRO stage and with fp32, bf16 and
// fp16 param / gradient views; it holds at most one unit gathered at a time
// (the tied head reads the embedding through its own gathered view). Frozen
// params get no gradient computed; an all-frozen unit gets no GradView.
class MlpTrainer {
 public:
  // The loader (options.depth > 0: its thread) starts at the engine's
  // steps(): after a checkpoint Load, the resumed step.
  MlpTrainer(const MlpConfig& cfg, Engine& engine, Communicator& comm,
             const DataLoaderOptions& data = {});
  ~MlpTrainer();  // stops and joins the loader's thread

  // One optimizer step: engine.train().grad_accum_steps micro-batches, then
  // engine.Step(). Each micro-batch is
  //   forward:  for each unit in order: Gather, compute, Release;
  //   backward: for each unit in reverse: Gather (the weights again),
  //             compute, GradView, overwrite, ReduceGrads, Release;
  // with the seed of the backward (dL/dy) multiplied by engine.loss_scale(),
  // read once per step: the gradients written to the engine are scaled, the
  // returned loss is not. Returns the mean micro-batch loss over every rank's
  // micro-batches of the step (an all-reduce through `comm`, so every rank
  // must call it and gets the same value). Errors: the engine's or the
  // communicator's; Internal when a view does not match the ModelSpec.
  absl::StatusOr<double> TrainStep();

  // What the last engine.Step() did.
  const StepResult& last_step() const { return last_step_; }
  // Optimizer steps taken (the engine's count: resumes after a Load).
  int64_t step() const { return engine_.steps(); }

  // Bytes of the activations the trainer keeps from a micro-batch's forward
  // for its backward (block inputs, pre-activations, GELU outputs, logits):
  // with cfg.recompute, only the block inputs and one block's working set.
  int64_t activation_bytes() const;
  // activation_bytes() of a trainer of `cfg`, from the config alone (double:
  // a configuration past 2^63 bytes is still a number to refuse).
  static double PlannedActivationBytes(const MlpConfig& cfg);
  // About the host bytes one trainer of `cfg` takes beside the engine's
  // buffers: PlannedActivationBytes, the per-micro-batch buffers, one unit's
  // widened weights and gradients, and its data loader (the teacher's
  // weights and forward state, `data.depth` queued micro-batches). What
  // mlp_demo checks against the machine before it allocates.
  static double EstimateBytes(const MlpConfig& cfg, const DataLoaderOptions& data);

 private:
  // Forward + loss + backward of one local micro-batch; returns its
  // (unscaled) loss. The time it blocks on the loader is input wait.
  absl::StatusOr<double> MicroBatch(int micro, float loss_scale);
  // One unit's forward / backward (params: its gathered view); the backward
  // leaves the unit's trainable params' gradients in grads_ (concatenated in
  // ModelSpec order) and dL/d(its input) in dy_.
  absl::Status ForwardUnit(int unit, const UnitView& params);
  absl::Status BackwardUnit(int unit, const UnitView& params);
  // Block `block`'s forward from its input state_.inputs[block] into pre,
  // act and y, with the unit's fp32 params `p` (base, then adapters).
  absl::Status BlockForwardAt(int block, const float* const* p, float* pre, float* act, float* y);
  // Writes grads_ into the trainable params' entries of `grad_view`.
  absl::Status WriteGrads(int unit, const UnitView& grad_view);

  MlpConfig cfg_;
  Engine& engine_;
  Communicator& comm_;
  std::unique_ptr<MicroBatchLoader> loader_;
  StepResult last_step_;
  // Per unit: each param's elements and whether it trains; a unit with no
  // trainable param has no GradView / ReduceGrads.
  ModelSpec spec_;
  std::vector<std::vector<int64_t>> unit_sizes_;
  std::vector<std::vector<bool>> unit_trainable_;
  std::vector<bool> unit_has_grads_;
  // Per-micro-batch buffers, allocated once.
  std::vector<float> target_, dy_, dx_, scratch_;
  internal::ForwardState state_;               // with recompute: pre/act of one block
  std::vector<float> recompute_out_;           // a recomputed block's output (unused)
  std::vector<int32_t> tokens_, next_tokens_;  // the LM mode's data
  std::vector<float> logits_, dlogits_;        // [micro_batch, vocab]
  // Only one unit is gathered at a time, so one widened copy serves them all.
  std::vector<float> weight_copy_;  // [w1 b1 w2 b2 concatenated]
  std::vector<float> grads_;        // one unit's fp32 gradients, concatenated
};

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_MLP_H_
