// The AVX2 cast path (compiled with -mavx2 -mf16c; see kernels/CMakeLists.txt).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/cpu/internal/paths.h"
#include "kernels/cpu/internal/simd_avx2.h"

namespace zeroshard::kernels::internal {

void CastFp32ToBf16Avx2(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Fp32x8ToBf16(_mm256_loadu_ps(in + i)));
  }
  for (; i < n; ++i) out[i] = Fp32ToBf16Rne(in[i]);
}

void CastBf16ToFp32Avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     Bf16x8ToFp32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = Bf16ToFp32(in[i]);
}

void CastFp32ToFp16Avx2(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Fp32x8ToFp16(_mm256_loadu_ps(in + i)));
  }
  for (; i < n; ++i) out[i] = Fp32ToFp16Rne(in[i]);
}

void CastFp16ToFp32Avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     Fp16x8ToFp32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = Fp16ToFp32(in[i]);
}

}  // namespace zeroshard::kernels::internal
