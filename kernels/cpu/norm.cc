// Block sums of squares: the scalar path (the shared one-block rule) and the
// dispatching entry points.
#include "kernels/cpu/norm.h"

#include <cstddef>
#include <cstdint>

#include "kernels/common/norm_block.h"
#include "kernels/cpu/internal/check.h"
#include "kernels/cpu/internal/paths.h"

namespace zeroshard::kernels {
namespace internal {
namespace {

// The scalar path: the shared one-block rule over every block.
template <class Loader, class T>
void BlockSumSquaresScalar(const T* x, size_t n, double* out) {
  for (size_t start = 0; start < n; start += kNormBlock) {
    const size_t len = n - start < kNormBlock ? n - start : kNormBlock;
    out[start / kNormBlock] = NormBlockSumSquares(Loader{x + start}, len);
  }
}

}  // namespace

void BlockSumSquaresFp32Scalar(const float* x, size_t n, double* out) {
  BlockSumSquaresScalar<Fp32Loader>(x, n, out);
}

void BlockSumSquaresBf16Scalar(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresScalar<Bf16Loader>(x, n, out);
}

void BlockSumSquaresFp16Scalar(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresScalar<Fp16Loader>(x, n, out);
}

}  // namespace internal

void BlockSumSquaresFp32On(Isa isa, const float* x, size_t n, double* out) {
  ZS_DISPATCH_KERNEL(isa, BlockSumSquaresFp32, x, n, out);
}

void BlockSumSquaresBf16On(Isa isa, const uint16_t* x, size_t n, double* out) {
  ZS_DISPATCH_KERNEL(isa, BlockSumSquaresBf16, x, n, out);
}

void BlockSumSquaresFp16On(Isa isa, const uint16_t* x, size_t n, double* out) {
  ZS_DISPATCH_KERNEL(isa, BlockSumSquaresFp16, x, n, out);
}

void BlockSumSquaresFp32(const float* x, size_t n, double* out) {
  BlockSumSquaresFp32On(ActiveIsa(), x, n, out);
}

void BlockSumSquaresBf16(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresBf16On(ActiveIsa(), x, n, out);
}

void BlockSumSquaresFp16(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresFp16On(ActiveIsa(), x, n, out);
}

}  // namespace zeroshard::kernels
