// ModelSpec::Validate: the structural rules and the element-count bound that
// keeps NumElements() and NumParams() from overflowing.
#include "zeroshard/model_spec.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace zeroshard {
namespace {

constexpr int64_t kTwoTo31 = int64_t{1} << 31;

ModelSpec OneParam(std::vector<int64_t> shape) {
  ModelSpec spec;
  spec.units.push_back({"block.0", {{"w", std::move(shape), false}}});
  return spec;
}

void ExpectRefused(const ModelSpec& spec, const std::string& fragment) {
  const absl::Status status = spec.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(fragment), std::string::npos) << status;
}

TEST(ModelSpecTest, CountsTheLargestRepresentableModel) {
  // 2^62 + (2^62 - 2^31) + (2^31 - 1) = 2^63 - 1 elements: the most an int64_t holds.
  ModelSpec spec = OneParam({kTwoTo31, kTwoTo31});
  spec.units.push_back(
      {"block.1", {{"w", {kTwoTo31, kTwoTo31 - 1}, false}, {"b", {kTwoTo31 - 1}, true}}});
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  EXPECT_EQ(spec.NumParams(), INT64_MAX);
}

TEST(ModelSpecTest, RefusesAParamWhoseElementCountOverflows) {
  // The spec_json fuzzer's reproducer: 129 x 1283333333333 x 33333333.
  ExpectRefused(OneParam({129, 1283333333333, 33333333}), "'block.0.w' brings the model past");
  ExpectRefused(OneParam({kTwoTo31, kTwoTo31, 2}), "'block.0.w' brings the model past");
}

TEST(ModelSpecTest, RefusesAModelWhoseTotalOverflows) {
  ModelSpec spec = OneParam({kTwoTo31, kTwoTo31});
  spec.units.push_back({"block.1", {{"w", {kTwoTo31, kTwoTo31}, false}}});
  ExpectRefused(spec, "'block.1.w' brings the model past 2^63-1 elements");
}

TEST(ModelSpecTest, NamesTheBrokenRule) {
  ExpectRefused(ModelSpec{}, "no units");
  ExpectRefused(OneParam({}), "'block.0.w' has no shape");
  ExpectRefused(OneParam({4, 0}), "'block.0.w' has dimension 0");
  ModelSpec twice = OneParam({4});
  twice.units.push_back(twice.units[0]);
  ExpectRefused(twice, "unit name 'block.0' appears twice");
}

}  // namespace
}  // namespace zeroshard
