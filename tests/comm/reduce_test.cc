// The shared reduction and its fp16 conversions.
#include "engine/src/comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace internal {
namespace {

float FromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float x = Fp16ToFp32(static_cast<uint16_t>(h));
    const uint16_t back = Fp32ToFp16(x);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
      EXPECT_TRUE(std::isnan(x)) << std::hex << h;
      EXPECT_EQ(back & 0x7e00u, 0x7e00u) << std::hex << h;  // NaN, quiet
      continue;
    }
    EXPECT_EQ(back, h) << std::hex << h;
  }
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3c00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xc000);
  EXPECT_EQ(Fp32ToFp16(0.1f), 0x2e66);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7c00);  // tie goes to even: infinity
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even 2
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

// Every float rounds to a nearest half, ties to the even one.
TEST(Fp16, RandomFloatsRoundToNearestEven) {
  std::mt19937 rng(12345);
  for (int n = 0; n < 2'000'000; ++n) {
    // Magnitudes from far below the subnormals to beyond the largest half.
    const uint32_t bits =
        (rng() & 0x80000000u) | ((0x60 + rng() % 0x30) << 23) | (rng() & 0x7fffffu);
    const float x = FromBits(bits);
    const uint16_t h = Fp32ToFp16(x);
    const double ax = std::fabs(static_cast<double>(x));
    if (ax >= 65520.0) {
      EXPECT_EQ(h & 0x7fffu, 0x7c00u) << x;
      continue;
    }
    const uint16_t mag = h & 0x7fffu;
    ASSERT_LT(mag, 0x7c00u) << x;
    const double got = Fp16ToFp32(mag);
    const double below = mag > 0 ? Fp16ToFp32(mag - 1) : -1.0;
    const double above = Fp16ToFp32(mag + 1);
    const double err = std::fabs(ax - got);
    ASSERT_LE(err, std::fabs(ax - above)) << x;
    if (mag > 0) {
      ASSERT_LE(err, std::fabs(ax - below)) << x;
    }
    if (err == std::fabs(ax - above) || (mag > 0 && err == std::fabs(ax - below))) {
      EXPECT_EQ(mag & 1u, 0u) << "tie not to even for " << x;
    }
    EXPECT_EQ(h >> 15, bits >> 31) << x;
  }
}

TEST(SumInRankOrder, KeepsNegativeZeroAndWorksInPlace) {
  std::vector<float> a = {-0.0f, 1.0f, 3.0f};
  const void* inputs[] = {a.data()};
  void* outputs[] = {a.data()};
  SumInRankOrder(inputs, 1, outputs, 1, 3, DType::kFloat32);
  EXPECT_TRUE(std::signbit(a[0]));

  // 3000 elements: more than one internal block, fully in place.
  std::vector<float> x(3000), y(3000);
  for (int i = 0; i < 3000; ++i) {
    x[i] = 1e8f;
    y[i] = static_cast<float>(i % 7) - 1e8f;
  }
  const void* in2[] = {x.data(), y.data()};
  void* out2[] = {x.data()};
  SumInRankOrder(in2, 2, out2, 1, 3000, DType::kFloat32);
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(x[i], (1e8f + (static_cast<float>(i % 7) - 1e8f))) << i;
}

TEST(SumInRankOrder, SixteenBitTypesRoundOnce) {
  // 1 + 2^-8 + 2^-8 in bf16 (ulp(1) = 2^-7): rounding after each add ties
  // back to 1 twice; accumulating in fp32 and rounding once gives 1 + 2^-7.
  const uint16_t one = Fp32ToBf16(1.0f);
  const uint16_t tiny = Fp32ToBf16(std::ldexp(1.0f, -8));
  const uint16_t a[] = {one}, b[] = {tiny}, c[] = {tiny};
  uint16_t out[1];
  const void* inputs[] = {a, b, c};
  void* outputs[] = {out};
  SumInRankOrder(inputs, 3, outputs, 1, 1, DType::kBFloat16);
  EXPECT_EQ(Bf16ToFp32(out[0]), 1.0f + std::ldexp(1.0f, -7));
}

