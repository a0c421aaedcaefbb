// LossScaler on its own: its transitions against a sequence worked by hand.
#include "engine/src/runtime/loss_scaler.h"

#include <ostream>
#include <random>

#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {

// How gtest prints a state in a failure: {scale, hysteresis left, clean
// steps, skips at min scale}.
void PrintTo(const LossScaler::State& s, std::ostream* os) {
  *os << "{" << s.scale << ", " << s.hysteresis_left << ", " << s.clean_steps << ", "
      << s.skips_at_min_scale << "}";
}

namespace {

LossScaleSpec SmallSpec() {
  LossScaleSpec spec;
  spec.initial_scale = 8.0;
  spec.growth_factor = 2.0;
  spec.backoff_factor = 0.5;
  spec.growth_interval = 3;
  spec.hysteresis = 2;
  spec.min_scale = 2.0;
  spec.max_skips_at_min_scale = 2;
  return spec;
}

TEST(LossScalerTest, FollowsTheHandWorkedSequence) {
  LossScaler scaler(Precision::kFp16Mixed, SmallSpec());
  ASSERT_TRUE(scaler.dynamic());
  EXPECT_EQ(scaler.state(), (LossScaler::State{8.0, 2, 0, 0}));
  // {overflow, scale, hysteresis left, clean steps, skips at min scale}
  // after each step, worked out by hand from the rules in loss_scaler.h.
  struct Row {
    bool overflow;
    LossScaler::State after;
  };
  const Row rows[] = {
      {false, {8.0, 2, 1, 0}},   // 1 clean
      {false, {8.0, 2, 2, 0}},   // 2 clean
      {false, {16.0, 2, 0, 0}},  // 3 clean: the interval is full, the scale grows
      {true, {16.0, 1, 0, 0}},   // 4 skipped: hysteresis absorbs it
      {true, {8.0, 2, 0, 0}},    // 5 skipped: backs off, hysteresis refilled
      {false, {8.0, 2, 1, 0}},   // 6 clean
      {true, {8.0, 1, 0, 0}},    // 7 skipped: the clean run restarts
      {true, {4.0, 2, 0, 0}},    // 8 skipped: backs off
      {true, {4.0, 1, 0, 0}},    // 9
      {true, {2.0, 2, 0, 0}},    // 10: down to min_scale
      {true, {2.0, 1, 0, 1}},    // 11: at the minimum, a skip counts
      {false, {2.0, 1, 1, 0}},   // 12 clean: the count of skips restarts
      {true, {2.0, 2, 0, 1}},    // 13: backs off, but not below min_scale
  };
  int64_t step = 0;
  for (const Row& row : rows) {
    ++step;
    ASSERT_TRUE(scaler.Update(row.overflow, step).ok()) << "step " << step;
    EXPECT_EQ(scaler.state(), row.after) << "after step " << step;
  }
  // 14: the second skip in a row at the minimum scale is an error.
  const absl::Status failed = scaler.Update(true, 14);
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition) << failed;
  EXPECT_NE(failed.message().find("Step 14: 2 steps in a row"), absl::string_view::npos) << failed;
}

TEST(LossScalerTest, FixedWithoutFp16AndRestoresItsState) {
  std::mt19937_64 rng(testing::Seed());
  for (Precision p : {Precision::kFp32, Precision::kBf16Mixed}) {
    LossScaler scaler(p, SmallSpec());
    EXPECT_FALSE(scaler.dynamic());
    for (int step = 1; step <= 50; ++step) {
      ASSERT_TRUE(scaler.Update(rng() % 2 == 0, step).ok()) << testing::SeedTrace();
      EXPECT_EQ(scaler.state(), (LossScaler::State{1.0, 1, 0, 0})) << testing::SeedTrace();
    }
  }
  LossScaler scaler(Precision::kFp16Mixed, SmallSpec());
  const LossScaler::State saved{32.0, 1, 2, 0};
  scaler.Restore(saved);
  EXPECT_EQ(scaler.state(), saved);
  ASSERT_TRUE(scaler.Update(false, 1).ok());  // the third clean step grows it
  EXPECT_EQ(scaler.state(), (LossScaler::State{64.0, 2, 0, 0}));
}

}  // namespace
}  // namespace zeroshard::internal
