// Tests of the bf16 <-> fp32 casts on every ISA path this CPU runs.
#include "kernels/cpu/cast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"

namespace zeroshard::kernels {
namespace {

uint64_t Seed() {
  static const uint64_t seed = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) | rd();
  }();
  return seed;
}

std::string SeedTrace() { return "random seed " + std::to_string(Seed()); }

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

// The scalar rule, written as "truncate, then round the dropped half-word":
// ties (dropped == 0x8000) go to the even bf16; NaN keeps sign and payload
// and gains the quiet bit.
uint16_t RoundToBf16(float x) {
  const uint32_t bits = ToBits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t upper = bits >> 16;
  const uint32_t dropped = bits & 0xffff;
  if (dropped > 0x8000 || (dropped == 0x8000 && (upper & 1))) ++upper;
  return static_cast<uint16_t>(upper);
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
      if (out[i + 2] != RoundToBf16(x[i + 1])) {
        ++failures;
        ADD_FAILURE() << IsaName(isa) << ": fp32 0x" << std::hex << ToBits(x[i + 1])
                      << " -> bf16 0x" << out[i + 2] << ", expected 0x" << RoundToBf16(x[i + 1]);
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

TEST(CastTest, ReportsIsaPathsNotRun) {
  std::string run, not_run;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    bool supported = false;
    for (Isa s : SupportedIsas()) supported |= s == isa;
    std::string& list = supported ? run : not_run;
    list += std::string(list.empty() ? "" : ",") + IsaName(isa);
    if (!supported) {
      std::printf("[  NOTE    ] %s path not tested: CPU lacks %s\n",
                  isa == Isa::kAvx512 ? "AVX-512" : "AVX2",
                  isa == Isa::kAvx512 ? "avx512f/avx512bw/avx512dq" : "avx2");
    }
  }
  RecordProperty("isa_paths_tested", run);
  RecordProperty("isa_paths_not_tested", not_run.empty() ? "none" : not_run);
}

}  // namespace
}  // namespace zeroshard::kernels
