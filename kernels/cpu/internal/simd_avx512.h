// AVX-512 vector traits for the shared kernel bodies (16 fp32 lanes). Include
// only from files compiled with -mavx512f -mavx512bw -mavx512dq -mf16c (see
// adam_body.h for why the traits must stay local to the file).
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_SIMD_AVX512_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_SIMD_AVX512_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/cpu/internal/kernel_inline.h"

namespace zeroshard::kernels::internal {
namespace {

ZS_KERNEL_INLINE __m512 Bf16x16ToFp32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The same integer recipe as Fp32ToBf16Rne. (The AVX512-BF16 instruction
// vcvtneps2bf16 is not used: it flushes subnormal inputs to zero.)
ZS_KERNEL_INLINE __m256i Fp32x16ToBf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
  return _mm512_cvtepi32_epi16(r);  // truncating narrow; every lane is below 2^16
}

// fp16 -> fp32: vcvtph2ps quiets signalling NaNs, which the contract keeps
// signalling (see Fp16x8ToFp32 in simd_avx2.h): clear bit 22 in those lanes.
ZS_KERNEL_INLINE __m512 Fp16x16ToFp32(__m256i h) {
  const __m512i x = _mm512_castps_si512(_mm512_cvtph_ps(h));
  const __m512i h32 = _mm512_cvtepu16_epi32(h);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(h32, _mm512_set1_epi32(0x7fff)),
                                                _mm512_set1_epi32(0x7c00));
  const __mmask16 quiet = _mm512_test_epi32_mask(h32, _mm512_set1_epi32(0x0200));
  const __mmask16 signalling = _kandn_mask16(quiet, nan);
  return _mm512_castsi512_ps(
      _mm512_mask_and_epi32(x, signalling, x, _mm512_set1_epi32(~0x00400000)));
}

// fp32 -> fp16, round to nearest even: the same conversion as F16C's
// (Fp32x8ToFp16), equal to Fp32ToFp16Rne for every input.
ZS_KERNEL_INLINE __m256i Fp32x16ToFp16(__m512 x) {
  return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

struct Avx512Vec {
  using Reg = __m512;
  static constexpr size_t kWidth = 16;
  static ZS_KERNEL_INLINE Reg Set1(float x) { return _mm512_set1_ps(x); }
  static ZS_KERNEL_INLINE Reg Load(const float* p) { return _mm512_loadu_ps(p); }
  static ZS_KERNEL_INLINE void Store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static ZS_KERNEL_INLINE Reg LoadBf16(const uint16_t* p) {
    return Bf16x16ToFp32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static ZS_KERNEL_INLINE Reg LoadFp16(const uint16_t* p) {
    return Fp16x16ToFp32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static ZS_KERNEL_INLINE void StoreBf16(uint16_t* p, Reg x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), Fp32x16ToBf16(x));
  }
  static ZS_KERNEL_INLINE void StoreFp16(uint16_t* p, Reg x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), Fp32x16ToFp16(x));
  }
  static ZS_KERNEL_INLINE Reg Add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static ZS_KERNEL_INLINE Reg Sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static ZS_KERNEL_INLINE Reg Mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static ZS_KERNEL_INLINE Reg Div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static ZS_KERNEL_INLINE Reg Sqrt(Reg a) { return _mm512_sqrt_ps(a); }
};

}  // namespace
}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_SIMD_AVX512_H_
