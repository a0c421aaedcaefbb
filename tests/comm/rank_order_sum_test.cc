// The per-element rank-order sum that the nccl backend's CUDA kernel is built
// from (kernels/common/rank_order_sum.h) against the host reduction every
// other backend uses (engine/src/comm/reduce.cc): the same bits, on random
// inputs with special values mixed in, for every summable dtype. Runs on the
// CPU; the GPU test (nccl_communicator_test.cc) holds the kernel to the local
// backend on a device.
#include "kernels/common/rank_order_sum.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/src/comm/reduce.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/dtype.h"

namespace zeroshard {
namespace {

using kernels::RankOrderSumElement;

// Random raw bits of one element: mostly finite values spread over many
// binades (so the sums round), with zeros of both signs, infinities, NaNs and
// subnormals mixed in.
template <class Storage>
Storage RandomElement(std::mt19937_64& rng);

template <>
float RandomElement<float>(std::mt19937_64& rng) {
  const uint64_t r = rng();
  uint32_t bits;
  switch (r % 64) {
    case 0:
      bits = 0x80000000u;  // -0
      break;
    case 1:
      bits = 0x7f800000u | static_cast<uint32_t>(r & 0x80000000u);  // +-inf
      break;
    case 2:
      bits = 0x7fc00000u | static_cast<uint32_t>((r >> 8) & 0x3fffffu);  // NaN
      break;
    case 3:
      bits = static_cast<uint32_t>((r >> 8) & 0x807fffffu);  // subnormal
      break;
    default: {
      // Exponents 2^-30 .. 2^30 around 1: sums of such mixtures round.
      const uint32_t exponent = 97 + static_cast<uint32_t>((r >> 8) % 60);
      bits = static_cast<uint32_t>(r & 0x80000000u) | (exponent << 23) |
             static_cast<uint32_t>((r >> 32) & 0x7fffffu);
    }
  }
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

template <>
double RandomElement<double>(std::mt19937_64& rng) {
  const uint64_t r = rng();
  uint64_t bits;
  switch (r % 64) {
    case 0:
      bits = uint64_t{1} << 63;
      break;
    case 1:
      bits = 0x7ff0000000000000ull | (r & (uint64_t{1} << 63));
      break;
    case 2:
      bits = 0x7ff8000000000000ull | (r & 0xfffffull);
      break;
    default: {
      const uint64_t exponent = 1023 - 40 + (rng() % 80);
      bits = (r & (uint64_t{1} << 63)) | (exponent << 52) | (rng() & 0xfffffffffffffull);
    }
  }
  double x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

template <>
int64_t RandomElement<int64_t>(std::mt19937_64& rng) {
  // Full-range values too, so that the sums wrap around.
  const uint64_t r = rng();
  return (r % 4 == 0) ? static_cast<int64_t>(rng())
                      : static_cast<int64_t>(rng() % 2000001) - 1000000;
}

template <>
uint16_t RandomElement<uint16_t>(std::mt19937_64& rng) {
  // Every 16-bit pattern is some bf16 and some fp16 value (NaN and inf
  // included); uniform bits cover all binades of both.
  return static_cast<uint16_t>(rng());
}

// True when the element's bits are a NaN of `dtype`.
bool IsNan(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kFloat32:
      return (bits & 0x7fffffffu) > 0x7f800000u;
    case DType::kBFloat16:
      return (bits & 0x7fffu) > 0x7f80u;
    case DType::kFloat16:
      return (bits & 0x7fffu) > 0x7c00u;
    case DType::kFloat64:
      return (bits & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    default:
      return false;
  }
}

template <class Rule>
void CheckAgainstHostReduce(DType dtype, std::mt19937_64& rng) {
  using Storage = typename Rule::Storage;
  for (int ranks : {1, 2, 3, 5, 8}) {
    // Not a multiple of the host reduction's 1024-element block, to cover
    // its tail as well.
    const size_t count = 1500 + rng() % 3000;
    // The kernel's layout: rank k's block at staging + k * count.
    std::vector<Storage> staging(ranks * count);
    for (Storage& x : staging) x = RandomElement<Storage>(rng);
    std::vector<const void*> inputs(ranks);
    for (int k = 0; k < ranks; ++k) inputs[k] = staging.data() + k * count;

    std::vector<Storage> host(count);
    void* outputs[] = {host.data()};
    internal::SumInRankOrder(inputs.data(), ranks, outputs, 1, static_cast<int64_t>(count), dtype);

    int64_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      const Storage element = RankOrderSumElement<Rule>(staging.data() + i, count, ranks);
      uint64_t element_bits = 0;
      uint64_t host_bits = 0;
      std::memcpy(&element_bits, &element, sizeof(Storage));
      std::memcpy(&host_bits, &host[i], sizeof(Storage));
      // Which payload a NaN result carries is not part of the contract: when
      // two NaNs meet, x86 returns one operand's and the compiler may swap
      // the operands of a vectorised add (and CUDA returns a canonical NaN).
      // A NaN must stay a NaN.
      if (IsNan(dtype, element_bits) && IsNan(dtype, host_bits)) continue;
      if (element_bits != host_bits && ++bad <= 5) {
        ADD_FAILURE() << DTypeName(dtype) << ", " << ranks << " ranks, element " << i
                      << ": RankOrderSumElement gives bits 0x" << std::hex << element_bits
                      << ", the host reduce 0x" << host_bits << std::dec;
      }
    }
    EXPECT_EQ(bad, 0) << DTypeName(dtype) << ", " << ranks << " ranks, " << count << " elements";
  }
}

TEST(RankOrderSumTest, ElementRuleMatchesHostReduceBitwise) {
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed());
  for (int round = 0; round < 4; ++round) {
    CheckAgainstHostReduce<kernels::Fp32SumRule>(DType::kFloat32, rng);
    CheckAgainstHostReduce<kernels::Bf16SumRule>(DType::kBFloat16, rng);
    CheckAgainstHostReduce<kernels::Fp16SumRule>(DType::kFloat16, rng);
    CheckAgainstHostReduce<kernels::Fp64SumRule>(DType::kFloat64, rng);
    CheckAgainstHostReduce<kernels::Int64SumRule>(DType::kInt64, rng);
  }
}

// The order is part of the contract: (a + b) + c differs from a + (b + c)
// here, and the rule must give the left-to-right one.
TEST(RankOrderSumTest, AddsInRankOrder) {
  const float x[] = {1.0f, 1e8f, -1e8f};
  EXPECT_EQ(RankOrderSumElement<kernels::Fp32SumRule>(x, 1, 3), 0.0f);
  const float y[] = {1e8f, -1e8f, 1.0f};
  EXPECT_EQ(RankOrderSumElement<kernels::Fp32SumRule>(y, 1, 3), 1.0f);
  // A lone -0.0 stays -0.0 (the sum starts from x_0, not from +0).
  const float z[] = {-0.0f};
  EXPECT_TRUE(std::signbit(RankOrderSumElement<kernels::Fp32SumRule>(z, 1, 1)));
  // 16-bit: accumulated in fp32 and rounded once. In bf16 (7 stored
  // mantissa bits) 1 + 2^-8 is a tie that rounds to 1, so rounding after each
  // add would give 1; once at the end, 1 + 2^-8 + 2^-8 = 1 + 2^-7 is exact.
  const uint16_t one = 0x3f80;       // 1.0
  const uint16_t half_ulp = 0x3b80;  // 2^-8
  const uint16_t w[] = {one, half_ulp, half_ulp};
  EXPECT_EQ(RankOrderSumElement<kernels::Bf16SumRule>(w, 1, 3), 0x3f81);  // 1 + 2^-7
}

}  // namespace
}  // namespace zeroshard
