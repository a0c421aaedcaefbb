// The one Adam / AdamW element rule, for every implementation: the CPU scalar
// path and SIMD tails (kernels/cpu), the CUDA kernel (kernels/cuda) and the
// tests. It is the numeric contract of kernels/cpu/adam.h written out:
//   g  = g_raw * grad_scale
//   L2 mode:    g = g + l2 * p
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * (g * g)
//   denom = sqrt(v) * inv_sqrt_bias_correction2 + eps
//   AdamW mode: p = p * decay_factor
//   p  = p - step_size * (m / denom)
// each line one or more correctly rounded fp32 operations in that order.
//
// Plain fp32 operators: the code must be compiled without contraction of a
// multiply and an add into an FMA (the CPU kernels use -ffp-contract=off, the
// CUDA kernels --fmad=false) and with IEEE division and square root (CUDA:
// --prec-div=true --prec-sqrt=true). Under those flags every operation is
// the same IEEE operation on the host and on the device, so the bits agree.
#ifndef ZEROSHARD_KERNELS_COMMON_ADAM_ELEMENT_H_
#define ZEROSHARD_KERNELS_COMMON_ADAM_ELEMENT_H_

#include <cmath>

#include "kernels/common/adam_constants.h"
#include "kernels/common/host_device.h"

namespace zeroshard::kernels {

// The correctly rounded fp32 square root on either side.
ZS_HOST_DEVICE_INLINE float SqrtRn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// One element with the mode fixed at compile time (for loops that hoist the
// mode test). `p` is the fp32 master; p, m and v are updated in place.
template <AdamMode kMode>
ZS_HOST_DEVICE_INLINE void AdamElementAs(const AdamConstants& c, float g_raw, float& p, float& m,
                                         float& v) {
  float g = g_raw * c.grad_scale;
  if constexpr (kMode == AdamMode::kAdamL2) g = g + c.l2 * p;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * (g * g);
  const float denom = SqrtRn(v) * c.inv_sqrt_bias_correction2 + c.eps;
  if constexpr (kMode == AdamMode::kAdamW) p = p * c.decay_factor;
  p = p - c.step_size * (m / denom);
}

// One element in the mode of `c`.
ZS_HOST_DEVICE_INLINE void AdamElement(const AdamConstants& c, float g_raw, float& p, float& m,
                                       float& v) {
  if (c.mode == AdamMode::kAdamW) {
    AdamElementAs<AdamMode::kAdamW>(c, g_raw, p, m, v);
  } else {
    AdamElementAs<AdamMode::kAdamL2>(c, g_raw, p, m, v);
  }
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_COMMON_ADAM_ELEMENT_H_
