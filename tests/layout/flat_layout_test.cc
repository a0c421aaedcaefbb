#include "engine/src/layout/flat_layout.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard {
namespace {

ModelSpec RandomSpec(std::mt19937_64& rng) {
  ModelSpec spec;
  const int units = std::uniform_int_distribution<int>(1, 6)(rng);
  for (int u = 0; u < units; ++u) {
    UnitSpec unit;
    unit.name = "unit" + std::to_string(u);
    const int params = std::uniform_int_distribution<int>(1, 5)(rng);
    for (int p = 0; p < params; ++p) {
      ParamSpec param;
      param.name = "p" + std::to_string(p);
      const int dims = std::uniform_int_distribution<int>(1, 3)(rng);
      for (int d = 0; d < dims; ++d) {
        param.shape.push_back(std::uniform_int_distribution<int64_t>(1, 97)(rng));
      }
      param.no_decay = rng() % 2;
      unit.params.push_back(param);
    }
    spec.units.push_back(unit);
  }
  return spec;
}

TEST(FlatLayoutTest, RandomSpecsAndWorldSizesGiveDisjointCoveringAlignedShards) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> worlds = {1, 2, 3, 4, 5, 7, 8, 13, 64, 100, 127, 1000, 1024};
  for (int trial = 0; trial < 60; ++trial) {
    const ModelSpec spec = RandomSpec(rng);
    const int world = trial < static_cast<int>(worlds.size())
                          ? worlds[trial]
                          : std::uniform_int_distribution<int>(1, 1024)(rng);
    auto layout = FlatLayout::Create(spec, world);
    ASSERT_TRUE(layout.ok()) << layout.status();
    int64_t offset = 0, shard_offset = 0;
    for (int u = 0; u < layout->num_units(); ++u) {
      const UnitSegment& seg = layout->unit(u);
      EXPECT_EQ(seg.offset, offset);
      EXPECT_EQ(seg.shard_offset, shard_offset);
      EXPECT_EQ(seg.shard_numel % kShardQuantum, 0);
      EXPECT_GT(seg.shard_numel, 0);
      EXPECT_EQ(seg.padded_numel, seg.shard_numel * world);
      EXPECT_GE(seg.padded_numel, seg.used_numel);
      // Shards cover the segment exactly once, in rank order.
      int64_t covered = 0;
      for (int r = 0; r < world; ++r) {
        const ElementRange range = layout->ShardRange(u, r);
        EXPECT_EQ(range.begin, covered);
        covered = range.end;
      }
      EXPECT_EQ(covered, seg.padded_numel);
      // Params are aligned, in order, disjoint, and match the spec.
      int64_t cursor = 0;
      for (size_t p = 0; p < seg.params.size(); ++p) {
        EXPECT_EQ(seg.params[p].offset % kParamAlignment, 0);
        EXPECT_GE(seg.params[p].offset, cursor);
        EXPECT_EQ(seg.params[p].numel, spec.units[u].params[p].NumElements());
        cursor = seg.params[p].offset + seg.params[p].numel;
      }
      EXPECT_EQ(cursor, seg.used_numel);
      // Params plus padding tile the segment.
      std::vector<ElementRange> pieces = layout->PaddingRanges(u);
      for (const ParamSlot& p : seg.params) pieces.push_back({p.offset, p.offset + p.numel});
      std::sort(pieces.begin(), pieces.end(),
                [](const ElementRange& a, const ElementRange& b) { return a.begin < b.begin; });
      int64_t pos = 0;
      for (const ElementRange& piece : pieces) {
        EXPECT_EQ(piece.begin, pos);
        EXPECT_GT(piece.size(), 0);
        pos = piece.end;
      }
      EXPECT_EQ(pos, seg.padded_numel);
      // Padding is bounded: at most one quantum per rank plus alignment gaps.
      EXPECT_LT(seg.padded_numel - seg.used_numel, world * kShardQuantum);
      offset += seg.padded_numel;
      shard_offset += seg.shard_numel;
    }
    EXPECT_EQ(layout->total_numel(), offset);
    EXPECT_EQ(layout->shard_numel(), shard_offset);
    EXPECT_EQ(layout->total_numel(), layout->shard_numel() * world);
  }
}

TEST(FlatLayoutTest, ParamOffsetsDoNotDependOnWorldSize) {
  std::mt19937_64 rng(std::random_device{}());
  const ModelSpec spec = RandomSpec(rng);
  auto one = FlatLayout::Create(spec, 1);
  ASSERT_TRUE(one.ok());
  for (int world : {2, 3, 7, 1024}) {
    auto other = FlatLayout::Create(spec, world);
    ASSERT_TRUE(other.ok());
    for (int u = 0; u < one->num_units(); ++u) {
      for (size_t p = 0; p < one->unit(u).params.size(); ++p) {
        EXPECT_EQ(one->unit(u).params[p].offset, other->unit(u).params[p].offset);
      }
    }
  }
}

TEST(FlatLayoutTest, RejectsBadWorldSizesAndSpecs) {
  ModelSpec spec;
  spec.units.push_back({"u", {{"w", {3, 4}, false}}});
  EXPECT_FALSE(FlatLayout::Create(spec, 0).ok());
  EXPECT_FALSE(FlatLayout::Create(spec, 1025).ok());
  ModelSpec bad = spec;
  bad.units[0].params[0].shape = {3, 0};
  auto status = FlatLayout::Create(bad, 2).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("u.w"), std::string::npos) << status;
  bad = spec;
  bad.units.push_back(spec.units[0]);
  EXPECT_NE(FlatLayout::Create(bad, 2).status().message().find("twice"), std::string::npos);
}

}  // namespace
}  // namespace zeroshard
