// Adam constants, the scalar path (the shared element rule in a loop) and the
// dispatching entry points.
#include "kernels/cpu/adam.h"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/common/adam_element.h"
#include "kernels/cpu/internal/check.h"
#include "kernels/cpu/internal/format.h"
#include "kernels/cpu/internal/paths.h"

namespace zeroshard::kernels {

AdamConstants MakeAdamConstants(const AdamStepParams& p) {
  // Derived in double and rounded once to fp32, so every rank and every path
  // starts from the same fp32 constants. step < 1 has no bias correction
  // defined (division by zero); callers count steps from 1.
  const double step = static_cast<double>(p.step);
  const double bias_correction1 = 1.0 - std::pow(p.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(p.beta2, step);
  const bool adamw = p.mode == AdamMode::kAdamW;
  AdamConstants c;
  c.mode = p.mode;
  c.beta1 = static_cast<float>(p.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.beta2 = static_cast<float>(p.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  c.eps = static_cast<float>(p.eps);
  c.step_size = static_cast<float>(p.lr / bias_correction1);
  c.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  c.decay_factor = adamw ? static_cast<float>(1.0 - p.lr * p.weight_decay) : 1.0f;
  c.l2 = adamw ? 0.0f : static_cast<float>(p.weight_decay);
  c.grad_scale = static_cast<float>(p.grad_scale);
  return c;
}

namespace internal {
namespace {

// The scalar path: the shared element rule, one element at a time, with the
// mode hoisted out of the loop.
template <AdamMode kMode, Format kGrad, Format kOut>
void AdamScalarLoop(float* p, uint16_t* param_out, const Storage<kGrad>* grad, float* m, float* v,
                    size_t n, const AdamConstants& c) {
  for (size_t i = 0; i < n; ++i) {
    AdamElementAs<kMode>(c, ToFp32<kGrad>(grad[i]), p[i], m[i], v[i]);
    if constexpr (kOut == Format::kBf16) param_out[i] = Fp32ToBf16Rne(p[i]);
    if constexpr (kOut == Format::kFp16) param_out[i] = Fp32ToFp16Rne(p[i]);
  }
}

template <Format kGrad, Format kOut>
void AdamScalar(float* master, uint16_t* param_out, const Storage<kGrad>* grad, float* m, float* v,
                size_t n, const AdamConstants& c) {
  if (c.mode == AdamMode::kAdamW) {
    AdamScalarLoop<AdamMode::kAdamW, kGrad, kOut>(master, param_out, grad, m, v, n, c);
  } else {
    AdamScalarLoop<AdamMode::kAdamL2, kGrad, kOut>(master, param_out, grad, m, v, n, c);
  }
}

}  // namespace

void AdamFp32Scalar(float* param, const float* grad, float* m, float* v, size_t n,
                    const AdamConstants& c) {
  AdamScalar<Format::kFp32, Format::kFp32>(param, nullptr, grad, m, v, n, c);
}
void AdamMixedBf16Scalar(float* master, uint16_t* param_out, const float* grad, float* m, float* v,
                         size_t n, const AdamConstants& c) {
  AdamScalar<Format::kFp32, Format::kBf16>(master, param_out, grad, m, v, n, c);
}
void AdamMixedBf16GradBf16Scalar(float* master, uint16_t* param_out, const uint16_t* grad, float* m,
                                 float* v, size_t n, const AdamConstants& c) {
  AdamScalar<Format::kBf16, Format::kBf16>(master, param_out, grad, m, v, n, c);
}
void AdamMixedFp16Scalar(float* master, uint16_t* param_out, const float* grad, float* m, float* v,
                         size_t n, const AdamConstants& c) {
  AdamScalar<Format::kFp32, Format::kFp16>(master, param_out, grad, m, v, n, c);
}
void AdamMixedFp16GradFp16Scalar(float* master, uint16_t* param_out, const uint16_t* grad, float* m,
                                 float* v, size_t n, const AdamConstants& c) {
  AdamScalar<Format::kFp16, Format::kFp16>(master, param_out, grad, m, v, n, c);
}

}  // namespace internal

void AdamFp32On(Isa isa, float* param, const float* grad, float* m, float* v, size_t n,
                const AdamConstants& c) {
  ZS_DISPATCH_KERNEL(isa, AdamFp32, param, grad, m, v, n, c);
}

void AdamMixedBf16On(Isa isa, float* master, uint16_t* param_out, const float* grad, float* m,
                     float* v, size_t n, const AdamConstants& c) {
  ZS_DISPATCH_KERNEL(isa, AdamMixedBf16, master, param_out, grad, m, v, n, c);
}

void AdamMixedBf16GradBf16On(Isa isa, float* master, uint16_t* param_out, const uint16_t* grad,
                             float* m, float* v, size_t n, const AdamConstants& c) {
  ZS_DISPATCH_KERNEL(isa, AdamMixedBf16GradBf16, master, param_out, grad, m, v, n, c);
}

void AdamMixedFp16On(Isa isa, float* master, uint16_t* param_out, const float* grad, float* m,
                     float* v, size_t n, const AdamConstants& c) {
  ZS_DISPATCH_KERNEL(isa, AdamMixedFp16, master, param_out, grad, m, v, n, c);
}

void AdamMixedFp16GradFp16On(Isa isa, float* master, uint16_t* param_out, const uint16_t* grad,
                             float* m, float* v, size_t n, const AdamConstants& c) {
  ZS_DISPATCH_KERNEL(isa, AdamMixedFp16GradFp16, master, param_out, grad, m, v, n, c);
}

void AdamFp32(float* param, const float* grad, float* m, float* v, size_t n,
              const AdamConstants& c) {
  AdamFp32On(ActiveIsa(), param, grad, m, v, n, c);
}
void AdamMixedBf16(float* master, uint16_t* param_out, const float* grad, float* m, float* v,
                   size_t n, const AdamConstants& c) {
  AdamMixedBf16On(ActiveIsa(), master, param_out, grad, m, v, n, c);
}
void AdamMixedBf16GradBf16(float* master, uint16_t* param_out, const uint16_t* grad, float* m,
                           float* v, size_t n, const AdamConstants& c) {
  AdamMixedBf16GradBf16On(ActiveIsa(), master, param_out, grad, m, v, n, c);
}
void AdamMixedFp16(float* master, uint16_t* param_out, const float* grad, float* m, float* v,
                   size_t n, const AdamConstants& c) {
  AdamMixedFp16On(ActiveIsa(), master, param_out, grad, m, v, n, c);
}
void AdamMixedFp16GradFp16(float* master, uint16_t* param_out, const uint16_t* grad, float* m,
                           float* v, size_t n, const AdamConstants& c) {
  AdamMixedFp16GradFp16On(ActiveIsa(), master, param_out, grad, m, v, n, c);
}

}  // namespace zeroshard::kernels
