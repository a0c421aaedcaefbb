// GptTrainer: one rank's training loop of the GPT example over the engine's
// public API (docs/gpt.md).
//
// Data: a step of W ranks with A micro-batches of B sequences takes the
// next W * A * B windows of the training stream (WindowSampler); rank r's
// micro-batch m takes windows consumed + (r A + m) B .. + B - 1. So the ranks
// are disjoint and cover the stream, and a one-rank run accumulating W * A
// micro-batches sees the same windows in the same order (the baseline).
//
// Memory: every activation and workspace array is allocated through the
// engine's Device, in the ledger's kActivations and kWorkspace categories,
// so that the ledger's peak is the run's and `zeroshard estimate
// --activations gpt-example` can be held to it. Activations (fp32, whatever
// the precision: the math runs in fp32):
//   gpt.block_inputs  (L + 1) N C     x0 .. xL (each block's input, ln_f's)
//   gpt.block_acts    L (or 1 with recompute) BlockActsFloats
//   gpt.final_norm    N C + 2 N       ln_f's output, mean, rstd
//   gpt.logits        N V             logits, then dL/dlogits in place
//   gpt.tokens        2 N int32       inputs and targets
// Workspace:
//   gpt.grad_io       2 N C           dL/dy and dL/dx of the backward
//   gpt.block_scratch BlockScratchFloats
//   gpt.unit_grads    the largest unit's trainable elements (lm_head: V C)
//   gpt.unit_params   the largest unit's elements; bf16/fp16 only (fp32 copy)
#ifndef ZEROSHARD_EXAMPLES_GPT_GPT_TRAINER_H_
#define ZEROSHARD_EXAMPLES_GPT_GPT_TRAINER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/internal/gpt_math.h"
#include "examples/gpt/text_data.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"

namespace zeroshard {
namespace gpt {

struct GptRunOptions {
  int64_t micro_batch = 4;  // B, sequences per micro-batch
  int64_t seq = 128;        // T, <= n_positions
  bool recompute = false;   // keep block inputs only; recompute each block in the backward
};

// The token windows (T + 1 tokens each: the inputs and the last target) of
// stream positions [first, first + count): what --dump-batches writes.
std::vector<std::vector<int32_t>> WindowRows(const WindowSampler& sampler, int64_t first,
                                             int64_t count);

// The bytes of every array GptTrainer allocates (the names above), from
// the config alone: Allocate takes its sizes from here, so a program that
// asks before the engine exists (gpt_train's memory check) gets the
// ledger's kActivations and kWorkspace bytes to the byte.
struct GptTrainerBytes {
  int64_t tokens = 0, block_inputs = 0, block_acts = 0, final_norm = 0, logits = 0;
  int64_t grad_io = 0, block_scratch = 0, unit_grads = 0, unit_params = 0;
  int64_t total() const {
    return tokens + block_inputs + block_acts + final_norm + logits + grad_io + block_scratch +
           unit_grads + unit_params;
  }
};

class GptTrainer {
 public:
  // The arrays a trainer of `cfg`, `run` allocates beside an engine of
  // `model` (its units: the largest sizes gpt.unit_grads and
  // gpt.unit_params) at `precision`. InvalidArgument, naming the sizes,
  // when they pass 2^62 bytes (no product is formed past it).
  static absl::StatusOr<GptTrainerBytes> PlanBytes(const GptConfig& cfg, const GptRunOptions& run,
                                                   const ModelSpec& model, Precision precision);

  // `engine` was created on BuildGptModelSpec(cfg) with `comm`; `device` is
  // the engine's (host-accessible). `train` outlives the trainer.
  static absl::StatusOr<std::unique_ptr<GptTrainer>> Create(const GptConfig& cfg,
                                                            const GptRunOptions& run,
                                                            Engine& engine, Communicator& comm,
                                                            Device& device,
                                                            const WindowSampler* train);
  ~GptTrainer();

  // One optimizer step; returns the mean loss over the global batch (the
  // same on every rank).
  absl::StatusOr<double> TrainStep();
  // Mean loss over the first `max_windows` validation windows (rounded down
  // to a multiple of W B; at least W B must exist), forward only, split
  // across the ranks. Collective.
  absl::StatusOr<double> ValLoss(const std::vector<uint8_t>& val, int64_t max_windows);

  // The logits [B, T, V] of `tokens` [B, T] (B = the micro-batch), forward
  // only. Collective (stage 3 gathers).
  absl::StatusOr<std::vector<float>> Logits(const std::vector<int32_t>& tokens);

  // Windows of the training stream consumed so far (the sampler position a
  // checkpoint records).
  int64_t windows_consumed() const { return consumed_; }
  void set_windows_consumed(int64_t n) { consumed_ = n; }
  const StepResult& last_step() const { return last_step_; }
  // The token windows (T + 1 tokens each) of the next step's global batch,
  // in global micro-batch order: what --dump-batches writes.
  std::vector<std::vector<int32_t>> NextGlobalBatch() const;

 private:
  GptTrainer(const GptConfig& cfg, const GptRunOptions& run, Engine& engine, Communicator& comm,
             Device& device, const WindowSampler* train);
  absl::Status Allocate();
  absl::Status Forward(int u, const UnitView& params, bool with_loss, double* loss);
  absl::Status Backward(int u, const UnitView& params);
  absl::StatusOr<double> MicroBatch(int micro, float loss_scale);
  absl::StatusOr<const float* const*> ParamsAsFp32(int u, const UnitView& view);
  float* acts_base(int64_t block) const;

  GptConfig cfg_;
  GptRunOptions run_;
  internal::GptDims d_;
  Engine& engine_;
  Communicator& comm_;
  Device& device_;
  const WindowSampler* train_;
  int64_t consumed_ = 0;
  StepResult last_step_;
  double micro_loss_ = 0.0;

  std::vector<std::vector<int64_t>> unit_sizes_;
  std::vector<const float*> param_ptrs_;
  std::vector<float*> grad_ptrs_;

  DeviceBuffer tokens_, inputs_, acts_, final_norm_, logits_;
  DeviceBuffer grad_io_, scratch_, unit_grads_, unit_params_;
};

}  // namespace gpt
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_GPT_GPT_TRAINER_H_
