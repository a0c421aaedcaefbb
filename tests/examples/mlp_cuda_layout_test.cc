// The row-major -> column-major mapping of the MLP's cuBLASLt products
// (examples/mlp/cuda/internal/column_major.h), checked on the host: a plain
// C++ emulation of cuBLASLt's column-major semantics, fed the mapped call,
// must give the row-major product for every transpose pair and for leading
// dimensions wider than the rows. Pure C++: runs without CUDA.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "examples/mlp/cuda/internal/column_major.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace internal {
namespace {

// Element (i, j) of op(M) for a column-major stored matrix.
double ColumnMajorOp(const std::vector<double>& data, const ColumnMajorMatrix& m, int64_t i,
                     int64_t j) {
  const int64_t r = m.transposed ? j : i;
  const int64_t c = m.transposed ? i : j;
  EXPECT_LT(r, m.rows);
  EXPECT_LT(c, m.cols);
  return data[static_cast<size_t>(r + c * m.ld)];
}

// cuBLASLt's D = op(first) op(second), column-major, from the mapped call.
std::vector<double> EmulateColumnMajor(const ColumnMajorGemm& g, const std::vector<double>& first,
                                       const std::vector<double>& second, size_t out_size) {
  const int64_t rows = g.first.transposed ? g.first.cols : g.first.rows;
  const int64_t inner = g.first.transposed ? g.first.rows : g.first.cols;
  const int64_t cols = g.second.transposed ? g.second.rows : g.second.cols;
  EXPECT_EQ(inner, g.second.transposed ? g.second.cols : g.second.rows) << "inner sizes";
  EXPECT_EQ(rows, g.out.rows);
  EXPECT_EQ(cols, g.out.cols);
  EXPECT_GE(g.first.ld, g.first.rows);
  EXPECT_GE(g.second.ld, g.second.rows);
  EXPECT_GE(g.out.ld, g.out.rows);
  std::vector<double> out(out_size, -1.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0.0;
      for (int64_t l = 0; l < inner; ++l) {
        sum += ColumnMajorOp(first, g.first, i, l) * ColumnMajorOp(second, g.second, l, j);
      }
      out[static_cast<size_t>(i + j * g.out.ld)] = sum;
    }
  }
  return out;
}

TEST(MlpCudaColumnMajor, MappedCallGivesTheRowMajorProduct) {
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed());
  std::uniform_int_distribution<int> size(1, 9), pad(0, 3), value(-8, 8);
  for (int trial = 0; trial < 200; ++trial) {
    const bool trans_a = trial % 2 == 1, trans_b = (trial / 2) % 2 == 1;
    const int64_t m = size(rng), n = size(rng), k = size(rng);
    // Row-major storage: A is [m, k] (or [k, m] transposed), B [k, n] (or [n, k]).
    const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    const int64_t lda = a_cols + pad(rng), ldb = b_cols + pad(rng), ldc = n + pad(rng);
    std::vector<double> a(static_cast<size_t>(a_rows * lda)), b(static_cast<size_t>(b_rows * ldb));
    for (double& x : a) x = value(rng);  // small integers: every sum exact
    for (double& x : b) x = value(rng);
    auto op_a = [&](int64_t i, int64_t l) { return trans_a ? a[l * lda + i] : a[i * lda + l]; };
    auto op_b = [&](int64_t l, int64_t j) { return trans_b ? b[j * ldb + l] : b[l * ldb + j]; };

    const ColumnMajorGemm g = ToColumnMajor(trans_a, trans_b, m, n, k, lda, ldb, ldc);
    // The row-major B is cuBLASLt's first operand, A its second.
    const std::vector<double> c = EmulateColumnMajor(g, b, a, static_cast<size_t>(m * ldc));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0.0;
        for (int64_t l = 0; l < k; ++l) want += op_a(i, l) * op_b(l, j);
        ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], want)
            << "trans_a " << trans_a << " trans_b " << trans_b << " m " << m << " n " << n << " k "
            << k << " element (" << i << ", " << j << ")";
      }
    }
  }
}

}  // namespace
}  // namespace internal
}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
