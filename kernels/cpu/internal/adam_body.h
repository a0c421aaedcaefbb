// The vector loop of the Adam/AdamW element rule, shared by the SIMD paths so
// that they cannot drift apart. The rule itself (and the scalar tail) is
// AdamElementAs of kernels/common/adam_element.h, which the scalar path and
// the CUDA kernel call too.
//
// A path supplies a vector traits type V (see simd_avx2.h) with:
//   using Reg; static constexpr size_t kWidth;
//   Reg Set1(float); Reg Load(const float*); void Store(float*, Reg);
//   Reg LoadBf16(const uint16_t*); Reg LoadFp16(const uint16_t*);  (exact widening)
//   void StoreBf16(uint16_t*, Reg); void StoreFp16(uint16_t*, Reg); (round to nearest even)
//   Reg Add, Sub, Mul, Div, Sqrt   (IEEE, correctly rounded; never FMA)
// with the 16-bit conversions bit-identical to the scalar rules in
// kernels/common/float16_rules.h. Each operation below is one fp32 operation
// in the order of the contract in adam.h (the order of AdamElementAs), on
// every lane and in the scalar tail, so all paths give the same bits.
// V must be defined in an anonymous namespace of the including file so that
// the instantiations of AdamLoop stay local to that file and its ISA flags.
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_ADAM_BODY_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_ADAM_BODY_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/common/adam_element.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/internal/format.h"

namespace zeroshard::kernels::internal {

template <class V, Format kFormat>
ZS_KERNEL_INLINE typename V::Reg LoadAsFp32(const Storage<kFormat>* x) {
  if constexpr (kFormat == Format::kFp32) {
    return V::Load(x);
  } else if constexpr (kFormat == Format::kBf16) {
    return V::LoadBf16(x);
  } else {
    return V::LoadFp16(x);
  }
}

// Applies the update to n elements. kGrad is the format of `grad`; kOut is
// the format of the param copy written to param_out: kBf16 or kFp16 (the new
// master rounded to nearest even), or kFp32 for none (the master is the param
// and param_out is unused).
template <class V, AdamMode kMode, Format kGrad, Format kOut>
ZS_KERNEL_INLINE void AdamLoop(float* p, uint16_t* param_out, const Storage<kGrad>* grad, float* m,
                               float* v, size_t n, const AdamConstants& c) {
  using Reg = typename V::Reg;
  constexpr size_t kW = V::kWidth;
  const Reg grad_scale = V::Set1(c.grad_scale);
  const Reg l2 = V::Set1(c.l2);
  const Reg beta1 = V::Set1(c.beta1);
  const Reg one_minus_beta1 = V::Set1(c.one_minus_beta1);
  const Reg beta2 = V::Set1(c.beta2);
  const Reg one_minus_beta2 = V::Set1(c.one_minus_beta2);
  const Reg inv_sqrt_bc2 = V::Set1(c.inv_sqrt_bias_correction2);
  const Reg eps = V::Set1(c.eps);
  const Reg decay = V::Set1(c.decay_factor);
  const Reg step_size = V::Set1(c.step_size);

  auto update = [&](size_t i) __attribute__((always_inline)) {
    Reg g = V::Mul(LoadAsFp32<V, kGrad>(grad + i), grad_scale);
    Reg pi = V::Load(p + i);
    if constexpr (kMode == AdamMode::kAdamL2) g = V::Add(g, V::Mul(l2, pi));
    const Reg mi = V::Add(V::Mul(beta1, V::Load(m + i)), V::Mul(one_minus_beta1, g));
    const Reg vi = V::Add(V::Mul(beta2, V::Load(v + i)), V::Mul(one_minus_beta2, V::Mul(g, g)));
    const Reg denom = V::Add(V::Mul(V::Sqrt(vi), inv_sqrt_bc2), eps);
    if constexpr (kMode == AdamMode::kAdamW) pi = V::Mul(pi, decay);
    pi = V::Sub(pi, V::Mul(step_size, V::Div(mi, denom)));
    V::Store(m + i, mi);
    V::Store(v + i, vi);
    V::Store(p + i, pi);
    if constexpr (kOut == Format::kBf16) V::StoreBf16(param_out + i, pi);
    if constexpr (kOut == Format::kFp16) V::StoreFp16(param_out + i, pi);
  };

  // Two vectors per iteration: the loop is bound by memory, and the second
  // independent chain hides the sqrt/div latency behind the loads.
  size_t i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    update(i);
    update(i + kW);
  }
  for (; i + kW <= n; i += kW) update(i);
  for (; i < n; ++i) {
    AdamElementAs<kMode>(c, ToFp32<kGrad>(grad[i]), p[i], m[i], v[i]);
    if constexpr (kOut == Format::kBf16) param_out[i] = Fp32ToBf16Rne(p[i]);
    if constexpr (kOut == Format::kFp16) param_out[i] = Fp32ToFp16Rne(p[i]);
  }
}

// One public variant for one traits type, with the mode chosen at run time.
template <class V, Format kGrad, Format kOut>
void AdamWith(float* master, uint16_t* param_out, const Storage<kGrad>* g, float* m, float* v,
              size_t n, const AdamConstants& c) {
  if (c.mode == AdamMode::kAdamW) {
    AdamLoop<V, AdamMode::kAdamW, kGrad, kOut>(master, param_out, g, m, v, n, c);
  } else {
    AdamLoop<V, AdamMode::kAdamL2, kGrad, kOut>(master, param_out, g, m, v, n, c);
  }
}

// Defines the per-path entry points of paths.h for traits V and a suffix.
#define ZS_DEFINE_ADAM_PATH(V, suffix)                                                         \
  void AdamFp32##suffix(float* param, const float* grad, float* m, float* v, size_t n,         \
                        const AdamConstants& c) {                                              \
    AdamWith<V, Format::kFp32, Format::kFp32>(param, nullptr, grad, m, v, n, c);               \
  }                                                                                            \
  void AdamMixedBf16##suffix(float* master, uint16_t* param_out, const float* grad, float* m,  \
                             float* v, size_t n, const AdamConstants& c) {                     \
    AdamWith<V, Format::kFp32, Format::kBf16>(master, param_out, grad, m, v, n, c);            \
  }                                                                                            \
  void AdamMixedBf16GradBf16##suffix(float* master, uint16_t* param_out, const uint16_t* grad, \
                                     float* m, float* v, size_t n, const AdamConstants& c) {   \
    AdamWith<V, Format::kBf16, Format::kBf16>(master, param_out, grad, m, v, n, c);            \
  }                                                                                            \
  void AdamMixedFp16##suffix(float* master, uint16_t* param_out, const float* grad, float* m,  \
                             float* v, size_t n, const AdamConstants& c) {                     \
    AdamWith<V, Format::kFp32, Format::kFp16>(master, param_out, grad, m, v, n, c);            \
  }                                                                                            \
  void AdamMixedFp16GradFp16##suffix(float* master, uint16_t* param_out, const uint16_t* grad, \
                                     float* m, float* v, size_t n, const AdamConstants& c) {   \
    AdamWith<V, Format::kFp16, Format::kFp16>(master, param_out, grad, m, v, n, c);            \
  }

}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_ADAM_BODY_H_
