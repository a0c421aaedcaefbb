// The tensors the GPT example (examples/gpt, a GPT-2-architecture trainer on
// the CPU) allocates through the engine's Device beside the engine's own
// buffers: the estimator's `--activations gpt-example` mode counts these
// instead of the Korthikanti et al. formulas (activations.h), so that its
// estimate is held to the trainer's ledger, category by category.
//
// Per rank, with B = micro-batch, T = seq, N = B T rows, C = n_embd,
// H = n_head, V = vocab_size, L = n_layer, all fp32 whatever the precision
// (the trainer computes in fp32), but the tokens (int32):
//   activations
//     gpt.block_inputs   (L + 1) N C          every block's input and the last output
//     gpt.block_acts     k BlockActsFloats    k = L (recompute none) or 1 (full)
//     gpt.final_norm     N C + 2 N            ln_f's output, mean and rstd
//     gpt.logits         N V
//     gpt.tokens         2 N int32            inputs and targets
//   workspace
//     gpt.grad_io        2 N C                the gradient flowing in and out of a block
//     gpt.block_scratch  BlockScratchFloats   a block's forward/backward scratch
//     gpt.unit_grads     max over units of the trainable elements (the tied
//                        head's unit counts V C): one unit's gradient
//     gpt.unit_params    max over units of all elements: one unit's params
//                        in fp32 (bf16 and fp16 only, where the engine's are 16-bit)
// with BlockActsFloats = N (15 C + 4) + B H T^2 (ln_1 out, mean, rstd; qkv;
// the attention probabilities; the attention output; the residual; ln_2
// out, mean, rstd; c_fc out and its GELU) and BlockScratchFloats = 6 N C +
// T^2 (the backward's d fc [N, 4C], two [N, C] gradients and one head's
// d att [T, T]; examples/gpt/internal/gpt_math.{h,cc} document both).
#ifndef ZEROSHARD_PLAN_GPT_EXAMPLE_TENSORS_H_
#define ZEROSHARD_PLAN_GPT_EXAMPLE_TENSORS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard::internal {

// The GPT example's allocations on one rank for `model` trained with
// `options` (seq resolved; precision and recompute read), in the order
// above, each with its ledger name, category (kActivations or kWorkspace)
// and bytes; gpt.unit_params only with 16-bit precision.
// InvalidArgument when the model is not one the example trains (a
// GPT2LMHeadModel with tied embeddings, an MLP of 4 n_embd, n_head x
// head_dim = n_embd, every param trainable, no LoRA), for recompute selective (the example
// recomputes whole blocks or nothing), or when a count passes 2^63 bytes (naming --seq and
// --micro-batch).
absl::StatusOr<std::vector<TrainerTensor>> GptExampleTensors(const ModelDescription& model,
                                                             const PlanOptions& options);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_PLAN_GPT_EXAMPLE_TENSORS_H_
