// The AVX2 block sum of squares (compiled with -mavx2 -mf16c; see
// kernels/CMakeLists.txt). Lanes 0-3 live in `lo`, lanes 4-7 in `hi`.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/internal/norm_body.h"
#include "kernels/cpu/internal/paths.h"
#include "kernels/cpu/internal/simd_avx2.h"

namespace zeroshard::kernels::internal {
namespace {

struct Avx2Norm {
  struct Acc {
    __m256d lo, hi;
  };
  static ZS_KERNEL_INLINE Acc Zero() { return Acc{_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static ZS_KERNEL_INLINE Acc AccumulateFp32(Acc acc, __m256 x) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    return Acc{_mm256_add_pd(acc.lo, _mm256_mul_pd(lo, lo)),
               _mm256_add_pd(acc.hi, _mm256_mul_pd(hi, hi))};
  }
  static ZS_KERNEL_INLINE Acc Accumulate(Acc acc, const float* x) {
    return AccumulateFp32(acc, _mm256_loadu_ps(x));
  }
  static ZS_KERNEL_INLINE Acc AccumulateBf16(Acc acc, const uint16_t* x) {
    return AccumulateFp32(acc, Bf16x8ToFp32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
  }
  static ZS_KERNEL_INLINE Acc AccumulateFp16(Acc acc, const uint16_t* x) {
    return AccumulateFp32(acc, Fp16x8ToFp32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
  }
  static ZS_KERNEL_INLINE void Store(const Acc& acc, double* lane) {
    _mm256_storeu_pd(lane, acc.lo);
    _mm256_storeu_pd(lane + 4, acc.hi);
  }
};

}  // namespace

void BlockSumSquaresFp32Avx2(const float* x, size_t n, double* out) {
  BlockSumSquaresWith<Avx2Norm, Format::kFp32>(x, n, out);
}

void BlockSumSquaresBf16Avx2(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresWith<Avx2Norm, Format::kBf16>(x, n, out);
}

void BlockSumSquaresFp16Avx2(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresWith<Avx2Norm, Format::kFp16>(x, n, out);
}

}  // namespace zeroshard::kernels::internal
