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
#ifndef ZEROSHARD_EXAMPLES_MLP_MLP_H_
#define ZEROSHARD_EXAMPLES_MLP_MLP_H_

#include <cstdint>
#include <memory>
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

  // hidden, blocks and micro_batch positive; InvalidArgument naming the field.
  absl::Status Validate() const;
};

// A config of the given shape, the seeds at their defaults.
inline MlpConfig MlpShape(int64_t hidden, int blocks, int micro_batch) {
  MlpConfig cfg;
  cfg.hidden = hidden;
  cfg.blocks = blocks;
  cfg.micro_batch = micro_batch;
  return cfg;
}

// Indices of a block's params within its unit, in ModelSpec order.
enum BlockParam : int { kW1 = 0, kB1 = 1, kW2 = 2, kB2 = 3, kNumBlockParams = 4 };

// One unit per block, named "block.<i>", params w1, b1, w2, b2, with
// Megatron's tensor-parallel split (ParamSpec::tp_split_dim): w1 and b1 by
// rows (column-parallel, 0), w2 by columns (row-parallel, 1), b2 replicated.
ModelSpec BuildModelSpec(const MlpConfig& cfg);

// Deterministic initial value of param `param` of block `unit`, drawn from a
// counter-based generator keyed by cfg.init_seed: weights N(0, 1/fan_in)
// (std 1/sqrt(fan_in)), biases N(0, 0.02^2). Empty when unit or param is out
// of range.
std::vector<float> InitialParam(const MlpConfig& cfg, int unit, int param);

// The same distribution under another seed (the teacher uses teacher_seed).
std::vector<float> RandomParam(const MlpConfig& cfg, uint64_t seed, int unit, int param);

// What every rank of an MLP run must share beyond what the engine checks
// itself (the model spec and initial weights): the micro-batch size and the
// teacher and data seeds. Pass them to Engine::Start so that a rank started
// with another --micro-batch or seed is refused by name.
std::vector<TrainerSetting> TrainerSettings(const MlpConfig& cfg);

// The BLAS the CPU trainer's products run on, for reports: OpenBLAS's build
// string and core ("..., core Haswell"), and whether the environment chose
// the core ("(OPENBLAS_CORETYPE=Haswell in the environment)") or OpenBLAS
// detected the CPU ("(detected)"). The core picks the sgemm kernels: the
// compute time and, within a process, the bits.
std::string BlasDescription();

// SetParam for every param of every unit with InitialParam. Call before
// engine.Start(). Errors: the engine's (e.g. a ModelSpec that is not
// BuildModelSpec(cfg)).
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
  void Fill(int64_t step, int micro, float* x, float* y) const;

  // Input element j of sample `sample_id` (pure function of data_seed).
  float InputAt(int64_t sample_id, int64_t j) const;

 private:
  MlpConfig cfg_;
  int world_;
  int rank_;
  int accum_;
  std::vector<std::vector<float>> teacher_params_;  // [unit * 4 + param]
  std::vector<internal::BlockWeights> teacher_;
  mutable internal::ForwardState teacher_state_;
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
// fp16 param / gradient views; it holds at most one unit gathered at a time.
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

 private:
  // Forward + loss + backward of one local micro-batch; returns its
  // (unscaled) loss. The time it blocks on the loader is input wait.
  absl::StatusOr<double> MicroBatch(int micro, float loss_scale);

  MlpConfig cfg_;
  Engine& engine_;
  Communicator& comm_;
  std::unique_ptr<MicroBatchLoader> loader_;
  StepResult last_step_;
  // Per-micro-batch buffers, allocated once.
  std::vector<float> target_, dy_, dx_, scratch_;
  internal::ForwardState state_;
  // Only one unit is gathered at a time, so one widened copy serves them all.
  std::vector<float> weight_copy_;  // [w1 b1 w2 b2 concatenated]
  std::vector<float> grads_;        // one unit's fp32 gradients, concatenated
};

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_MLP_H_
