// Activation memory of a transformer layer, after Korthikanti et al. 2022,
// "Reducing Activation Recomputation in Large Transformer Models" (Section
// 4): with 16-bit activations and 1-byte dropout masks, one GPT layer keeps
//   sbh (34 + 5as/h)                     no parallelism, no recomputation
//   sbh (10 + 24/t + 5as/(ht))           tensor parallel (t)
//   sbh/t (34 + 5as/h)                   tensor + sequence parallel
//   sbh (10 + 24/t), 34 sbh/t            the same with selective recomputation
//   2 sbh (/t with sequence parallelism) full recomputation (the layer input)
// The terms are counted tensor by tensor so that grouped-query attention,
// gated (SwiGLU) MLPs of any width, mixtures of experts, models without
// dropout and fp32 activations get their own exact count; for a GPT layer
// (MHA, 4h GELU MLP, dropout, 2-byte activations) the sums are the formulas
// above.
//
// Every function returns InvalidArgument, naming --seq and --micro-batch,
// when the bytes do not fit in int64_t (the count is formed in double and
// range-checked before it is rounded to an integer).
#ifndef ZEROSHARD_PLAN_ACTIVATIONS_H_
#define ZEROSHARD_PLAN_ACTIVATIONS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard::internal {

struct ActivationShape {
  int64_t seq = 0;          // s
  int64_t micro_batch = 1;  // b
  int tp = 1;               // t
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;
  int64_t activation_bytes = 2;  // 2 for bf16/fp16 activations, 4 for fp32
};

// Bytes one layer keeps between its forward and its backward, for one
// micro-batch (with kFull: only the stored layer input).
absl::StatusOr<int64_t> LayerActivationBytes(const TransformerShape& model,
                                             const ActivationShape& shape);

// With kFull, the extra bytes of the one layer being recomputed: the layer
// is rebuilt with flash attention, so it needs the kSelective set (no s^2
// scores), less its input, which is already stored. Full recomputation of L
// layers therefore never needs more than selective: (L - 1) inputs + one
// selective set <= L selective sets. 0 for kNone and kSelective.
absl::StatusOr<int64_t> RecomputeWorkingBytes(const TransformerShape& model,
                                              const ActivationShape& shape);

// First pipeline stage, per micro-batch in flight: the embedding dropout mask
// (sbh bytes when the model has dropout; /t with sequence parallelism).
absl::StatusOr<int64_t> EmbeddingActivationBytes(const TransformerShape& model,
                                                 const ActivationShape& shape);

// Last pipeline stage: final norm input and head input (2 sbh activations)
// and fp32 logits for the cross entropy (4 sbV bytes). The vocabulary-
// parallel logits split by t; the two inputs split by t only with sequence
// parallelism (else every tensor-parallel rank holds them whole):
//   2sbh·a + 4sbV/t     without sequence parallelism (a = activation bytes)
//   (2sbh·a + 4sbV)/t   with it: Korthikanti's 4sbh/t (1 + V/h) for a = 2.
absl::StatusOr<int64_t> OutputActivationBytes(const TransformerShape& model,
                                              const ActivationShape& shape);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_PLAN_ACTIVATIONS_H_
