// Tests of the bf16 / fp16 <-> fp32 casts on every ISA path this CPU runs.
#include "kernels/cpu/cast.h"

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

#include "kernels/common/float16_rules.h"
#include "kernels/cpu/isa.h"
#include "kernels/reference/bf16_reference.h"
#include "kernels/reference/fp16_reference.h"
#include "tests/kernels/isa_report.h"
#include "tests/test_env.h"
#include "tests/test_seed.h"

namespace zeroshard::kernels {
namespace {

using ::zeroshard::testing::LightMode;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

float FromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

uint32_t ToBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

TEST(CastTest, ExhaustiveBf16RoundTrip) {
  std::vector<uint16_t> all(65536 + 1);
  for (uint32_t i = 0; i < 65536; ++i) all[i + 1] = static_cast<uint16_t>(i);
  for (Isa isa : SupportedIsas()) {
    std::vector<float> f(65536 + 3);
    std::vector<uint16_t> back(65536 + 1);
    // Odd offsets: unaligned on both sides.
    CastBf16ToFp32On(isa, all.data() + 1, f.data() + 3, 65536);
    CastFp32ToBf16On(isa, f.data() + 3, back.data() + 1, 65536);
    int failures = 0;
    for (uint32_t i = 0; i < 65536 && failures < 5; ++i) {
      const uint16_t h = static_cast<uint16_t>(i);
      // bf16 -> fp32 is exact: the bits move to the upper half.
      if (ToBits(f[i + 3]) != (i << 16)) {
        ++failures;
        ADD_FAILURE() << IsaName(isa) << ": bf16 0x" << std::hex << i << " -> fp32 0x"
                      << ToBits(f[i + 3]);
      }
      // Back to bf16 is the identity, except that a signalling NaN turns quiet.
      const bool nan = (h & 0x7fff) > 0x7f80;
      const uint16_t expected = nan ? static_cast<uint16_t>(h | 0x40) : h;
      if (back[i + 1] != expected) {
        ++failures;
        ADD_FAILURE() << IsaName(isa) << ": bf16 0x" << std::hex << i << " round trip gave 0x"
                      << back[i + 1];
      }
    }
  }
}

TEST(CastTest, Fp32ToBf16MatchesScalarRule) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  std::uniform_int_distribution<uint32_t> any_bits;
  const size_t n = 200003;
  std::vector<float> x(n + 1);
  for (size_t i = 1; i <= n; ++i) {
    uint32_t bits = any_bits(rng);
    switch (i % 8) {
      case 0:  // exact tie, odd upper half: rounds up
        bits = (bits & 0xffff0000u) | 0x00018000u;
        break;
      case 1:  // exact tie, even upper half: stays
        bits = (bits & 0xfffe0000u) | 0x00008000u;
        break;
      case 2:  // just below / above a tie
        bits = (bits & 0xffff0000u) | (rng() % 2 ? 0x7fffu : 0x8001u);
        break;
      case 3:  // subnormal
        bits &= 0x807fffffu;
        break;
      case 4:  // near the top: may round to infinity
        bits = (bits & 0x8000ffffu) | 0x7f7f0000u;
        break;
      default:
        break;
    }
    x[i] = FromBits(bits);
  }
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            FromBits(0x7f800001u) /* signalling NaN */,
                            FromBits(0xffc12345u),
                            0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min()};
  for (size_t k = 0; k < std::size(specials); ++k) x[1 + k * 97] = specials[k];
  for (Isa isa : SupportedIsas()) {
    std::vector<uint16_t> out(n + 2);
    CastFp32ToBf16On(isa, x.data() + 1, out.data() + 2, n);
    int failures = 0;
    for (size_t i = 0; i < n && failures < 5; ++i) {
      if (out[i + 2] != reference::RoundToBf16Reference(x[i + 1])) {
        ++failures;
        ADD_FAILURE() << IsaName(isa) << ": fp32 0x" << std::hex << ToBits(x[i + 1])
                      << " -> bf16 0x" << out[i + 2] << ", expected 0x"
                      << reference::RoundToBf16Reference(x[i + 1]);
      }
    }
  }
}

TEST(CastTest, SmallSizesAndDispatch) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (size_t n : {0, 1, 7, 127, 128, 129, 1000, 4099}) {
    std::vector<float> x(n + 1);
    for (float& xi : x) xi = normal(rng);
    std::vector<uint16_t> a(n + 1, 0xdead), b(n + 1, 0xdead);
    CastFp32ToBf16(x.data(), a.data(), n);
    CastFp32ToBf16On(Isa::kScalar, x.data(), b.data(), n);
    EXPECT_EQ(a, b) << "n=" << n;
    EXPECT_EQ(a[n], 0xdead) << "wrote past the end, n=" << n;
    std::vector<float> y(n + 1, -7.0f);
    CastBf16ToFp32(a.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(ToBits(y[i]), uint32_t{a[i]} << 16);
    EXPECT_EQ(y[n], -7.0f) << "wrote past the end, n=" << n;
  }
}

