#include "examples/mlp/internal/block_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <mutex>

extern "C" void openblas_set_num_threads(int);

namespace zeroshard {
namespace mlp {
namespace internal {

void AddBias(const float* bias, int64_t rows, int64_t cols, float* m) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = m + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

// grad[j] = sum over rows of m[r, j], rows summed in order (fixed, so the
// result does not depend on who computes it).
void SumRows(const float* m, int64_t rows, int64_t cols, float* grad) {
  for (int64_t c = 0; c < cols; ++c) grad[c] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = m + r * cols;
    for (int64_t c = 0; c < cols; ++c) grad[c] += row[c];
  }
}

void GeluForward(const float* pre, int64_t n, float* act) {
  for (int64_t i = 0; i < n; ++i) act[i] = Gelu(pre[i]);
}

void MulGeluGrad(const float* pre, int64_t n, float* dpre) {
  for (int64_t i = 0; i < n; ++i) dpre[i] *= GeluGrad(pre[i]);
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

void UseSingleThreadedBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

float Gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

float GeluGrad(float x) {
  const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * std::exp(-0.5f * x * x);
  return cdf + x * pdf;
}

void BlockForwardPartial(const BlockWeights& w, int64_t batch, int64_t hidden, int64_t inner,
                         const float* x, float* pre, float* act, float* partial) {
  // pre [B,inner] = x [B,h] * W1s^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, inner, hidden, 1.0f, x, hidden, w.w1,
              hidden, 0.0f, pre, inner);
  AddBias(w.b1, batch, inner, pre);
  GeluForward(pre, batch * inner, act);
  // partial [B,h] = act [B,inner] * W2s^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, hidden, inner, 1.0f, act, inner, w.w2,
              inner, 0.0f, partial, hidden);
}

void BlockForwardFinish(const float* b2, int64_t batch, int64_t hidden, const float* x, float* y) {
  // + b2, then + x (the residual), in this order on every path.
  AddBias(b2, batch, hidden, y);
  AddInPlace(x, batch * hidden, y);
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
  MulGeluGrad(pre, batch * inner, dpre);
  // dW1s [inner,h] = dpre^T [inner,B] * x [B,h]; db1s = column sums of dpre.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, inner, hidden, batch, 1.0f, dpre, inner, x,
              hidden, 0.0f, grads.w1, hidden);
  SumRows(dpre, batch, inner, grads.b1);
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
