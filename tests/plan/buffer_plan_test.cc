// PlanBuffers: the stage-3 gather pool never holds more buffers than there
// are sharded units, and every buffer's bytes and their total are checked.
#include "engine/src/plan/buffer_plan.h"

#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard::internal {
namespace {

// Three units of different sizes and a small norm unit.
ModelSpec ThreeBlocksAndANorm() {
  ModelSpec spec;
  spec.units.push_back({"block.0", {{"w", {300, 40}, false}}});
  spec.units.push_back({"block.1", {{"w", {500, 20}, false}}});
  spec.units.push_back({"norm", {{"scale", {7}, true}}});
  spec.units.push_back({"block.2", {{"w", {100, 10}, false}}});
  return spec;
}

TrainSpec Stage3(int prefetch_units) {
  TrainSpec train;
  train.zero_stage = 3;
  train.precision = Precision::kBf16Mixed;
  train.prefetch_units = prefetch_units;
  return train;
}

TEST(BufferPlanTest, GatherPoolNeverHoldsMoreBuffersThanShardedUnits) {
  auto layout = FlatLayout::Create(ThreeBlocksAndANorm(), 4);
  ASSERT_TRUE(layout.ok()) << layout.status();
  for (const auto& [prefetch, persistent, slots] :
       std::vector<std::tuple<int, int64_t, int>>{{0, 0, 1},
                                                  {1, 0, 2},
                                                  {3, 0, 4},
                                                  {4, 0, 4},
                                                  {63, 0, 4},
                                                  {65536, 0, 4},  // TrainSpec's maximum
                                                  {63, 64, 3},
                                                  {63, 1 << 20, 0}}) {
    TrainSpec train = Stage3(prefetch);
    train.persistent_unit_numel = persistent;
    auto plan = PlanBuffers(*layout, train);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->gather_slots, slots) << "prefetch " << prefetch << " persistent " << persistent;
    const PlannedBuffer* pool = plan->Find(kParamGatherBuffer);
    if (slots == 0) {
      EXPECT_EQ(pool, nullptr);
      continue;
    }
    ASSERT_NE(pool, nullptr);
    EXPECT_EQ(pool->numel, slots * layout->max_unit_numel());
  }
}

TEST(BufferPlanTest, BytesPast2To63AreAnErrorNamingTheBuffer) {
  // One unit at the 2^56-element limit less a few, 63 tiny ones: 64 gather
  // buffers of the large unit hold 2^62 elements, 2^64 fp32 bytes.
  ModelSpec spec;
  spec.units.push_back({"big", {{"w", {(int64_t{1} << 56) - 8192}, false}}});
  for (int u = 0; u < 63; ++u) spec.units.push_back({"u" + std::to_string(u), {{"b", {1}, true}}});
  auto layout = FlatLayout::Create(spec, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  TrainSpec train = Stage3(63);
  train.precision = Precision::kFp32;
  auto plan = PlanBuffers(*layout, train);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("'param_gather'"), std::string::npos) << plan.status();
  // Two buffers ahead fit, exactly.
  train.prefetch_units = 1;
  plan = PlanBuffers(*layout, train);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Find(kParamGatherBuffer)->bytes(), 2 * 4 * layout->max_unit_numel());
  // fp32 stage 3 on one rank: params, grads, m, v (the shard), staging and
  // gather (two units each), the norm blocks.
  EXPECT_EQ(plan->total_bytes(), 4 * (4 * layout->shard_numel() + 4 * layout->max_unit_numel()) +
                                     plan->Find(kNormBlocksBuffer)->bytes());
}

}  // namespace
}  // namespace zeroshard::internal
