// Tests of BlockSumSquares (value, fixed order, identical bits on every path)
// and of ExactSum (order- and split-independent bits, correct rounding).
#include "kernels/cpu/norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/reference/bf16_reference.h"
#include "kernels/reference/fp16_reference.h"
#include "kernels/reference/norm_reference.h"
#include "tests/kernels/isa_report.h"
#include "tests/test_seed.h"

namespace zeroshard::kernels {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

const size_t kSizes[] = {0, 1, 7, 127, 128, 129, 1000, 4099, 300007};

size_t Blocks(size_t n) { return (n + kNormBlock - 1) / kNormBlock; }

// Bitwise equality; memcmp may not see the null data() of an empty vector (n = 0).
bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

uint16_t TruncateToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

// Values over many decades (gradients are like that), including subnormals.
std::vector<float> RandomFloats(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-12.0f, 4.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::pow(10.0f, decade(rng)) * normal(rng);
  if (n > 5) x[n / 2] = 1e-42f;  // subnormal
  return x;
}

// The kernel sums in double: squares are exact, and each block result passes
// through at most 15 additions in a lane plus 3 to combine lanes, all of
// non-negative terms, so its relative error is below 18 * 2^-53. The
// reference sums in long double (2^-64), which is negligible next to that.
constexpr double kBlockRelTol = 18.0 * std::numeric_limits<double>::epsilon() / 2;

TEST(BlockSumSquaresTest, MatchesReferenceOnEveryPath) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  for (Isa isa : SupportedIsas()) {
    for (size_t n : kSizes) {
      for (bool bf16 : {false, true}) {
        // One extra element in front makes every vector load unaligned.
        std::vector<float> xf = RandomFloats(rng, n + 1);
        std::vector<uint16_t> xh(n + 1);
        std::vector<double> xd(n);
        for (size_t i = 0; i < n; ++i) {
          xh[i + 1] = TruncateToBf16(xf[i + 1]);
          xd[i] = bf16 ? reference::Bf16ValueReference(xh[i + 1]) : xf[i + 1];
        }
        std::vector<double> got(Blocks(n), -1.0), want(Blocks(n));
        if (bf16) {
          BlockSumSquaresBf16On(isa, xh.data() + 1, n, got.data());
        } else {
          BlockSumSquaresFp32On(isa, xf.data() + 1, n, got.data());
        }
        reference::BlockSumSquaresReference(xd.data(), n, kNormBlock, want.data());
        for (size_t b = 0; b < got.size(); ++b) {
          ASSERT_LE(std::fabs(got[b] - want[b]), kBlockRelTol * want[b])
              << IsaName(isa) << (bf16 ? " bf16" : " fp32") << " n=" << n << " block " << b << ": "
              << got[b] << " vs " << want[b];
        }
      }
    }
  }
}

TEST(BlockSumSquaresTest, AllPathsBitwiseIdentical) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 1);
  const std::vector<Isa> isas = SupportedIsas();
  for (size_t n : kSizes) {
    std::vector<float> xf = RandomFloats(rng, n + 3);
    if (n > 10) xf[9] = INFINITY;  // non-finite inputs give identical results too
    std::vector<uint16_t> xh(n + 3);
    for (size_t i = 0; i < xh.size(); ++i) xh[i] = TruncateToBf16(xf[i]);
    std::vector<double> first_f, first_h;
    for (Isa isa : isas) {
      std::vector<double> f(Blocks(n)), h(Blocks(n));
      BlockSumSquaresFp32On(isa, xf.data() + 3, n, f.data());
      BlockSumSquaresBf16On(isa, xh.data() + 3, n, h.data());
      if (isa == isas.front()) {
        first_f = f;
        first_h = h;
        continue;
      }
      EXPECT_TRUE(SameBits(f, first_f)) << "fp32 block sums differ between " << IsaName(isa)
                                        << " and " << IsaName(isas[0]) << " for n=" << n;
      EXPECT_TRUE(SameBits(h, first_h)) << "bf16 block sums differ between " << IsaName(isa)
                                        << " and " << IsaName(isas[0]) << " for n=" << n;
    }
  }
}

