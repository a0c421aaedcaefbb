// Block sums of squares: the scalar path and the dispatching entry points.
#include "kernels/cpu/norm.h"

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/internal/check.h"
#include "kernels/cpu/internal/norm_body.h"
#include "kernels/cpu/internal/paths.h"

namespace zeroshard::kernels {
namespace internal {
namespace {

struct ScalarNorm {
  struct Acc {
    double lane[kNormLanes];
  };
  static Acc Zero() { return Acc{}; }
  template <Format kFormat>
  static Acc AccumulateAs(Acc acc, const Storage<kFormat>* x) {
    for (size_t j = 0; j < kNormLanes; ++j) {
      const double xj = ElementToDouble<kFormat>(x[j]);
      acc.lane[j] += xj * xj;
    }
    return acc;
  }
  static Acc Accumulate(Acc acc, const float* x) { return AccumulateAs<Format::kFp32>(acc, x); }
  static Acc AccumulateBf16(Acc acc, const uint16_t* x) {
    return AccumulateAs<Format::kBf16>(acc, x);
  }
  static Acc AccumulateFp16(Acc acc, const uint16_t* x) {
    return AccumulateAs<Format::kFp16>(acc, x);
  }
  static void Store(const Acc& acc, double* lane) {
    for (size_t j = 0; j < kNormLanes; ++j) lane[j] = acc.lane[j];
  }
};

}  // namespace

void BlockSumSquaresFp32Scalar(const float* x, size_t n, double* out) {
  BlockSumSquaresWith<ScalarNorm, Format::kFp32>(x, n, out);
}

void BlockSumSquaresBf16Scalar(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresWith<ScalarNorm, Format::kBf16>(x, n, out);
}

void BlockSumSquaresFp16Scalar(const uint16_t* x, size_t n, double* out) {
  BlockSumSquaresWith<ScalarNorm, Format::kFp16>(x, n, out);
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