// fp16 -> fp32 is exact and keeps NaN payloads (a signalling NaN stays
// signalling, although F16C's vcvtph2ps would quiet it); fp32 -> fp16 of the
// result gives the half back, except that a signalling NaN turns quiet.
TEST(CastTest, ExhaustiveFp16RoundTrip) {
  std::vector<uint16_t> all(65536 + 1);
  for (uint32_t i = 0; i < 65536; ++i) all[i + 1] = static_cast<uint16_t>(i);
  for (Isa isa : SupportedIsas()) {
    std::vector<float> f(65536 + 3);
    std::vector<uint16_t> back(65536 + 1);
    CastFp16ToFp32On(isa, all.data() + 1, f.data() + 3, 65536);
    CastFp32ToFp16On(isa, f.data() + 3, back.data() + 1, 65536);
    int failures = 0;
    for (uint32_t i = 0; i < 65536 && failures < 5; ++i) {
      const uint16_t h = static_cast<uint16_t>(i);
      const bool nan = (h & 0x7fff) > 0x7c00;
      const float x = f[i + 3];
      const bool widened_ok =
          nan ? ToBits(x) == (((i & 0x8000u) << 16) | 0x7f800000u | ((i & 0x3ffu) << 13))
              : x == reference::Fp16ValueReference(h) && std::signbit(x) == ((h & 0x8000) != 0);
      if (!widened_ok) {
        ++failures;
        ADD_FAILURE() << IsaName(isa) << ": fp16 0x" << std::hex << i << " -> fp32 0x" << ToBits(x);
      }
      const uint16_t expected = nan ? static_cast<uint16_t>(h | 0x200) : h;
      if (back[i + 1] != expected) {
        ++failures;
        ADD_FAILURE() << IsaName(isa) << ": fp16 0x" << std::hex << i << " round trip gave 0x"
                      << back[i + 1];
      }
    }
  }
}

// Inputs where fp16 rounding can go wrong: every midpoint between two
// neighbouring halves (ties, to even) and the fp32 values one and two ulps
// either side of it, for both signs, from the subnormals to the overflow
// threshold 65520; plus random fp32 bit patterns of every kind.
std::vector<float> Fp16RoundingInputs(std::mt19937_64& rng) {
  std::vector<float> x;
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    // The midpoint of two adjacent halves needs 12 significant bits: exact
    // in fp32. Above 65504 the next "half" is 65536 (inf).
    const double lo = reference::Fp16ValueReference(static_cast<uint16_t>(h));
    const double hi = h == 0x7bff ? 65536.0 : reference::Fp16ValueReference(h + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    for (float sign : {1.0f, -1.0f}) {
      const float m = sign * mid;
      const float below = std::nextafter(m, 0.0f), above = std::nextafter(m, 2 * m);
      for (float v : {m, below, above, std::nextafter(below, 0.0f), std::nextafter(above, 2 * m),
                      sign * static_cast<float>(lo)}) {
        x.push_back(v);
      }
    }
  }
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = any_bits(rng);
    switch (i % 6) {
      case 0:  // fp32 subnormal
        bits &= 0x807fffffu;
        break;
      case 1:  // the fp16 subnormal range and just below it
        bits = (bits & 0x807fffffu) | ((0x66u + (bits >> 23) % 18u) << 23);
        break;
      case 2:  // the fp16 normal range
        bits = (bits & 0x807fffffu) | ((0x71u + (bits >> 23) % 31u) << 23);
        break;
      case 3:  // huge: inf in fp16
        bits |= 0x47800000u;
        break;
      case 4:  // NaN (quiet or signalling) with a random payload, or inf
        bits |= 0x7f800000u;
        break;
      default:
        break;
    }
    x.push_back(FromBits(bits));
  }
  for (float special :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(), FromBits(0x7f800001u), FromBits(0xffc12345u),
        FromBits(0x7fbfffffu), 0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, -65520.0f,
        std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
        std::ldexp(1.0f, -25), std::ldexp(1.0f, -24), std::ldexp(1.0f, -14)}) {
    x.push_back(special);
  }
  std::shuffle(x.begin(), x.end(), rng);
  return x;
}

TEST(CastTest, Fp32ToFp16MatchesRoundingRule) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 2);
  const std::vector<float> inputs = Fp16RoundingInputs(rng);
  const size_t n = inputs.size();
  std::vector<float> x(n + 1);
  std::copy(inputs.begin(), inputs.end(), x.begin() + 1);
  for (Isa isa : SupportedIsas()) {
    std::vector<uint16_t> out(n + 2);
    CastFp32ToFp16On(isa, x.data() + 1, out.data() + 2, n);
    int failures = 0;
    for (size_t i = 0; i < n && failures < 5; ++i) {
      const uint16_t want = reference::RoundToFp16Reference(x[i + 1]);
      if (out[i + 2] != want) {
        ++failures;
        ADD_FAILURE() << IsaName(isa) << ": fp32 0x" << std::hex << ToBits(x[i + 1]) << " ("
                      << x[i + 1] << ") -> fp16 0x" << out[i + 2] << ", expected 0x" << want;
      }
    }
  }
}

