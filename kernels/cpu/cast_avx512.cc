// The AVX-512 cast path (compiled with the AVX-512 flags; see
// kernels/CMakeLists.txt).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/cpu/internal/paths.h"
#include "kernels/cpu/internal/simd_avx512.h"

namespace zeroshard::kernels::internal {

void CastFp32ToBf16Avx512(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        Fp32x16ToBf16(_mm512_loadu_ps(in + i)));
  }
  for (; i < n; ++i) out[i] = Fp32ToBf16Rne(in[i]);
}

void CastBf16ToFp32Avx512(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i,
                     Bf16x16ToFp32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = Bf16ToFp32(in[i]);
}

void CastFp32ToFp16Avx512(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        Fp32x16ToFp16(_mm512_loadu_ps(in + i)));
  }
  for (; i < n; ++i) out[i] = Fp32ToFp16Rne(in[i]);
}

void CastFp16ToFp32Avx512(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i,
                     Fp16x16ToFp32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = Fp16ToFp32(in[i]);
}

}  // namespace zeroshard::kernels::internal
