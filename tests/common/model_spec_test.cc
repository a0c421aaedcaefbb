// ModelSpec counts are exact or refused: no product or sum of int64s wraps,
// and the documented limits (2^56 elements, 65536 units, 2^20 tensors) are
// checked with errors naming the unit and the param. Also the checked
// arithmetic they rest on.
#include "zeroshard/model_spec.h"

#include <cmath>
#include <limits>
#include <string>

#include "engine/src/common/checked_math.h"
#include "gtest/gtest.h"

namespace zeroshard {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

ModelSpec OneParam(std::vector<int64_t> shape) {
  ModelSpec spec;
  spec.units.push_back({"block", {{"w", std::move(shape), false}}});
  return spec;
}

void ExpectRefused(const ModelSpec& spec, const std::string& needle) {
  const absl::Status status = spec.Validate();
  ASSERT_FALSE(status.ok()) << needle;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(needle), std::string::npos) << status;
}

TEST(CheckedMathTest, AddAndMulReportOverflowAtTheExactBoundary) {
  EXPECT_EQ(CheckedAdd(kInt64Max - 1, 1), kInt64Max);
  EXPECT_FALSE(CheckedAdd(kInt64Max, 1).has_value());
  EXPECT_EQ(CheckedMul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_FALSE(CheckedMul((int64_t{1} << 62) + 1, 4).has_value());
  EXPECT_EQ(CheckedMul(-(int64_t{1} << 62), 2), std::numeric_limits<int64_t>::min());
  // A chain stays failed once a step overflows, even if later steps shrink it.
  CheckedInt64 n = int64_t{1} << 40;
  n *= int64_t{1} << 30;
  EXPECT_FALSE(n.ok());
  n += -kInt64Max;
  EXPECT_FALSE(n.value().has_value());
  EXPECT_EQ((CheckedInt64(3) * 5 + 7).value(), 22);
  EXPECT_EQ(CheckedRoundUp(129, 128), 256);
  EXPECT_EQ(CheckedRoundUp(0, 128), 0);
  EXPECT_FALSE(CheckedRoundUp(kInt64Max - 3, 128).has_value());
}

TEST(CheckedMathTest, RoundToInt64RefusesWhatDoesNotFit) {
  EXPECT_EQ(RoundToInt64(2.5e9 + 0.4), 2500000000);
  EXPECT_EQ(RoundToInt64(9223372036854774784.0), 9223372036854774784);  // 2^63 - 1024
  EXPECT_FALSE(RoundToInt64(9223372036854775808.0).has_value());        // 2^63
  EXPECT_FALSE(RoundToInt64(1e300).has_value());
  EXPECT_FALSE(RoundToInt64(std::nan("")).has_value());
  EXPECT_FALSE(RoundToInt64(-INFINITY).has_value());
}

TEST(ModelSpecTest, OverflowingShapesAreRefusedNotWrapped) {
  // 2^62 + 1 by 4 wraps to 4 in int64 arithmetic.
  const ModelSpec wraps = OneParam({(int64_t{1} << 62) + 1, 4});
  EXPECT_EQ(wraps.units[0].params[0].NumElements(), -1);
  EXPECT_EQ(wraps.units[0].NumElements(), -1);
  EXPECT_EQ(wraps.NumParams(), -1);
  ExpectRefused(wraps, "'block.w' of shape [4611686018427387905, 4]");
  ExpectRefused(OneParam({int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31}), "2^56");
  // The spec_json fuzzer's reproducer: 129 x 1283333333333 x 33333333 wraps.
  ExpectRefused(OneParam({129, 1283333333333, 33333333}),
                "of shape [129, 1283333333333, 33333333]");
  // Fits in int64 but passes the model limit.
  ExpectRefused(OneParam({(int64_t{1} << 56) + 1}), "72057594037927936");
  const ModelSpec at_limit = OneParam({int64_t{1} << 28, int64_t{1} << 28});
  EXPECT_TRUE(at_limit.Validate().ok()) << at_limit.Validate();
  EXPECT_EQ(at_limit.NumParams(), kMaxModelElements);
}

TEST(ModelSpecTest, TheModelTotalIsCheckedAcrossParamsAndUnits) {
  ModelSpec spec;
  spec.units.push_back({"a", {{"w", {int64_t{1} << 55}, false}}});
  spec.units.push_back({"b", {{"w", {int64_t{1} << 54}, false}, {"v", {int64_t{1} << 54}, false}}});
  EXPECT_TRUE(spec.Validate().ok());
  EXPECT_EQ(spec.NumParams(), kMaxModelElements);
  spec.units.push_back({"c", {{"bias", {1}, true}}});
  ExpectRefused(spec, "passes it at param 'c.bias'");
  // Units whose sum wraps int64: every unit alone is below the limit.
  ModelSpec many;
  for (int u = 0; u < 300; ++u) {
    many.units.push_back({"u" + std::to_string(u), {{"w", {int64_t{1} << 55}, false}}});
  }
  EXPECT_EQ(many.NumParams(), -1);
  ExpectRefused(many, "more than 72057594037927936 elements");
}

TEST(ModelSpecTest, UnitAndTensorCountsAreCapped) {
  ModelSpec spec;
  for (int64_t u = 0; u <= kMaxUnits; ++u) {
    spec.units.push_back({"u" + std::to_string(u), {{"w", {2}, false}}});
  }
  ExpectRefused(spec, "65537 units; the supported maximum is 65536");
  spec.units.resize(kMaxUnits);
  EXPECT_TRUE(spec.Validate().ok());
  ModelSpec tensors;
  tensors.units.push_back({"wide", {}});
  for (int64_t p = 0; p <= kMaxModelTensors; ++p) {
    tensors.units[0].params.push_back({"p" + std::to_string(p), {1}, false});
  }
  ExpectRefused(tensors, "1048577 params (tensors)");
}

}  // namespace
}  // namespace zeroshard