TEST(CastTest, Fp16SmallSizesAndDispatch) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 3);
  std::normal_distribution<float> normal(0.0f, 300.0f);
  for (size_t n : {0, 1, 7, 15, 16, 17, 127, 128, 129, 1000, 4099}) {
    std::vector<float> x(n + 1);
    for (float& xi : x) xi = normal(rng);
    std::vector<uint16_t> a(n + 1, 0xdead), b(n + 1, 0xdead);
    CastFp32ToFp16(x.data(), a.data(), n);
    CastFp32ToFp16On(Isa::kScalar, x.data(), b.data(), n);
    EXPECT_EQ(a, b) << "n=" << n;
    EXPECT_EQ(a[n], 0xdead) << "wrote past the end, n=" << n;
    std::vector<float> y(n + 1, -7.0f);
    CastFp16ToFp32(a.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], reference::Fp16ValueReference(a[i]));
    EXPECT_EQ(y[n], -7.0f) << "wrote past the end, n=" << n;
  }
}

// Every fp32 input on every path, SIMD and scalar, against the one bf16 rule
// (kernels/common/float16_rules.h), NaN payloads included: the SIMD casts are
// vectorised versions of the rule and must give its bits everywhere. With
// ZS_TEST_LIGHT (the sanitizer builds) every 16th block of 2^20 inputs.
TEST(CastTest, ExhaustiveFp32ToBf16AllPathsMatchRule) {
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  const uint64_t stride = LightMode() ? 16 * kChunk : kChunk;
  std::vector<float> x(kChunk);
  std::vector<uint16_t> want(kChunk), got(kChunk);
  const std::vector<Isa> isas = SupportedIsas();
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += stride) {
    for (uint64_t i = 0; i < kChunk; ++i) {
      x[i] = FromBits(static_cast<uint32_t>(base + i));
      want[i] = Fp32ToBf16Rne(x[i]);
    }
    for (Isa isa : isas) {
      CastFp32ToBf16On(isa, x.data(), got.data(), kChunk);
      if (got == want) continue;
      for (uint64_t i = 0; i < kChunk; ++i) {
        ASSERT_EQ(got[i], want[i]) << IsaName(isa) << ": fp32 0x" << std::hex << (base + i)
                                   << " -> bf16 0x" << got[i] << ", the rule gives 0x" << want[i];
      }
    }
  }
}

// Every bf16 and every fp16 on every path against the widening rules, bit for
// bit (NaN payloads included; a signalling fp16 NaN stays signalling).
TEST(CastTest, AllHalvesWidenByTheRule) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : SupportedIsas()) {
    std::vector<float> bf16(65536), fp16(65536);
    CastBf16ToFp32On(isa, all.data(), bf16.data(), 65536);
    CastFp16ToFp32On(isa, all.data(), fp16.data(), 65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t h = static_cast<uint16_t>(i);
      ASSERT_EQ(ToBits(bf16[i]), ToBits(Bf16ToFp32(h)))
          << IsaName(isa) << ": bf16 0x" << std::hex << i;
      ASSERT_EQ(ToBits(fp16[i]), ToBits(Fp16ToFp32(h)))
          << IsaName(isa) << ": fp16 0x" << std::hex << i;
    }
  }
}

// Every fp32 input on every path against the scalar rule (a minute or so on
// one core): run with --gtest_also_run_disabled_tests after touching
// kernels/common/float16_rules.h or the SIMD conversions.
TEST(CastTest, DISABLED_ExhaustiveFp32ToFp16AllPaths) {
  constexpr size_t kChunk = size_t{1} << 22;
  std::vector<float> x(kChunk);
  std::vector<uint16_t> want(kChunk), got(kChunk);
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kChunk) {
    for (size_t i = 0; i < kChunk; ++i) x[i] = FromBits(static_cast<uint32_t>(base + i));
    CastFp32ToFp16On(Isa::kScalar, x.data(), want.data(), kChunk);
    for (Isa isa : SupportedIsas()) {
      if (isa == Isa::kScalar) continue;
      CastFp32ToFp16On(isa, x.data(), got.data(), kChunk);
      for (size_t i = 0; i < kChunk; ++i) {
        ASSERT_EQ(got[i], want[i]) << IsaName(isa) << ": fp32 0x" << std::hex << (base + i);
      }
    }
  }
}

TEST(CastTest, ReportsIsaPathsNotRun) { testing::ReportIsaPaths(); }

}  // namespace
}  // namespace zeroshard::kernels
