// How a row-major product becomes a cuBLASLt (column-major) call. Pure and
// header-only, so a CPU test checks the mapping without a device
// (tests/examples/mlp_cuda_layout_test.cc).
//
// A row-major [r, c] matrix with leading dimension ld is, read column-major,
// its transpose [c, r] with the same ld. So row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T: B becomes cuBLASLt's first operand and
// A its second, with the same transpose flags and m, n swapped. No data
// moves.
#ifndef ZEROSHARD_EXAMPLES_MLP_CUDA_INTERNAL_COLUMN_MAJOR_H_
#define ZEROSHARD_EXAMPLES_MLP_CUDA_INTERNAL_COLUMN_MAJOR_H_

#include <cstdint>

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace internal {

// One column-major matrix as stored (before its transpose flag applies).
struct ColumnMajorMatrix {
  bool transposed = false;  // the op applied to it (C: always false)
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
};

// The cuBLASLt call D = op(first) op(second) for a row-major product.
struct ColumnMajorGemm {
  ColumnMajorMatrix first;   // the row-major B
  ColumnMajorMatrix second;  // the row-major A
  ColumnMajorMatrix out;     // the row-major C, [n, m] column-major
};

// Row-major C [m, n] = op(A) [m, k] * op(B) [k, n], A stored with leading
// dimension lda ([m, k] row-major, or [k, m] when trans_a), B likewise.
inline ColumnMajorGemm ToColumnMajor(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                     int64_t lda, int64_t ldb, int64_t ldc) {
  ColumnMajorGemm g;
  // A stored matrix's column-major shape is its row-major shape reversed.
  g.first = {trans_b, trans_b ? k : n, trans_b ? n : k, ldb};
  g.second = {trans_a, trans_a ? m : k, trans_a ? k : m, lda};
  g.out = {false, n, m, ldc};
  return g;
}

}  // namespace internal
}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_CUDA_INTERNAL_COLUMN_MAJOR_H_
