// CRC-32C: published check values, and fresh random buffers of random lengths
// and alignments against bit-at-a-time references, for each implementation
// (portable, SSE4.2, and the one Crc32c dispatches to).
#include "kernels/cpu/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/internal/crc32c_impl.h"
#include "tests/test_seed.h"

namespace zeroshard::kernels {
namespace {

using testing::Seed;
using testing::SeedTrace;

// Reference 1: the CRC register one bit at a time, LSB first (reflected), with
// the reflected polynomial. Nothing shared with the code under test.
uint32_t ReferenceReflected(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return crc ^ 0xFFFFFFFFu;
}

uint32_t ReverseBits(uint32_t x, int bits) {
  uint32_t r = 0;
  for (int i = 0; i < bits; ++i) r |= ((x >> i) & 1u) << (bits - 1 - i);
  return r;
}

// Reference 2, the textbook definition, to double-check reference 1: long
// division MSB first by the polynomial as published (0x1EDC6F41), over each
// byte bit-reversed (the CRC is "reflected in"), the remainder bit-reversed
// ("reflected out"), with initial value and final XOR all ones.
uint32_t ReferenceTextbook(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= ReverseBits(p[i], 8) << 24;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x80000000u) ? (crc << 1) ^ 0x1EDC6F41u : crc << 1;
    }
  }
  return ReverseBits(crc, 32) ^ 0xFFFFFFFFu;
}

struct CheckValue {
  std::string what;
  std::vector<uint8_t> bytes;
  uint32_t crc;
};

// From the iSCSI specification (RFC 3720, B.4) and the CRC catalogue.
std::vector<CheckValue> PublishedCheckValues() {
  std::vector<CheckValue> values;
  const std::string digits = "123456789";
  values.push_back(
      {"\"123456789\"", std::vector<uint8_t>(digits.begin(), digits.end()), 0xE3069283u});
  values.push_back({"32 bytes of 0x00", std::vector<uint8_t>(32, 0x00), 0x8A9136AAu});
  values.push_back({"32 bytes of 0xFF", std::vector<uint8_t>(32, 0xFF), 0x62A8AB43u});
  std::vector<uint8_t> ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<uint8_t>(i);
  values.push_back({"bytes 0..31 ascending", ascending, 0x46DD794Eu});
  values.push_back({"no bytes", {}, 0x00000000u});
  return values;
}

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

size_t Uniform(std::mt19937_64& rng, size_t lo, size_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<size_t>(lo, hi)(rng);
}

TEST(Crc32cReferenceTest, GivesThePublishedCheckValues) {
  for (const CheckValue& v : PublishedCheckValues()) {
    EXPECT_EQ(ReferenceReflected(v.bytes.data(), v.bytes.size()), v.crc) << v.what;
    EXPECT_EQ(ReferenceTextbook(v.bytes.data(), v.bytes.size()), v.crc) << v.what;
  }
}

TEST(Crc32cReferenceTest, BothReferencesAgreeOnRandomBytes) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<uint8_t> bytes = RandomBytes(rng, Uniform(rng, 0, 2048));
    ASSERT_EQ(ReferenceReflected(bytes.data(), bytes.size()),
              ReferenceTextbook(bytes.data(), bytes.size()))
        << bytes.size() << " bytes";
  }
}

// One implementation as Crc32cExtend's contract: continue `crc` over n bytes.
struct Implementation {
  const char* name;
  uint32_t (*extend)(uint32_t crc, const void* data, size_t n);
};

// So that a failing case names its path rather than printing its bytes.
void PrintTo(const Implementation& implementation, std::ostream* os) { *os << implementation.name; }

const Implementation kPortable{"portable", &Crc32cPortable};
const Implementation kHardware{"sse4_2", &Crc32cHardware};
const Implementation kDispatched{"dispatched", &Crc32cExtend};

class Crc32cImplementationTest : public ::testing::TestWithParam<Implementation> {
 protected:
  void SetUp() override {
    if (GetParam().extend == &Crc32cHardware && !Crc32cHardwareSupported()) {
      GTEST_SKIP() << "this CPU has no SSE4.2 (or this build is not for x86-64): the hardware "
                      "CRC-32C is not tested here";
    }
  }
  uint32_t Crc(const void* data, size_t n) const { return GetParam().extend(0, data, n); }
};

