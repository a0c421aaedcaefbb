// The one home of the project's 16-bit float rules: fp32 <-> bf16 and
// fp32 <-> fp16 (IEEE binary16), scalar, on bits, so that no result depends
// on a compiler's or a device's conversion instructions.
//
// Header-only and usable from host C++ and from CUDA device code. Every
// scalar conversion in the project goes through these functions: the CPU
// kernels' scalar paths and SIMD tails (kernels/cpu), the CUDA kernels
// (kernels/cuda), and the public zeroshard::Fp32ToBf16 / Bf16ToFp32 /
// Fp32ToFp16 / Fp16ToFp32 (engine/src/common/dtype.cc), which the engine and
// the tests use. The AVX2 / AVX-512 conversions (kernels/cpu/internal/simd_*.h)
// are vectorised implementations of the same rules; tests/kernels/cast_test.cc
// holds them to these functions bit for bit.
//
// The rules:
//  - fp32 -> bf16 rounds to nearest, ties to even (on bits: add 0x7fff plus
//    the lowest kept bit, then truncate; a carry correctly bumps the
//    exponent, up to infinity). NaN keeps its sign and top payload bits and
//    becomes quiet (bit 6 of the bf16 set).
//  - bf16 -> fp32 is exact: the 16 bits become the high half.
//  - fp32 -> fp16 rounds to nearest, ties to even; |x| >= 65520 (the
//    midpoint above the largest half, 65504) becomes inf; results below
//    2^-14 are exact subnormals (gradual underflow); NaN keeps its sign and
//    the top 10 payload bits and becomes quiet (sign | 0x7e00 | payload >> 13).
//  - fp16 -> fp32 is exact and moves NaN payloads unchanged (a signalling NaN
//    stays signalling).
#ifndef ZEROSHARD_KERNELS_COMMON_FLOAT16_RULES_H_
#define ZEROSHARD_KERNELS_COMMON_FLOAT16_RULES_H_

#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace zeroshard::kernels {

// The bits of an fp32 and back. Device code has intrinsics for it; host code
// uses memcpy, which compilers turn into a register move.
ZS_HOST_DEVICE_INLINE uint32_t Fp32AsBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

ZS_HOST_DEVICE_INLINE float BitsAsFp32(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

ZS_HOST_DEVICE_INLINE uint16_t Fp32ToBf16Rne(float x) {
  const uint32_t bits = Fp32AsBits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

ZS_HOST_DEVICE_INLINE float Bf16ToFp32(uint16_t h) {
  return BitsAsFp32(static_cast<uint32_t>(h) << 16);
}

ZS_HOST_DEVICE_INLINE uint16_t Fp32ToFp16Rne(float x) {
  const uint32_t bits = Fp32AsBits(x);
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

ZS_HOST_DEVICE_INLINE float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32 (a normal number or
    // zero), so the product rounds nothing.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    bits = Fp32AsBits(magnitude) | sign;
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  }
  return BitsAsFp32(bits);
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_COMMON_FLOAT16_RULES_H_
