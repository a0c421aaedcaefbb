// The GPT's vocabulary split over a tensor-parallel group (Megatron-LM's
// vocab-parallel embedding, LM head and cross-entropy; issue 23, the GPT on
// the dp x tp x pp grid). The vocabulary V is padded to V' = the next
// multiple of tp (GPT-2's 50257 over 2 ranks: 50258); rank r of a group of
// tp holds rows [r V' / tp, (r + 1) V' / tp) of the padded wte, and wpe
// whole. The padding rows are no token: the loss leaves their logits out of
// the softmax and gives them zero gradient, so the model is V's whatever
// the rows hold. Every rank of the group passes the same tokens, targets and
// x; the collectives go through `tp_group` (sums in rank order, so the
// results are the same on every rank and every run).
//
// Against the one-rank functions of gpt_math.h:
//   - VocabParallelEmbedForward: the same bits (one rank holds each token's
//     row; the others add zeros), up to the sign of a zero;
//   - the head's logits: the one-rank logits' columns of this rank's rows;
//   - the loss: the row maxima are exact, the sums of exponentials are added
//     per rank and then over ranks in double (another order than one rank's
//     index order: a difference of order 1e-16 relative);
//   - dlogits: the one-rank formula with that sum; dwte's rows are the
//     one-rank rows of this rank's vocabulary; dx is the sum over ranks of
//     each rank's partial product, in rank order (another summation order
//     than one rank's sgemm over the whole vocabulary: float rounding).
#ifndef ZEROSHARD_EXAMPLES_GPT_INTERNAL_VOCAB_PARALLEL_H_
#define ZEROSHARD_EXAMPLES_GPT_INTERNAL_VOCAB_PARALLEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/internal/gpt_math.h"
#include "zeroshard/communicator.h"

namespace zeroshard {
namespace gpt {
namespace internal {

// The rows of the padded wte that rank `rank` of `tp` holds: `size` rows
// from `begin`, of which the first `valid` are tokens (the rest padding).
struct VocabShard {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t valid = 0;
  bool Holds(int64_t token) const { return token >= begin && token < begin + valid; }
};
// V padded to a multiple of tp.
int64_t PaddedVocab(int64_t vocab, int tp);
// InvalidArgument unless vocab >= 1, tp >= 1 and 0 <= rank < tp.
absl::StatusOr<VocabShard> VocabShardOf(int64_t vocab, int tp, int rank);

// x0 [N, C] = wte[token] + wpe[t] with this rank's rows `wte_shard`
// ([shard.size, C]) and the whole wpe; an all-reduce over the group.
absl::Status VocabParallelEmbedForward(const float* wte_shard, const float* wpe,
                                       const int32_t* tokens, const GptDims& d, VocabShard shard,
                                       Communicator& tp_group, float* x0);
// The embedding's gradients: dwte_shard [shard.size, C] (overwritten) gets
// dx0's rows of the tokens this rank holds, in row order; dwpe [P, C]
// (overwritten) all of them, as EmbedBackward (no communication: dx0 is the
// same on every rank).
void VocabParallelEmbedBackward(const int32_t* tokens, const float* dx0, const GptDims& d,
                                VocabShard shard, float* dwte_shard, float* dwpe);

// logits_shard [N, shard.size] = x wte_shard^T.
void VocabParallelHeadForward(const float* wte_shard, const float* x, const GptDims& d,
                              VocabShard shard, float* logits_shard);
// The mean cross-entropy over the N rows of the logits split over the group
// (the row maxima all-gathered, the exponentials' sums and the target
// logits all-reduced in double), over the token columns only. Overwrites
// logits_shard with dL/dlogits * seed for this rank's columns (0 in the
// padding's). Returns the loss (the same on every rank).
absl::StatusOr<double> VocabParallelCrossEntropy(float* logits_shard, const int32_t* targets,
                                                 const GptDims& d, VocabShard shard, float seed,
                                                 Communicator& tp_group);
// dwte_shard [shard.size, C] (overwritten) = dlogits_shard^T x; dx [N, C]
// (overwritten) = the all-reduce over the group of dlogits_shard wte_shard.
absl::Status VocabParallelHeadBackward(const float* wte_shard, const float* x,
                                       const float* dlogits_shard, const GptDims& d,
                                       VocabShard shard, Communicator& tp_group, float* dwte_shard,
                                       float* dx);

}  // namespace internal
}  // namespace gpt
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_GPT_INTERNAL_VOCAB_PARALLEL_H_
