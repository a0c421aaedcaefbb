// The AVX-512 block sum of squares (compiled with the AVX-512 flags; see
// kernels/CMakeLists.txt). One 8-lane double register holds lanes 0-7.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/internal/norm_body.h"
#include "kernels/cpu/internal/paths.h"
#include "kernels/cpu/internal/simd_avx2.h"

namespace zeroshard::kernels::internal {
namespace {

struct Avx512Norm {
  using Acc = __m512d;
  static ZS_KERNEL_INLINE Acc Zero() { return _mm512_setzero_pd(); }
  static ZS_KERNEL_INLINE Acc AccumulateFp32(Acc acc, __m256 x) {
    const __m512d xd = _mm512_cvtps_pd(x);
    return _mm512_add_pd(acc, _mm512_mul_pd(xd, xd));
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
  static ZS_KERNEL_INLINE void Store(const Acc& acc, double* lane) { _mm512_storeu_pd(lane, acc); }
};

}  // namespace

void BlockSumSquaresFp32Avx512(const float* x, size_t n, double* out) {
  BlockSumSquaresWith<Avx512Norm, Format::kFp32>(x, n, out);
}

void BlockSumSquaresBf16Avx512(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresWith<Avx512Norm, Format::kBf16>(x, n, out);
}

void BlockSumSquaresFp16Avx512(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresWith<Avx512Norm, Format::kFp16>(x, n, out);
}

}  // namespace zeroshard::kernels::internal
