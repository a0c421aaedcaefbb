// The token embedding, the tied LM head and the cross-entropy loss of the
// MLP example's language-model mode (--vocab V), on raw fp32 arrays, apart
// from the engine so that they can be tested against a double reference.
//
// With E [V, h] the embedding (unit "embed"), bias [V] the head's bias, a
// micro-batch of `batch` token ids and the residual blocks in between:
//   x0     = E[token]                       [batch, h]   (EmbedForward)
//   x      = blocks(x0)
//   logits = x E^T + bias                   [batch, V]   (HeadForward)
//   loss   = mean over rows of -log softmax(logits)[target]
// The head's weight IS E (ParamSpec::tied_to), so dL/dE is the sum of two
// uses: the head's dlogits^T x and the embedding's scatter-add of dL/dx0
// into the rows of the tokens. The trainer writes each use through its own
// unit's gradient view and the engine sums them (head first: the backward
// reduces the head before the embedding).
//
// Every result depends only on its inputs and sizes (single-threaded BLAS,
// sums in a fixed order), as block_math.h.
#ifndef ZEROSHARD_EXAMPLES_MLP_INTERNAL_LM_MATH_H_
#define ZEROSHARD_EXAMPLES_MLP_INTERNAL_LM_MATH_H_

#include <cstdint>

namespace zeroshard {
namespace mlp {
namespace internal {

// x[b, :] = E[tokens[b], :]. Token ids must be in [0, vocab) (the caller's
// data guarantee it).
void EmbedForward(const float* embed, const int32_t* tokens, int64_t batch, int64_t hidden,
                  float* x);

// dE (the embedding use's gradient, [vocab, hidden]) = 0, then for b in
// order: dE[tokens[b], :] += dx[b, :]. Rows of tokens absent from the batch
// are zero.
void EmbedBackward(const int32_t* tokens, const float* dx, int64_t batch, int64_t hidden,
                   int64_t vocab, float* dembed);

// logits [batch, vocab] = x [batch, hidden] E^T + bias.
void HeadForward(const float* embed, const float* bias, const float* x, int64_t batch,
                 int64_t hidden, int64_t vocab, float* logits);

// Mean cross-entropy of the rows of `logits` against `targets`, computed
// row by row with the max subtracted, in double (sums in index order).
// Writes dL/dlogits = (softmax - onehot(target)) / batch. Returns the loss.
double CrossEntropyLoss(const float* logits, const int32_t* targets, int64_t batch, int64_t vocab,
                        float* dlogits);

// The head's backward: dbias = column sums of dlogits (rows in order),
// dE_head = dlogits^T x [vocab, hidden] (the head use of the tied weight),
// dx = dlogits E [batch, hidden]. dembed_head and dbias may be null (a
// frozen head: no weight gradient is computed).
void HeadBackward(const float* embed, const float* x, const float* dlogits, int64_t batch,
                  int64_t hidden, int64_t vocab, float* dembed_head, float* dbias, float* dx);

// The teacher's rule for the next token: the index of the largest logit of
// each row (the first one on a tie).
void ArgmaxRows(const float* logits, int64_t rows, int64_t cols, int32_t* out);

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_INTERNAL_LM_MATH_H_
