// Scalar bf16 <-> fp32 conversion shared by every CPU path (the tails of the
// SIMD loops and the scalar path). The rule is the engine's Fp32ToBf16: round
// to nearest, ties to even; NaN stays NaN and becomes quiet.
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_BF16_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_BF16_H_

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/kernel_inline.h"

namespace zeroshard::kernels::internal {

ZS_KERNEL_INLINE uint16_t Fp32ToBf16Rne(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

ZS_KERNEL_INLINE float Bf16ToFp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_BF16_H_
