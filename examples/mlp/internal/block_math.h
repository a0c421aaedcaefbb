// The residual-MLP math on raw fp32 arrays, apart from the engine so that it
// can be tested against a double-precision reference.
//
// One block on a row-major micro-batch x [batch, hidden]:
//   pre = x W1^T + b1          [batch, 4*hidden]
//   act = gelu(pre)            exact GELU: pre * Phi(pre) = 0.5 pre (1 + erf(pre / sqrt(2)))
//   y   = x + act W2^T + b2    [batch, hidden]
// with W1 [4*hidden, hidden], b1 [4*hidden], W2 [hidden, 4*hidden], b2 [hidden].
//
// Every result depends only on its inputs and sizes (single-threaded BLAS,
// bias sums in a fixed order), never on which rank computes it: that is what
// makes a distributed run match the one-rank baseline bit for bit.
#ifndef ZEROSHARD_EXAMPLES_MLP_INTERNAL_BLOCK_MATH_H_
#define ZEROSHARD_EXAMPLES_MLP_INTERNAL_BLOCK_MATH_H_

#include <cstdint>
#include <vector>

namespace zeroshard {
namespace mlp {
namespace internal {

// Inner (expanded) width of a block.
inline int64_t InnerSize(int64_t hidden) { return 4 * hidden; }

// Pointers to one block's fp32 weights (not owned).
struct BlockWeights {
  const float* w1 = nullptr;  // [4h, h]
  const float* b1 = nullptr;  // [4h]
  const float* w2 = nullptr;  // [h, 4h]
  const float* b2 = nullptr;  // [h]
};

// Where one block's fp32 gradients go (not owned); every element is
// overwritten, never accumulated into.
struct BlockGradients {
  float* w1 = nullptr;
  float* b1 = nullptr;
  float* w2 = nullptr;
  float* b2 = nullptr;
};

// The gradients of a block whose fp32 params are stored concatenated
// [W1 b1 W2 b2] at `base`, with `inner` rows of W1 (InnerSize(hidden), or a
// tensor-parallel shard's part of them).
inline BlockGradients BlockGradientsIn(float* base, int64_t inner, int64_t hidden) {
  BlockGradients g;
  g.w1 = base;
  g.b1 = g.w1 + inner * hidden;
  g.w2 = g.b1 + inner;
  g.b2 = g.w2 + hidden * inner;
  return g;
}

// Forward activations of a whole network for one micro-batch, kept for the
// backward pass. inputs[i] is the input of block i (inputs[blocks] is the
// network output); pre[i] and act[i] are block i's pre-activation and GELU.
struct ForwardState {
  std::vector<std::vector<float>> inputs;
  std::vector<std::vector<float>> pre;
  std::vector<std::vector<float>> act;

  // Sizes every array for `blocks` blocks of a [batch, hidden] micro-batch,
  // pre and act with `inner` columns (-1: InnerSize(hidden); a tensor-
  // parallel shard holds fewer).
  void Resize(int blocks, int64_t batch, int64_t hidden, int64_t inner = -1);
  const std::vector<float>& output() const { return inputs.back(); }
};

// Sets up the CPU BLAS once per process (examples::SetUpCpuBlas): OpenBLAS's
// kernel path chosen for this CPU, and one thread (determinism, and several
// ranks-as-threads on few cores). Call before any product runs on another
// thread.
void UseSingleThreadedBlas();

// Exact (erf-based) GELU, x * Phi(x) with Phi the standard normal CDF, and
// its derivative Phi(x) + x * phi(x), in fp32 arithmetic that the compiler
// vectorizes (no libm calls): Phi from erfc's Chebyshev fit (Numerical
// Recipes' erfcc, relative error < 1.2e-7) on |x| / sqrt(2), which is
// accurate in relative terms in the negative tail where 1 + erf(x / sqrt(2))
// cancels; exp by Cody-Waite reduction and a degree-6 polynomial. Against a
// double reference: |Gelu error| <= 4e-7 (1 + |gelu(x)|), see mlp_test.
// The loops of BiasGelu / GeluBackwardBiasGrad compute exactly these bits.
float Gelu(float x);
// d gelu(x) / dx.
float GeluGrad(float x);

// The element-wise parts of a block, exposed for the benchmark
// (perf/examples/mlp_block_bench) and the tests. Each is one pass over its
// arrays, fusing what would otherwise be separate sweeps over memory.
//
// pre[r, c] += b1[c], then act[r, c] = Gelu(pre[r, c]); pre, act [rows, cols].
void BiasGelu(const float* b1, int64_t rows, int64_t cols, float* pre, float* act);
// The GELU backward and b1's gradient: dpre[r, c] *= GeluGrad(pre[r, c])
// (dpre holds dL/dact on entry), and db1[c] = sum over rows of the new
// dpre[r, c], rows summed in order (as SumRows). A product below FLT_MIN in
// magnitude (subnormal) is written as 0: when a step's weights blow up (the
// demo's steps 2-4), pre-activations far in GELU's negative tail made up to
// 11% of dpre subnormal, and dpre is an operand of the next two sgemms,
// whose SSE kernels (OpenBLAS's generic fallback) take a microcode assist
// per subnormal operand: 2.6x that product's time on this AMD CPU, more on
// Intel's. Such a gradient contributes less than 1.2e-38.
void GeluBackwardBiasGrad(const float* pre, int64_t rows, int64_t cols, float* dpre, float* db1);
// y[r, c] = (y[r, c] + b2[c]) + x[r, c]: bias, then residual.
void BiasResidual(const float* b2, const float* x, int64_t rows, int64_t cols, float* y);
// sum[c] = sum over rows of m[r, c], rows summed in order (fixed, so the
// result does not depend on who computes it).
void SumRows(const float* m, int64_t rows, int64_t cols, float* sum);
// dst[i] += src[i].
void AddInPlace(const float* src, int64_t n, float* dst);

// One block forward: reads x, writes pre, act and y (y must not alias x).
void BlockForward(const BlockWeights& w, int64_t batch, int64_t hidden, const float* x, float* pre,
                  float* act, float* y);

// One block backward. Given the saved x, pre, act and dL/dy, writes dL/dx
// (must not alias dy; may be null when not needed, as for the first block)
// and the four parameter gradients. `scratch` holds batch*4h floats.
void BlockBackward(const BlockWeights& w, int64_t batch, int64_t hidden, const float* x,
                   const float* pre, const float* act, const float* dy, float* scratch, float* dx,
                   const BlockGradients& grads);

// Tensor-parallel halves of a block (Megatron-LM's f/g split). A rank of a
// tp group holds `inner` = 4h / tp rows of W1 and b1 (column-parallel),
// the same `inner` columns of W2 as a contiguous [h, inner] matrix
// (row-parallel), and all of b2 (replicated); pre and act are its [batch,
// inner] columns. With inner = 4h (one rank) the two halves are exactly
// BlockForward / BlockBackward: same operations in the same order, so the
// same bits.
//
// Forward, first half: pre = x W1s^T + b1s, act = gelu(pre), and this rank's
// partial output partial = act W2s^T [batch, h]. The caller sums `partial`
// over the tp group in rank order (the g all-reduce), then calls
// BlockForwardFinish: y = (partial + b2) + x.
void BlockForwardPartial(const BlockWeights& w, int64_t batch, int64_t hidden, int64_t inner,
                         const float* x, float* pre, float* act, float* partial);
void BlockForwardFinish(const float* b2, int64_t batch, int64_t hidden, const float* x, float* y);

// Backward, first half: from the replicated dy, writes this rank's dW1s,
// db1s, dW2s and the replicated db2 (the same on every tp rank, so it needs
// no reduction), and dx_partial = dpre W1s [batch, h] (may be null: not
// needed). `scratch` holds batch*inner floats. The caller sums dx_partial
// over the tp group (f's backward), then calls BlockBackwardFinish:
// dx = dx_partial + dy.
void BlockBackwardPartial(const BlockWeights& w, int64_t batch, int64_t hidden, int64_t inner,
                          const float* x, const float* pre, const float* act, const float* dy,
                          float* scratch, float* dx_partial, const BlockGradients& grads);
void BlockBackwardFinish(const float* dy, int64_t batch, int64_t hidden, float* dx);

// Whole network forward: blocks applied in order to x, activations saved in
// `state` (which must be Resize()d for these sizes).
void NetworkForward(const std::vector<BlockWeights>& blocks, int64_t batch, int64_t hidden,
                    const float* x, ForwardState* state);

// Mean squared error over n elements, (1/n) sum (out - target)^2, summed in
// double in index order. Writes dL/dout = 2 (out - target) / n.
double MseLoss(const float* out, const float* target, int64_t n, float* dout);

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_INTERNAL_BLOCK_MATH_H_
