#include "examples/mlp/internal/lm_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "examples/mlp/internal/block_math.h"

namespace zeroshard {
namespace mlp {
namespace internal {

void EmbedForward(const float* embed, const int32_t* tokens, int64_t batch, int64_t hidden,
                  float* x) {
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = embed + static_cast<int64_t>(tokens[b]) * hidden;
    std::copy(row, row + hidden, x + b * hidden);
  }
}

void EmbedBackward(const int32_t* tokens, const float* dx, int64_t batch, int64_t hidden,
                   int64_t vocab, float* dembed) {
  std::fill(dembed, dembed + vocab * hidden, 0.0f);
  // Rows in batch order: a token that occurs twice sums its rows the same
  // way on every rank and at every stage.
  for (int64_t b = 0; b < batch; ++b) {
    AddInPlace(dx + b * hidden, hidden, dembed + static_cast<int64_t>(tokens[b]) * hidden);
  }
}

void HeadForward(const float* embed, const float* bias, const float* x, int64_t batch,
                 int64_t hidden, int64_t vocab, float* logits) {
  // logits [B,V] = x [B,h] * E^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, vocab, hidden, 1.0f, x, hidden, embed,
              hidden, 0.0f, logits, vocab);
  for (int64_t b = 0; b < batch; ++b) AddInPlace(bias, vocab, logits + b * vocab);
}

double CrossEntropyLoss(const float* logits, const int32_t* targets, int64_t batch, int64_t vocab,
                        float* dlogits) {
  double total = 0.0;
  const double inv_batch = 1.0 / static_cast<double>(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = logits + b * vocab;
    float* drow = dlogits + b * vocab;
    const double max = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
    const double log_sum = std::log(sum);
    const int64_t t = targets[b];
    total += log_sum - (static_cast<double>(row[t]) - max);
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = std::exp(static_cast<double>(row[v]) - max - log_sum);
      drow[v] = static_cast<float>(((v == t) ? p - 1.0 : p) * inv_batch);
    }
  }
  return total * inv_batch;
}

void HeadBackward(const float* embed, const float* x, const float* dlogits, int64_t batch,
                  int64_t hidden, int64_t vocab, float* dembed_head, float* dbias, float* dx) {
  if (dbias != nullptr) SumRows(dlogits, batch, vocab, dbias);
  if (dembed_head != nullptr) {
    // dE_head [V,h] = dlogits^T [V,B] * x [B,h].
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, vocab, hidden, batch, 1.0f, dlogits, vocab,
                x, hidden, 0.0f, dembed_head, hidden);
  }
  // dx [B,h] = dlogits [B,V] * E [V,h].
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, hidden, vocab, 1.0f, dlogits, vocab,
              embed, hidden, 0.0f, dx, hidden);
}

void ArgmaxRows(const float* logits, int64_t rows, int64_t cols, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * cols;
    out[r] = static_cast<int32_t>(std::max_element(row, row + cols) - row);
  }
}

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard
