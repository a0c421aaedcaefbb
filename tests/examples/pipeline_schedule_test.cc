// The 1F1B schedule as data: order, memory bound and makespan of every
// stage's op list, run in simulated time.
#include "examples/mlp/pipeline_schedule.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace mlp {
namespace {

using testing::SeedTrace;

std::vector<std::vector<PipelineOp>> Pipeline(int stages, int micro) {
  std::vector<std::vector<PipelineOp>> ops;
  for (int s = 0; s < stages; ++s) ops.push_back(OneFOneBSchedule(stages, s, micro));
  return ops;
}

TEST(OneFOneB, EveryMicroBatchOnceForwardBeforeBackwardInOrderWithinTheMemoryBound) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 20; ++m) {
      for (int s = 0; s < p; ++s) {
        const std::vector<PipelineOp> ops = OneFOneBSchedule(p, s, m);
        ASSERT_EQ(ops.size(), 2u * m) << "p " << p << " m " << m << " s " << s;
        int next_forward = 0, next_backward = 0, in_flight = 0, max_in_flight = 0;
        for (const PipelineOp& op : ops) {
          if (op.kind == PipelineOpKind::kForward) {
            ASSERT_EQ(op.micro, next_forward++) << "forwards out of order, p " << p << " s " << s;
            max_in_flight = std::max(max_in_flight, ++in_flight);
          } else {
            ASSERT_EQ(op.micro, next_backward++) << "backwards out of order, p " << p << " s " << s;
            // Its forward ran: backwards trail forwards.
            ASSERT_LT(op.micro, next_forward) << "backward before forward, p " << p << " s " << s;
            --in_flight;
          }
        }
        EXPECT_EQ(in_flight, 0);
        EXPECT_LE(max_in_flight, p - s) << "p " << p << " m " << m << " s " << s;
        // The bound is reached: warm-up fills the pipeline when m allows.
        EXPECT_EQ(max_in_flight, std::min(p - s, m)) << "p " << p << " m " << m << " s " << s;
      }
    }
  }
}

TEST(OneFOneB, WarmupSteadyCooldownShape) {
  // Stage 0 of 4 with 6 micro-batches: 3 forwards, 3 x (F, B), 3 backwards.
  using K = PipelineOpKind;
  const std::vector<PipelineOp> expected = {
      {K::kForward, 0},  {K::kForward, 1},  {K::kForward, 2},  {K::kForward, 3},
      {K::kBackward, 0}, {K::kForward, 4},  {K::kBackward, 1}, {K::kForward, 5},
      {K::kBackward, 2}, {K::kBackward, 3}, {K::kBackward, 4}, {K::kBackward, 5}};
  EXPECT_EQ(OneFOneBSchedule(4, 0, 6), expected);
  // The last stage alternates from the start.
  const std::vector<PipelineOp> last = OneFOneBSchedule(4, 3, 2);
  EXPECT_EQ(last, (std::vector<PipelineOp>{
                      {K::kForward, 0}, {K::kBackward, 0}, {K::kForward, 1}, {K::kBackward, 1}}));
}

TEST(OneFOneB, OutOfRangeArgumentsGiveNoOps) {
  EXPECT_TRUE(OneFOneBSchedule(0, 0, 4).empty());
  EXPECT_TRUE(OneFOneBSchedule(2, 2, 4).empty());
  EXPECT_TRUE(OneFOneBSchedule(2, -1, 4).empty());
  EXPECT_TRUE(OneFOneBSchedule(2, 0, 0).empty());
}

// With equal stages the schedule completes in (m + p - 1) (tF + tB): the
// classic bound, bubble fraction (p - 1) / (m + p - 1). Op times are drawn
// from the test seed (integers, so the simulated sums are exact).
TEST(OneFOneB, SimulatedMakespanIsTheClassicBound) {
  std::mt19937_64 rng(testing::Seed());
  std::uniform_int_distribution<int> time(1, 9);
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 20; ++m) {
      int tf = time(rng), tb = time(rng);
      // 1F1B's bound assumes a backward no shorter than a forward (tB ~ 2 tF
      // in practice).
      if (tb < tf) std::swap(tf, tb);
      const auto makespan = SimulatePipeline(Pipeline(p, m), tf, tb);
      ASSERT_TRUE(makespan.ok()) << makespan.status() << " p " << p << " m " << m;
      EXPECT_EQ(*makespan, static_cast<double>((m + p - 1) * (tf + tb)))
          << "p " << p << " m " << m << " tF " << tf << " tB " << tb << "; " << SeedTrace();
    }
  }
}

TEST(OneFOneB, SimulationFindsADeadlock) {
  std::vector<std::vector<PipelineOp>> ops = Pipeline(2, 2);
  // Stage 0: F0 F1 B0 B1 -> B0 first: waits for stage 1's B0, which waits for
  // stage 0's F0, which comes after B0 on stage 0.
  std::swap(ops[0][0], ops[0][2]);
  const auto makespan = SimulatePipeline(ops, 1, 2);
  ASSERT_FALSE(makespan.ok());
  EXPECT_EQ(makespan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(makespan.status().message().find("stage 0"), std::string::npos) << makespan.status();
}

TEST(OneFOneB, SimulationRefusesBadTimes) {
  EXPECT_FALSE(SimulatePipeline(Pipeline(2, 2), 0, 1).ok());
  EXPECT_FALSE(SimulatePipeline({}, 1, 1).ok());
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard
