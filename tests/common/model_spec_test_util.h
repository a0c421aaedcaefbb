// Helpers of the ModelSpec tests (model_spec_test, model_spec_fields_test).
#ifndef ZEROSHARD_TESTS_COMMON_MODEL_SPEC_TEST_UTIL_H_
#define ZEROSHARD_TESTS_COMMON_MODEL_SPEC_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::testing {

// One unit "block" with one param "w" of `shape`.
inline ModelSpec OneParam(std::vector<int64_t> shape) {
  ModelSpec spec;
  spec.units.push_back({"block", {{"w", std::move(shape), false}}});
  return spec;
}

// Validate() refuses `spec` with InvalidArgument whose message holds `needle`.
inline void ExpectRefused(const ModelSpec& spec, const std::string& needle) {
  const absl::Status status = spec.Validate();
  ASSERT_FALSE(status.ok()) << needle;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(needle), std::string::npos) << status;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_COMMON_MODEL_SPEC_TEST_UTIL_H_
