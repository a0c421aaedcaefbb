#include "examples/mlp/internal/lora_math.h"

#include <cblas.h>

namespace zeroshard {
namespace mlp {
namespace internal {
namespace {

// out [B,n] (+)= s * (x [B,k] A^T [k,R]) B^T [R,n]: the adapter's part of a
// linear layer, through the rank-R bottleneck u [B,R] (scratch).
void AddLowRank(const float* x, const float* a, const float* b, int64_t batch, int64_t in,
                int64_t out_dim, int64_t rank, float scale, float* u, float* out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, rank, in, 1.0f, x, in, a, in, 0.0f, u,
              rank);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out_dim, rank, scale, u, rank, b,
              rank, 1.0f, out, out_dim);
}

// The adapters' backward of out = x W^T + s (x A^T) B^T, given dout [B,n]:
// dB [n,R] = s dout^T u with u = x A^T (recomputed: B x R values), g = dout B
// [B,R], dA [R,k] = s g^T x. Leaves g in `g` for dL/dx's low-rank part.
void LowRankBackward(const float* x, const float* a, const float* b, const float* dout,
                     int64_t batch, int64_t in, int64_t out_dim, int64_t rank, float scale,
                     float* u, float* g, float* da, float* db) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, rank, in, 1.0f, x, in, a, in, 0.0f, u,
              rank);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_dim, rank, batch, scale, dout, out_dim,
              u, rank, 0.0f, db, rank);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, rank, out_dim, 1.0f, dout, out_dim,
              b, rank, 0.0f, g, rank);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rank, in, batch, scale, g, rank, x, in, 0.0f,
              da, in);
}

}  // namespace

LoraGradients LoraGradientsIn(float* base, int64_t hidden, int64_t rank) {
  const int64_t inner = InnerSize(hidden);
  LoraGradients g;
  g.a1 = base;
  g.b1 = g.a1 + rank * hidden;
  g.a2 = g.b1 + inner * rank;
  g.b2 = g.a2 + rank * inner;
  return g;
}

int64_t LoraScratchSize(int64_t batch, int64_t hidden, int64_t rank) {
  // dpre [B,4h], u and g [B,R] each, db1 [4h] (computed by the fused GELU
  // pass, then dropped: b1 is frozen).
  const int64_t inner = InnerSize(hidden);
  return batch * inner + 2 * batch * rank + inner;
}

void LoraBlockForward(const BlockWeights& w, const LoraWeights& lora, int64_t batch, int64_t hidden,
                      const float* x, float* pre, float* act, float* y, float* scratch) {
  const int64_t inner = InnerSize(hidden);
  const int64_t r = lora.rank;
  float* u = scratch;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, inner, hidden, 1.0f, x, hidden, w.w1,
              hidden, 0.0f, pre, inner);
  AddLowRank(x, lora.a1, lora.b1, batch, hidden, inner, r, lora.scale, u, pre);
  BiasGelu(w.b1, batch, inner, pre, act);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, hidden, inner, 1.0f, act, inner, w.w2,
              inner, 0.0f, y, hidden);
  AddLowRank(act, lora.a2, lora.b2, batch, inner, hidden, r, lora.scale, u, y);
  BiasResidual(w.b2, x, batch, hidden, y);
}

void LoraBlockBackward(const BlockWeights& w, const LoraWeights& lora, int64_t batch,
                       int64_t hidden, const float* x, const float* pre, const float* act,
                       const float* dy, float* scratch, float* dx, const LoraGradients& grads) {
  const int64_t inner = InnerSize(hidden);
  const int64_t r = lora.rank;
  const float s = lora.scale;
  float* dpre = scratch;
  float* u = dpre + batch * inner;
  float* g = u + batch * r;
  float* db1_unused = g + batch * r;
  // Second linear layer: adapters A2, B2, then dact = dy W2 + s g2 A2.
  LowRankBackward(act, lora.a2, lora.b2, dy, batch, inner, hidden, r, s, u, g, grads.a2, grads.b2);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, inner, hidden, 1.0f, dy, hidden,
              w.w2, inner, 0.0f, dpre, inner);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, inner, r, s, g, r, lora.a2, inner,
              1.0f, dpre, inner);
  GeluBackwardBiasGrad(pre, batch, inner, dpre, db1_unused);
  // First linear layer: adapters A1, B1, then dx = dpre W1 + s g1 A1 + dy.
  LowRankBackward(x, lora.a1, lora.b1, dpre, batch, hidden, inner, r, s, u, g, grads.a1, grads.b1);
  if (dx == nullptr) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, hidden, inner, 1.0f, dpre, inner,
              w.w1, hidden, 0.0f, dx, hidden);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, hidden, r, s, g, r, lora.a1, hidden,
              1.0f, dx, hidden);
  AddInPlace(dy, batch * hidden, dx);
}

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard
