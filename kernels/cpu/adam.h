// Fused one-pass Adam / AdamW updates on flat CPU buffers.
//
// Numeric contract (identical bits on every ISA path; no FMA contraction):
//   g  = grad * grad_scale                       (grad_scale: averaging, clipping, loss scale)
//   L2 mode:    g = g + weight_decay * p
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * (g * g)
//   denom = sqrt(v) * inv_sqrt_bias_correction2 + eps
//   AdamW mode: p = p * (1 - lr * weight_decay)  (decoupled decay, before the step)
//   p  = p - step_size * (m / denom)             (step_size = lr / bias_correction1)
// all in fp32, with p the fp32 master. The mixed variants then round p to the
// 16-bit param dtype (to nearest even) into `param_out`.
//
// "Identical bits" has one exception: a NaN result may differ between paths
// in sign and payload. Where two NaNs meet (a NaN grad and a NaN moment, or
// the default NaN of inf - inf), x86 returns the first operand's, and the
// compiler orders the operands of + and * as it likes in each path. Finite
// and infinite results are always identical.
//
// Every pointer is to `n` elements; no alignment is required; buffers must not
// overlap. `kernels/reference/adam_reference.h` is the double-precision oracle.
#ifndef ZEROSHARD_KERNELS_CPU_ADAM_H_
#define ZEROSHARD_KERNELS_CPU_ADAM_H_

#include <cstddef>
#include <cstdint>

#include "kernels/common/adam_constants.h"
#include "kernels/cpu/isa.h"

namespace zeroshard::kernels {

// AdamMode and AdamConstants: kernels/common/adam_constants.h (shared with the
// CUDA kernels); kernels/common/adam_element.h is the element rule.

// Hyper-parameters of one optimizer step for one run of elements.
struct AdamStepParams {
  AdamMode mode = AdamMode::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // 0 for no_decay params
  double grad_scale = 1.0;
  int64_t step = 1;  // 1-based, for bias correction
};

// The fp32 constants of one step (derived in double, rounded once to fp32).
AdamConstants MakeAdamConstants(const AdamStepParams& p);

// fp32 params (the master copy), fp32 grads.
void AdamFp32(float* param, const float* grad, float* m, float* v, size_t n,
              const AdamConstants& c);
// fp32 master updated in place, bf16 copy written to `param_out`; grads fp32.
void AdamMixedBf16(float* master, uint16_t* param_out, const float* grad, float* m, float* v,
                   size_t n, const AdamConstants& c);
// Same with bf16 grads.
void AdamMixedBf16GradBf16(float* master, uint16_t* param_out, const uint16_t* grad, float* m,
                           float* v, size_t n, const AdamConstants& c);

// fp16 params (IEEE binary16, rounded to nearest even from the fp32 master),
// with fp32 or fp16 grads.
void AdamMixedFp16(float* master, uint16_t* param_out, const float* grad, float* m, float* v,
                   size_t n, const AdamConstants& c);
void AdamMixedFp16GradFp16(float* master, uint16_t* param_out, const uint16_t* grad, float* m,
                           float* v, size_t n, const AdamConstants& c);

// The same entry points on a named path (for tests and benchmarks); `isa`
// must be one of SupportedIsas().
void AdamFp32On(Isa isa, float* param, const float* grad, float* m, float* v, size_t n,
                const AdamConstants& c);
void AdamMixedBf16On(Isa isa, float* master, uint16_t* param_out, const float* grad, float* m,
                     float* v, size_t n, const AdamConstants& c);
void AdamMixedBf16GradBf16On(Isa isa, float* master, uint16_t* param_out, const uint16_t* grad,
                             float* m, float* v, size_t n, const AdamConstants& c);
void AdamMixedFp16On(Isa isa, float* master, uint16_t* param_out, const float* grad, float* m,
                     float* v, size_t n, const AdamConstants& c);
void AdamMixedFp16GradFp16On(Isa isa, float* master, uint16_t* param_out, const uint16_t* grad,
                             float* m, float* v, size_t n, const AdamConstants& c);

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_ADAM_H_