// Random values of `dtype` (bits of a float drawn from a wide range of
// magnitudes, so that sums round), `count` of them.
std::vector<char> RandomValues(DType dtype, int64_t count, std::mt19937_64& rng) {
  std::vector<char> bytes(count * DTypeSize(dtype));
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-12, 12);
  for (int64_t i = 0; i < count; ++i) {
    const double x = std::ldexp(mantissa(rng), exponent(rng));
    char* at = bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat32: {
        const float v = static_cast<float>(x);
        std::memcpy(at, &v, sizeof(v));
        break;
      }
      case DType::kBFloat16: {
        const uint16_t v = Fp32ToBf16(static_cast<float>(x));
        std::memcpy(at, &v, sizeof(v));
        break;
      }
      case DType::kFloat16: {
        const uint16_t v = Fp32ToFp16(static_cast<float>(x) / 8192.0f);  // within fp16's range
        std::memcpy(at, &v, sizeof(v));
        break;
      }
      case DType::kFloat64:
        std::memcpy(at, &x, sizeof(x));
        break;
      case DType::kInt64: {
        const int64_t v = static_cast<int64_t>(rng());  // wraps when summed: defined
        std::memcpy(at, &v, sizeof(v));
        break;
      }
      case DType::kUInt8:
        break;
    }
  }
  return bytes;
}

// A sum split into legs at any input, the partial kept in AccumulatorDType
// between them, gives the bits of one SumInRankOrder over all the inputs
// (what the hierarchical reduce-scatter's chain over nodes relies on); in
// place too. Rounding the partial to the dtype between legs would differ
// for the 16-bit types, which the last check shows.
TEST(ContinueSumInRankOrder, LegsGiveTheBitsOfOneSum) {
  std::mt19937_64 rng(::zeroshard::testing::Seed());
  bool rounding_between_legs_differs = false;
  for (DType dtype :
       {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64, DType::kInt64}) {
    SCOPED_TRACE(DTypeName(dtype));
    // Three inputs at least and a few hundred values: with two inputs the
    // first leg is one value, which rounds to itself, and a handful of values
    // can all happen to round alike (CI seed 17764469861087640487 failed below).
    const int num_inputs = 3 + static_cast<int>(rng() % 5);
    const int64_t count = 256 + static_cast<int64_t>(rng() % 3000);
    const size_t bytes = count * DTypeSize(dtype);
    const size_t acc_bytes = count * DTypeSize(AccumulatorDType(dtype));
    std::vector<std::vector<char>> data;
    std::vector<const void*> inputs;
    for (int k = 0; k < num_inputs; ++k) data.push_back(RandomValues(dtype, count, rng));
    for (const auto& d : data) inputs.push_back(d.data());
    std::vector<char> want(bytes);
    void* outputs[] = {want.data()};
    SumInRankOrder(inputs.data(), num_inputs, outputs, 1, count, dtype);
    for (int split = 1; split < num_inputs; ++split) {
      // Three legs where there are inputs enough: [0, a), [a, split), [split, n).
      const int a = std::max(1, split / 2);
      std::vector<char> partial(acc_bytes);
      ContinueSumInRankOrder(nullptr, inputs.data(), a, partial.data(), count, dtype, false);
      ContinueSumInRankOrder(partial.data(), inputs.data() + a, split - a, partial.data(), count,
                             dtype, false);
      std::vector<char> got(bytes);
      ContinueSumInRankOrder(partial.data(), inputs.data() + split, num_inputs - split, got.data(),
                             count, dtype, true);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), bytes), 0)
          << "split at " << split << ", " << ::zeroshard::testing::SeedTrace();
      // In place: the last leg's output is its first input.
      std::vector<char> last = data[split];
      std::vector<const void*> in_place(inputs.begin() + split, inputs.end());
      in_place[0] = last.data();
      ContinueSumInRankOrder(partial.data(), in_place.data(), num_inputs - split, last.data(),
                             count, dtype, true);
      ASSERT_EQ(std::memcmp(last.data(), want.data(), bytes), 0) << "in place, split at " << split;
      if (dtype == DType::kBFloat16 || dtype == DType::kFloat16) {
        // The same legs rounded to the dtype in between: not the same bits.
        std::vector<char> rounded(bytes);
        ContinueSumInRankOrder(nullptr, inputs.data(), split, rounded.data(), count, dtype, true);
        std::vector<const void*> rest(inputs.begin() + split, inputs.end());
        rest.insert(rest.begin(), rounded.data());
        std::vector<char> twice(bytes);
        void* twice_out[] = {twice.data()};
        SumInRankOrder(rest.data(), static_cast<int>(rest.size()), twice_out, 1, count, dtype);
        if (std::memcmp(twice.data(), want.data(), bytes) != 0)
          rounding_between_legs_differs = true;
      }
    }
  }
  EXPECT_TRUE(rounding_between_legs_differs)
      << "the 16-bit data never told an unrounded partial from a rounded one";
}

}  // namespace
}  // namespace internal
}  // namespace zeroshard