TEST(BlockSumSquaresTest, FollowsTheDocumentedLaneOrder) {
  // Values whose sum depends on the order of additions: the kernel must
  // reproduce the documented 8-lane order exactly.
  std::vector<float> x(kNormBlock + 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0) ? 1e8f : 1.0f + i * 1e-3f;
  std::vector<double> want(2);
  for (size_t b = 0; b < 2; ++b) {
    double lane[8] = {};
    for (size_t i = b * kNormBlock; i < std::min(x.size(), (b + 1) * kNormBlock); ++i) {
      lane[i % 8] += static_cast<double>(x[i]) * x[i];
    }
    want[b] =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  for (Isa isa : SupportedIsas()) {
    std::vector<double> got(2);
    BlockSumSquaresFp32On(isa, x.data(), x.size(), got.data());
    EXPECT_EQ(got, want) << IsaName(isa);
  }
}

// Block sums as the engine produces them: sums of squares of fp32 values.
std::vector<double> RandomBlockSums(std::mt19937_64& rng, size_t n) {
  std::vector<float> x = RandomFloats(rng, n * 4);
  std::vector<double> sums(n);
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (size_t k = 0; k < 4; ++k) s += static_cast<double>(x[4 * i + k]) * x[4 * i + k];
    sums[i] = s;
  }
  return sums;
}

uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

TEST(ExactSumTest, SameBitsForAnyOrderAndAnySplit) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 2);
  for (size_t n : {size_t{1}, size_t{7}, size_t{129}, size_t{4099}, size_t{100000}}) {
    std::vector<double> x = RandomBlockSums(rng, n);
    ExactSum whole;
    whole.AddBlocks(x.data(), n);
    const uint64_t want = Bits(whole.Value());
    for (int trial = 0; trial < 8; ++trial) {
      std::shuffle(x.begin(), x.end(), rng);
      // Split into up to 5 accumulators at random cut points, some fed with
      // Add and some with AddBlocks, merged in a random order.
      std::uniform_int_distribution<size_t> cut(0, n);
      std::vector<size_t> cuts = {0, n, cut(rng), cut(rng), cut(rng), cut(rng)};
      std::sort(cuts.begin(), cuts.end());
      std::vector<ExactSum> parts(cuts.size() - 1);
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        if (k % 2 == 0) {
          parts[k].AddBlocks(x.data() + cuts[k], cuts[k + 1] - cuts[k]);
        } else {
          for (size_t i = cuts[k]; i < cuts[k + 1]; ++i) parts[k].Add(x[i]);
        }
      }
      std::shuffle(parts.begin(), parts.end(), rng);
      ExactSum merged;
      for (const ExactSum& part : parts) merged.Merge(part);
      EXPECT_EQ(Bits(merged.Value()), want) << "n=" << n << " trial " << trial;
      // The same through an integer all-reduce of the limbs.
      ExactSum reduced;
      for (const ExactSum& part : parts) {
        for (int l = 0; l < ExactSum::kLimbs; ++l) reduced.limbs()[l] += part.limbs()[l];
      }
      EXPECT_EQ(Bits(reduced.Value()), want) << "limb sum, n=" << n << " trial " << trial;
    }
  }
}