TEST_P(Crc32cImplementationTest, GivesThePublishedCheckValues) {
  for (const CheckValue& v : PublishedCheckValues()) {
    EXPECT_EQ(Crc(v.bytes.data(), v.bytes.size()), v.crc) << v.what;
  }
  EXPECT_EQ(Crc(nullptr, 0), 0u);
  EXPECT_EQ(GetParam().extend(0x12345678u, nullptr, 0), 0x12345678u);
}

// Lengths from every regime of the implementations: byte tails, single words,
// the three-way blocks of 3 x 256 and 3 x 8192 bytes and what is left after
// them, and a few MiB. Each buffer is placed at a random offset (0..63) at
// the very end of its allocation, so a read past it is a sanitizer error.
TEST_P(Crc32cImplementationTest, MatchesTheReferenceOnRandomBuffers) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  struct LengthRange {
    size_t lo, hi;
    int count;
  };
  const LengthRange ranges[] = {{0, 64, 300},
                                {3 * 256 - 40, 2 * 3 * 256 + 40, 100},
                                {3 * 8192 - 40, 2 * 3 * 8192 + 40, 20},
                                {0, size_t{4} << 20, 4}};
  for (const LengthRange& range : ranges) {
    for (int trial = 0; trial < range.count; ++trial) {
      const size_t n = Uniform(rng, range.lo, range.hi);
      const size_t misalign = Uniform(rng, 0, 63);
      const std::vector<uint8_t> buffer = RandomBytes(rng, misalign + n);
      const uint8_t* data = buffer.data() + misalign;
      ASSERT_EQ(Crc(data, n), ReferenceReflected(data, n))
          << n << " bytes at offset " << misalign << " of their allocation";
    }
  }
}

TEST_P(Crc32cImplementationTest, ExtendOverRandomSplitsEqualsTheWhole) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() ^ 0x9E3779B97F4A7C15u);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = Uniform(rng, 0, 200000);
    const std::vector<uint8_t> bytes = RandomBytes(rng, n);
    std::vector<size_t> cuts(Uniform(rng, 1, 8));
    for (size_t& cut : cuts) cut = Uniform(rng, 0, n);
    cuts.push_back(0);
    cuts.push_back(n);
    std::sort(cuts.begin(), cuts.end());
    uint32_t crc = 0;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      crc = GetParam().extend(crc, bytes.data() + cuts[i], cuts[i + 1] - cuts[i]);
    }
    ASSERT_EQ(crc, ReferenceReflected(bytes.data(), n))
        << n << " bytes in " << cuts.size() - 1 << " pieces";
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, Crc32cImplementationTest,
                         ::testing::Values(kPortable, kHardware, kDispatched),
                         [](const ::testing::TestParamInfo<Implementation>& info) {
                           return std::string(info.param.name);
                         });

TEST(Crc32cTest, DispatchesToTheHardwareWhenTheCpuHasIt) {
  std::printf("Crc32cImplementation() = %s\n", Crc32cImplementation());
  EXPECT_STREQ(Crc32cImplementation(), Crc32cHardwareSupported() ? "sse4.2" : "portable");
}

TEST(Crc32cTest, CrcAndExtendAgree) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  const std::vector<uint8_t> a = RandomBytes(rng, Uniform(rng, 0, 100000));
  const std::vector<uint8_t> b = RandomBytes(rng, Uniform(rng, 0, 100000));
  std::vector<uint8_t> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  EXPECT_EQ(Crc32cExtend(0, a.data(), a.size()), Crc32c(a.data(), a.size()));
  EXPECT_EQ(Crc32cExtend(Crc32c(a.data(), a.size()), b.data(), b.size()),
            Crc32c(ab.data(), ab.size()));
  // The implementations can take turns on one running CRC.
  EXPECT_EQ(Crc32cHardwareSupported()
                ? Crc32cHardware(Crc32cPortable(0, a.data(), a.size()), b.data(), b.size())
                : Crc32cPortable(Crc32cPortable(0, a.data(), a.size()), b.data(), b.size()),
            ReferenceReflected(ab.data(), ab.size()));
}

}  // namespace
}  // namespace zeroshard::kernels
