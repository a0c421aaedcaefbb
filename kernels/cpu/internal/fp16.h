// Scalar fp16 (IEEE binary16) <-> fp32 conversion shared by every CPU path
// (the tails of the SIMD loops and the scalar path). The rule is the engine's
// zeroshard::Fp32ToFp16 / Fp16ToFp32 (engine/src/common/dtype.cc), which the
// kernels may not include:
//  - fp32 -> fp16 rounds to nearest, ties to even; |x| >= 65520 (the midpoint
//    above the largest half, 65504) becomes inf; results below 2^-14 are
//    exact subnormals (gradual underflow); NaN keeps its sign and the top 10
//    payload bits and becomes quiet (sign | 0x7e00 | payload >> 13).
//  - fp16 -> fp32 is exact and moves NaN payloads unchanged (a signalling
//    NaN stays signalling).
// F16C's vcvtps2ph (imm8 = round to nearest) gives the same bits as the
// first rule for every fp32 input, NaNs included; vcvtph2ps quiets signalling
// NaNs, which the SIMD paths undo (simd_avx2.h).
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_FP16_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_FP16_H_

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/kernel_inline.h"

namespace zeroshard::kernels::internal {

ZS_KERNEL_INLINE uint16_t Fp32ToFp16Rne(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  // 0x477ff000 is 65520: its tie goes to the even neighbour 65536, i.e. inf.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs >= 0x38800000u) {  // a normal half (|x| >= 2^-14)
    const uint32_t mantissa = abs & 0x7fffffu;
    uint32_t half = (((abs >> 23) - 127 + 15) << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    // A carry out of the mantissa correctly bumps the exponent.
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // A subnormal half, in units of 2^-24. |x| <= 2^-25 rounds to zero (the tie
  // at exactly 2^-25 goes to the even value 0); that covers fp32 subnormals.
  if (abs <= 0x33000000u) return static_cast<uint16_t>(sign);
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - (abs >> 23);  // in [14, 24]
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

ZS_KERNEL_INLINE float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32 (a normal number or
    // zero), so the product rounds nothing.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&bits, &magnitude, sizeof(bits));
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  }
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_FP16_H_