// Value() rounds the exact sum once, so it is within half an ulp of it; the
// reference is a compensated long double sum (error ~2^-64 relative).
TEST(ExactSumTest, ValueIsCorrectlyRounded) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 3);
  for (size_t n : {size_t{1}, size_t{2}, size_t{1000}, size_t{200000}}) {
    std::vector<double> x = RandomBlockSums(rng, n);
    ExactSum sum;
    sum.AddBlocks(x.data(), n);
    const long double want = reference::CompensatedSum(x.data(), n);
    EXPECT_LE(std::fabs(static_cast<long double>(sum.Value()) - want), 1e-15L * want)
        << "n=" << n << ": " << sum.Value() << " vs " << static_cast<double>(want);
  }
  // Exactly representable cases, including an input at the bottom of the range.
  ExactSum small;
  small.Add(std::ldexp(1.0, -298));
  small.Add(std::ldexp(1.0, -298));
  EXPECT_EQ(small.Value(), std::ldexp(1.0, -297));
  // Around 2^53 the doubles are 2 apart: check nearest and ties-to-even.
  ExactSum tie;
  tie.Add(std::ldexp(1.0, 53));
  tie.Add(1.0);
  EXPECT_EQ(tie.Value(), std::ldexp(1.0, 53));  // 2^53 + 1: tie, rounds to even
  tie.Add(1.0);
  EXPECT_EQ(tie.Value(), std::ldexp(1.0, 53) + 2);
  tie.Add(0.5);
  EXPECT_EQ(tie.Value(), std::ldexp(1.0, 53) + 2);  // 2^53 + 2.5 rounds down
  tie.Add(0.5);
  EXPECT_EQ(tie.Value(), std::ldexp(1.0, 53) + 4);  // 2^53 + 3: tie, rounds to even
  ExactSum sticky;  // 2^53 + 1 + 2^-290: just above a tie that would round down
  sticky.Add(std::ldexp(1.0, 53));
  sticky.Add(1.0);
  sticky.Add(std::ldexp(1.0, -290));
  EXPECT_EQ(sticky.Value(), std::ldexp(1.0, 53) + 2);
  ExactSum empty;
  EXPECT_EQ(Bits(empty.Value()), Bits(0.0));
}

TEST(ExactSumTest, NonFiniteInputIsCountedAndGivesInf) {
  ExactSum sum;
  sum.Add(1.5);
  sum.Add(std::numeric_limits<double>::quiet_NaN());
  sum.Add(std::numeric_limits<double>::infinity());
  EXPECT_EQ(sum.non_finite(), 2);
  EXPECT_EQ(sum.Value(), std::numeric_limits<double>::infinity());
  ExactSum other;
  other.Add(2.0);
  EXPECT_EQ(other.Value(), 2.0);
  other.Merge(sum);
  EXPECT_EQ(other.non_finite(), 2);
  EXPECT_EQ(other.Value(), std::numeric_limits<double>::infinity());
  // Out of range (negative, too large, below 2^-298) is counted the same way.
  ExactSum out_of_range;
  out_of_range.Add(-1.0);
  out_of_range.Add(std::ldexp(1.0, 280));
  out_of_range.Add(std::ldexp(1.0, -299));
  EXPECT_EQ(out_of_range.non_finite(), 3);
  EXPECT_EQ(out_of_range.Value(), std::numeric_limits<double>::infinity());
}

TEST(ExactSumTest, ManyAddsNormalizeWithoutOverflow) {
  // More adds than the normalization interval, of the largest allowed value.
  ExactSum sum;
  const double big = std::ldexp(1.0, 279);
  const size_t n = (size_t{1} << 21) + 3;
  for (size_t i = 0; i < n; ++i) sum.Add(big);
  EXPECT_EQ(sum.Value(), std::ldexp(static_cast<double>(n), 279));
}

// Random finite fp16 bit patterns: every binade from the subnormals to
// 65504, both signs, never zero (squares up to 4.3e9, exact in double).
std::vector<uint16_t> RandomFp16(std::mt19937_64& rng, size_t n) {
  std::uniform_int_distribution<uint32_t> bits(0, 0xffff);
  std::vector<uint16_t> x(n);
  for (uint16_t& h : x) {
    do {
      h = static_cast<uint16_t>(bits(rng));
    } while ((h & 0x7c00) == 0x7c00 || (h & 0x7fff) == 0);
  }
  return x;
}

TEST(BlockSumSquaresFp16Test, MatchesReferenceAndIsBitwiseIdenticalOnEveryPath) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 4);
  const std::vector<Isa> isas = SupportedIsas();
  for (size_t n : kSizes) {
    // One extra element in front makes every vector load unaligned.
    const std::vector<uint16_t> x = RandomFp16(rng, n + 1);
    std::vector<double> xd(n);
    for (size_t i = 0; i < n; ++i) xd[i] = reference::Fp16ValueReference(x[i + 1]);
    std::vector<double> want(Blocks(n)), first;
    reference::BlockSumSquaresReference(xd.data(), n, kNormBlock, want.data());
    for (Isa isa : isas) {
      std::vector<double> got(Blocks(n), -1.0);
      BlockSumSquaresFp16On(isa, x.data() + 1, n, got.data());
      for (size_t b = 0; b < got.size(); ++b) {
        ASSERT_LE(std::fabs(got[b] - want[b]), kBlockRelTol * want[b])
            << IsaName(isa) << " fp16 n=" << n << " block " << b << ": " << got[b] << " vs "
            << want[b];
      }
      if (isa == isas.front()) {
        first = got;
      } else {
        EXPECT_TRUE(SameBits(got, first)) << "fp16 block sums differ between " << IsaName(isa)
                                          << " and " << IsaName(isas[0]) << " for n=" << n;
      }
      // The global sum as the engine forms it: exact over blocks, one rounding.
      ExactSum sum;
      sum.AddBlocks(got.data(), got.size());
      std::vector<double> squares(n);
      for (size_t i = 0; i < n; ++i) squares[i] = xd[i] * xd[i];
      const long double exact = reference::CompensatedSum(squares.data(), n);
      EXPECT_LE(std::fabs(static_cast<long double>(sum.Value()) - exact), 1e-15L * exact)
          << IsaName(isa) << " fp16 n=" << n << ": " << sum.Value() << " vs "
          << static_cast<double>(exact);
    }
  }
}

// The engine's fp16 overflow check reads the norm: an inf or NaN grad must
// make its block sum (and so the ExactSum) non-finite on every path, wherever
// it sits (vector body or tail of a block, first or last block).
TEST(BlockSumSquaresFp16Test, InfOrNanGradGivesNonFiniteBlockSum) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 5);
  const size_t n = 3 * kNormBlock + 13;
  const uint16_t specials[] = {0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d55};
  for (Isa isa : SupportedIsas()) {
    for (uint16_t special : specials) {
      for (size_t pos : {size_t{0}, size_t{5}, kNormBlock + 7, 2 * kNormBlock + 127, n - 1}) {
        std::vector<uint16_t> x = RandomFp16(rng, n);
        x[pos] = special;
        std::vector<double> sums(Blocks(n));
        BlockSumSquaresFp16On(isa, x.data(), n, sums.data());
        for (size_t b = 0; b < sums.size(); ++b) {
          EXPECT_EQ(std::isfinite(sums[b]), b != pos / kNormBlock)
              << IsaName(isa) << " fp16 0x" << std::hex << special << std::dec << " at " << pos
              << ", block " << b << " = " << sums[b];
        }
        ExactSum sum;
        sum.AddBlocks(sums.data(), sums.size());
        EXPECT_EQ(sum.non_finite(), 1) << IsaName(isa) << " at " << pos;
        EXPECT_EQ(sum.Value(), std::numeric_limits<double>::infinity());
      }
    }
    // The largest finite halves stay finite: 128 * 65504^2 is far below DBL_MAX.
    std::vector<uint16_t> big(kNormBlock, 0xfbff);
    double block_sum = 0;
    BlockSumSquaresFp16On(isa, big.data(), big.size(), &block_sum);
    EXPECT_EQ(block_sum, 128.0 * 65504.0 * 65504.0) << IsaName(isa);
  }
}

TEST(NormTest, ReportsIsaPathsNotRun) {
  testing::ReportIsaPaths();
  RecordProperty("random_seed", std::to_string(Seed()));
}

}  // namespace
}  // namespace zeroshard::kernels
