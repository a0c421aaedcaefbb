#include "examples/mlp/internal/block_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "examples/common/cpu_blas.h"
#include "examples/common/exp_non_positive.h"

namespace zeroshard {
namespace mlp {
namespace internal {
namespace {

using examples::ExpNonPositive;

// Phi(x) = 0.5 erfc(-x / sqrt(2)), with erfc(z) for z = |x| / sqrt(2) >= 0
// from Numerical Recipes' erfcc: t exp(-z^2 + P(t)), t = 1 / (1 + z / 2),
// fractional error < 1.2e-7 for every z. The positive side is 1 - the
// negative side's value, so no cancellation ever loses the tail.
inline float NormalCdf(float x) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float lower_tail = 0.5f * t * ExpNonPositive(p - z * z);
  const float upper_tail = 1.0f - lower_tail;
  return x < 0.0f ? lower_tail : upper_tail;
}

inline float GeluInline(float x) { return x * NormalCdf(x); }

inline float GeluGradInline(float x) {
  // phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
  const float pdf = 0.39894228040143268f * ExpNonPositive(-0.5f * x * x);
  return NormalCdf(x) + x * pdf;
}

}  // namespace

float Gelu(float x) { return GeluInline(x); }

float GeluGrad(float x) { return GeluGradInline(x); }

void BiasGelu(const float* b1, int64_t rows, int64_t cols, float* pre, float* act) {
  for (int64_t r = 0; r < rows; ++r) {
    float* pre_row = pre + r * cols;
    float* act_row = act + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float p = pre_row[c] + b1[c];
      pre_row[c] = p;
      act_row[c] = GeluInline(p);
    }
  }
}

void GeluBackwardBiasGrad(const float* pre, int64_t rows, int64_t cols, float* dpre, float* db1) {
  for (int64_t c = 0; c < cols; ++c) db1[c] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* pre_row = pre + r * cols;
    float* dpre_row = dpre + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float raw = dpre_row[c] * GeluGradInline(pre_row[c]);
      // Flushed below FLT_MIN: see block_math.h (subnormal operands stall
      // SSE sgemm kernels). A select between values, so it vectorizes.
      const float d = std::fabs(raw) < std::numeric_limits<float>::min() ? 0.0f : raw;
      dpre_row[c] = d;
      db1[c] += d;
    }
  }
}

void BiasResidual(const float* b2, const float* x, int64_t rows, int64_t cols, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    float* y_row = y + r * cols;
    const float* x_row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) y_row[c] = (y_row[c] + b2[c]) + x_row[c];
  }
}

void SumRows(const float* m, int64_t rows, int64_t cols, float* sum) {
  for (int64_t c = 0; c < cols; ++c) sum[c] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = m + r * cols;
    for (int64_t c = 0; c < cols; ++c) sum[c] += row[c];
  }
}

void AddInPlace(const float* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void ForwardState::Resize(int blocks, int64_t batch, int64_t hidden, int64_t inner) {
  const size_t io = static_cast<size_t>(batch * hidden);
  const size_t wide = static_cast<size_t>(batch * (inner < 0 ? InnerSize(hidden) : inner));
  inputs.assign(blocks + 1, std::vector<float>(io));
  pre.assign(blocks, std::vector<float>(wide));
  act.assign(blocks, std::vector<float>(wide));
}

void UseSingleThreadedBlas() { examples::SetUpCpuBlas(); }

void BlockForwardPartial(const BlockWeights& w, int64_t batch, int64_t hidden, int64_t inner,
                         const float* x, float* pre, float* act, float* partial) {
  // pre [B,inner] = x [B,h] * W1s^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, inner, hidden, 1.0f, x, hidden, w.w1,
              hidden, 0.0f, pre, inner);
  BiasGelu(w.b1, batch, inner, pre, act);
  // partial [B,h] = act [B,inner] * W2s^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, hidden, inner, 1.0f, act, inner, w.w2,
              inner, 0.0f, partial, hidden);
}

void BlockForwardFinish(const float* b2, int64_t batch, int64_t hidden, const float* x, float* y) {
  // + b2, then + x (the residual), in this order on every path.
  BiasResidual(b2, x, batch, hidden, y);
}

void BlockForward(const BlockWeights& w, int64_t batch, int64_t hidden, const float* x, float* pre,
                  float* act, float* y) {
  BlockForwardPartial(w, batch, hidden, InnerSize(hidden), x, pre, act, y);
  BlockForwardFinish(w.b2, batch, hidden, x, y);
}

void BlockBackwardPartial(const BlockWeights& w, int64_t batch, int64_t hidden, int64_t inner,
                          const float* x, const float* pre, const float* act, const float* dy,
                          float* scratch, float* dx_partial, const BlockGradients& grads) {
  // dW2s [h,inner] = dy^T [h,B] * act [B,inner]; db2 = column sums of dy.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hidden, inner, batch, 1.0f, dy, hidden, act,
              inner, 0.0f, grads.w2, inner);
  SumRows(dy, batch, hidden, grads.b2);
  // dpre [B,inner] = (dy [B,h] * W2s [h,inner]) * gelu'(pre).
  float* dpre = scratch;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, inner, hidden, 1.0f, dy, hidden,
              w.w2, inner, 0.0f, dpre, inner);
  // The same pass sums db1s = column sums of dpre.
  GeluBackwardBiasGrad(pre, batch, inner, dpre, grads.b1);
  // dW1s [inner,h] = dpre^T [inner,B] * x [B,h].
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, inner, hidden, batch, 1.0f, dpre, inner, x,
              hidden, 0.0f, grads.w1, hidden);
  if (dx_partial == nullptr) return;
  // dx_partial [B,h] = dpre [B,inner] * W1s [inner,h].
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, hidden, inner, 1.0f, dpre, inner,
              w.w1, hidden, 0.0f, dx_partial, hidden);
}

void BlockBackwardFinish(const float* dy, int64_t batch, int64_t hidden, float* dx) {
  // dx = dx_partial + dy (the residual path).
  AddInPlace(dy, batch * hidden, dx);
}

void BlockBackward(const BlockWeights& w, int64_t batch, int64_t hidden, const float* x,
                   const float* pre, const float* act, const float* dy, float* scratch, float* dx,
                   const BlockGradients& grads) {
  BlockBackwardPartial(w, batch, hidden, InnerSize(hidden), x, pre, act, dy, scratch, dx, grads);
  if (dx != nullptr) BlockBackwardFinish(dy, batch, hidden, dx);
}

void NetworkForward(const std::vector<BlockWeights>& blocks, int64_t batch, int64_t hidden,
                    const float* x, ForwardState* state) {
  std::copy(x, x + batch * hidden, state->inputs[0].begin());
  for (size_t i = 0; i < blocks.size(); ++i) {
    BlockForward(blocks[i], batch, hidden, state->inputs[i].data(), state->pre[i].data(),
                 state->act[i].data(), state->inputs[i + 1].data());
  }
}

double MseLoss(const float* out, const float* target, int64_t n, float* dout) {
  double sum = 0.0;
  const float scale = 2.0f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) {
    const float diff = out[i] - target[i];
    sum += static_cast<double>(diff) * diff;
    dout[i] = scale * diff;
  }
  return sum / static_cast<double>(n);
}

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard
