// Fused AdamW / Adam-L2: one functor, one grid-stride kernel, one launcher.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/cuda/adam.cuh"

namespace zeroshard::kernels::cuda {
namespace {

// One element of the contract in kernels/cpu/adam.h, in the same order. The
// explicit _rn intrinsics forbid contraction into FMA even without
// --fmad=false.
struct AdamFunctor {
  AdamConstants c;

  __device__ __forceinline__ void operator()(float grad, float& p, float& m, float& v) const {
    float g = __fmul_rn(grad, c.grad_scale);
    if (c.mode == AdamMode::kAdamL2) g = __fadd_rn(g, __fmul_rn(c.l2, p));
    m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
    v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(c.one_minus_beta2, __fmul_rn(g, g)));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_sqrt_bias_correction2), c.eps);
    if (c.mode == AdamMode::kAdamW) p = __fmul_rn(p, c.decay_factor);
    p = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(m, denom)));
  }
};

__global__ void AdamKernel(AdamFunctor f, float* master, uint16_t* param_out, const float* grad,
                           const uint16_t* grad_bf16, float* m, float* v, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = grad_bf16 != nullptr ? Bf16ToFp32(grad_bf16[i]) : grad[i];
    float p = master[i];
    float mi = m[i];
    float vi = v[i];
    f(g, p, mi, vi);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    // The CPU kernels' rule (kernels/common/float16_rules.h), on bits, so that
    // it cannot depend on the device's conversion instructions.
    if (param_out != nullptr) param_out[i] = Fp32ToBf16Rne(p);
  }
}

}  // namespace

cudaError_t LaunchAdam(float* master, uint16_t* param_out, const float* grad,
                       const uint16_t* grad_bf16, float* m, float* v, size_t n,
                       const AdamConstants& c, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (master == nullptr || m == nullptr || v == nullptr ||
      (grad == nullptr) == (grad_bf16 == nullptr)) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = 256;
  // Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
  constexpr size_t kMaxBlocks = 65535;
  const size_t blocks = std::min(kMaxBlocks, (n + kThreads - 1) / kThreads);
  AdamKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      AdamFunctor{c}, master, param_out, grad, grad_bf16, m, v, n);
  return cudaGetLastError();
}

}  // namespace zeroshard::kernels::cuda
