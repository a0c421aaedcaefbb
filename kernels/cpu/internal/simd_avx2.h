// AVX2 vector traits for the shared kernel bodies (8 fp32 lanes). Include only
// from files compiled with -mavx2 -mf16c; everything here is in an anonymous
// namespace so that it stays local to that file and its flags (adam_body.h).
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/cpu/internal/kernel_inline.h"

namespace zeroshard::kernels::internal {
namespace {

// bf16 -> fp32 is exact: the 16 bits become the high half of the fp32.
ZS_KERNEL_INLINE __m256 Bf16x8ToFp32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// fp32 -> bf16, round to nearest even, NaN quieted: the same integer recipe
// as Fp32ToBf16Rne, lane by lane.
ZS_KERNEL_INLINE __m128i Fp32x8ToBf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Every lane holds a value below 2^16, so unsigned saturation is exact.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// fp16 -> fp32 with F16C. vcvtph2ps is exact except that it quiets a
// signalling NaN (sets fp32 bit 22); the contract (Fp16ToFp32) moves the
// payload unchanged, so the lanes that held a signalling NaN get bit 22
// cleared again.
ZS_KERNEL_INLINE __m256 Fp16x8ToFp32(__m128i h) {
  const __m256 x = _mm256_cvtph_ps(h);
  const __m128i quiet_bit = _mm_set1_epi16(0x0200);
  // |h| > inf: a signed 16-bit compare is exact, |h| is at most 0x7fff.
  const __m128i nan =
      _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
  const __m128i quiet = _mm_cmpeq_epi16(_mm_and_si128(h, quiet_bit), quiet_bit);
  const __m256i signalling = _mm256_cvtepi16_epi32(_mm_andnot_si128(quiet, nan));
  return _mm256_castsi256_ps(_mm256_andnot_si256(
      _mm256_and_si256(signalling, _mm256_set1_epi32(0x00400000)), _mm256_castps_si256(x)));
}

// fp32 -> fp16 with F16C, rounding to nearest even whatever MXCSR.RC says.
// Its bits equal Fp32ToFp16Rne for every fp32 input, NaN payloads included
// (checked over all 2^32 inputs), so no fix-up is needed.
ZS_KERNEL_INLINE __m128i Fp32x8ToFp16(__m256 x) {
  return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

struct Avx2Vec {
  using Reg = __m256;
  static constexpr size_t kWidth = 8;
  static ZS_KERNEL_INLINE Reg Set1(float x) { return _mm256_set1_ps(x); }
  static ZS_KERNEL_INLINE Reg Load(const float* p) { return _mm256_loadu_ps(p); }
  static ZS_KERNEL_INLINE void Store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
  static ZS_KERNEL_INLINE Reg LoadBf16(const uint16_t* p) {
    return Bf16x8ToFp32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static ZS_KERNEL_INLINE Reg LoadFp16(const uint16_t* p) {
    return Fp16x8ToFp32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static ZS_KERNEL_INLINE void StoreBf16(uint16_t* p, Reg x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Fp32x8ToBf16(x));
  }
  static ZS_KERNEL_INLINE void StoreFp16(uint16_t* p, Reg x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Fp32x8ToFp16(x));
  }
  static ZS_KERNEL_INLINE Reg Add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static ZS_KERNEL_INLINE Reg Sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static ZS_KERNEL_INLINE Reg Mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static ZS_KERNEL_INLINE Reg Div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static ZS_KERNEL_INLINE Reg Sqrt(Reg a) { return _mm256_sqrt_ps(a); }
};

}  // namespace
}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_
