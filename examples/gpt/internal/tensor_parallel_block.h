// A GPT block split over a tensor-parallel group (Megatron-LM; issue 23,
// the GPT on the dp x tp x pp grid). Rank r of tp holds heads
// [r H / tp, (r + 1) H / tp) and a tp-th of the MLP's hidden units:
//   attn.c_attn  column-parallel: its q, k and v columns of its heads
//                ([C, 3 C / tp], q | k | v; bias [3 C / tp])
//   attn.c_proj  row-parallel: the rows of its heads' outputs ([C / tp, C])
//   mlp.c_fc     column-parallel ([C, 4 C / tp], bias [4 C / tp])
//   mlp.c_proj   row-parallel ([4 C / tp, C])
//   ln_1, ln_2, attn.c_proj.bias, mlp.c_proj.bias: whole on every rank.
// Forward: each row-parallel product is summed over the group (an
// all-reduce; rank 0's partial carries the bias) before the residual;
// backward: the gradient at each LayerNorm's output is summed over the
// group. The replicated params' gradients come out the same on every rank
// (their inputs are), so they need no reduction over tp.
//
// With tp = 1 every result has the bits of BlockForward / BlockBackward.
// With tp > 1 the row-parallel sums and the LayerNorm-output gradients add
// per-rank partial products in rank order: float rounding of another order.
#ifndef ZEROSHARD_EXAMPLES_GPT_INTERNAL_TENSOR_PARALLEL_BLOCK_H_
#define ZEROSHARD_EXAMPLES_GPT_INTERNAL_TENSOR_PARALLEL_BLOCK_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "examples/gpt/internal/gpt_math.h"
#include "zeroshard/communicator.h"

namespace zeroshard {
namespace gpt {
namespace internal {

// The dims of rank's share of the attention: heads H / tp, width C / tp
// (InvalidArgument unless tp divides H; then it divides C).
absl::Status CheckTensorParallelDims(const GptDims& d, int tp);
GptDims LocalAttentionDims(const GptDims& d, int tp);

// Element count of block param `param` on one rank of tp.
int64_t TensorParallelParamNumel(BlockParam param, const GptDims& d, int tp);
// Rank `rank`'s share of block param `param` given the whole tensor (the
// layouts above), and the inverse (the whole tensor from every rank's
// share, in rank order; a replicated param: rank 0's).
std::vector<float> SliceBlockParam(BlockParam param, const GptDims& d, int tp, int rank,
                                   const float* full);
std::vector<float> JoinBlockParam(BlockParam param, const GptDims& d, int tp,
                                  const std::vector<std::vector<float>>& shares);

// A rank's activations: BlockActsFloats(d, tp) and BlockActsView(d, base, tp)
// (gpt_math.h).
// Scratch floats of TensorParallelBlockBackward: [N, 4 C / tp] + 2 [N, C] + [T, T].
int64_t TensorParallelScratchFloats(const GptDims& d, int tp);

// y [N, C] from x [N, C] (the same on every rank of `tp_group`); `p` this
// rank's shares, indexed by BlockParam.
absl::Status TensorParallelBlockForward(const float* const* p, const GptDims& d, const float* x,
                                        const BlockActs& acts, float* y, Communicator& tp_group);
// dx [N, C] and this rank's gradients `g` (its shares' shapes, overwritten)
// from dy [N, C] (the same on every rank).
absl::Status TensorParallelBlockBackward(const float* const* p, const GptDims& d, const float* x,
                                         const BlockActs& acts, const float* dy, float* dx,
                                         float* const* g, float* scratch, Communicator& tp_group);

}  // namespace internal
}  // namespace gpt
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_GPT_INTERNAL_TENSOR_PARALLEL_BLOCK_H_
