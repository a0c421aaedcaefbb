#include "engine/src/layout/flat_layout.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

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
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
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
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 1);
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

// 2^20 ranks and a model at the 2^56-element limit: every size is exact
// (checked against 128-bit arithmetic), and nothing grows with the ranks.
TEST(FlatLayoutTest, TheLargestWorldAndModelStayExact) {
  ModelSpec spec;
  const int64_t big = (int64_t{1} << 56) - 1000003;
  spec.units.push_back({"big", {{"w", {big}, false}}});
  spec.units.push_back({"norm", {{"scale", {7}, true}, {"bias", {5}, true}}});
  for (int u = 0; u < 2000; ++u)
    spec.units.push_back({"u" + std::to_string(u), {{"b", {1}, true}}});
  const auto begin = std::chrono::steady_clock::now();
  for (int world : {kMaxWorldSize, kMaxWorldSize - 1, 999983}) {
    auto layout = FlatLayout::Create(spec, world);
    ASSERT_TRUE(layout.ok()) << layout.status();
    unsigned __int128 total = 0, shard_total = 0, max_unit = 0;
    for (int u = 0; u < layout->num_units(); ++u) {
      const UnitSegment& seg = layout->unit(u);
      unsigned __int128 used = 0;
      for (const ParamSpec& p : spec.units[u].params) {
        used = (used + kParamAlignment - 1) / kParamAlignment * kParamAlignment;
        used += static_cast<unsigned __int128>(p.shape[0]);
      }
      const unsigned __int128 per_rank = (used + world - 1) / world;
      const unsigned __int128 shard =
          (per_rank + kShardQuantum - 1) / kShardQuantum * kShardQuantum;
      EXPECT_EQ(static_cast<unsigned __int128>(seg.used_numel), used) << "unit " << u;
      EXPECT_EQ(static_cast<unsigned __int128>(seg.shard_numel), shard) << "unit " << u;
      EXPECT_EQ(static_cast<unsigned __int128>(seg.padded_numel), shard * world) << "unit " << u;
      EXPECT_EQ(static_cast<unsigned __int128>(seg.offset), total) << "unit " << u;
      total += shard * world;
      shard_total += shard;
      if (shard * world > max_unit) max_unit = shard * world;
    }
    EXPECT_EQ(static_cast<unsigned __int128>(layout->total_numel()), total);
    EXPECT_EQ(static_cast<unsigned __int128>(layout->shard_numel()), shard_total);
    EXPECT_EQ(static_cast<unsigned __int128>(layout->max_unit_numel()), max_unit);
    // The last rank's range ends at the padded segment.
    EXPECT_EQ(layout->ShardRange(0, world - 1).end, layout->unit(0).padded_numel);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_LT(seconds, 1.0) << "a layout must not do per-rank work";
}

// The sizes-only layout the planner uses gives Create's segments exactly.
TEST(FlatLayoutTest, SizesOnlyLayoutsMatchCreate) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 2);
  for (int trial = 0; trial < 40; ++trial) {
    const ModelSpec spec = RandomSpec(rng);
    const int world = std::uniform_int_distribution<int>(1, kMaxWorldSize)(rng);
    auto layout = FlatLayout::Create(spec, world);
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::vector<int64_t> used;
    for (const UnitSpec& unit : spec.units) {
      auto n = FlatLayout::UsedNumel(unit);
      ASSERT_TRUE(n.ok());
      std::vector<int64_t> numels;
      for (const ParamSpec& p : unit.params) numels.push_back(p.NumElements());
      EXPECT_EQ(*FlatLayout::UsedNumel(numels), *n);
      used.push_back(*n);
    }
    auto sizes = FlatLayout::FromUsedNumels(used, world);
    ASSERT_TRUE(sizes.ok()) << sizes.status();
    ASSERT_EQ(sizes->num_units(), layout->num_units());
    for (int u = 0; u < layout->num_units(); ++u) {
      EXPECT_EQ(sizes->unit(u).used_numel, layout->unit(u).used_numel);
      EXPECT_EQ(sizes->unit(u).shard_numel, layout->unit(u).shard_numel);
      EXPECT_EQ(sizes->unit(u).padded_numel, layout->unit(u).padded_numel);
      EXPECT_EQ(sizes->unit(u).offset, layout->unit(u).offset);
      EXPECT_EQ(sizes->unit(u).shard_offset, layout->unit(u).shard_offset);
      EXPECT_TRUE(sizes->unit(u).params.empty());
    }
    EXPECT_EQ(sizes->total_numel(), layout->total_numel());
    EXPECT_EQ(sizes->shard_numel(), layout->shard_numel());
    EXPECT_EQ(sizes->max_unit_numel(), layout->max_unit_numel());
  }
  EXPECT_FALSE(FlatLayout::FromUsedNumels({}, 1).ok());
  EXPECT_FALSE(FlatLayout::FromUsedNumels({5, 0}, 1).ok());
  EXPECT_FALSE(FlatLayout::FromUsedNumels({int64_t{1} << 62, int64_t{1} << 62}, 4).ok());
  EXPECT_FALSE(FlatLayout::UsedNumel(
                   std::vector<int64_t>{int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62})
                   .ok());
}

TEST(FlatLayoutTest, RejectsBadWorldSizesAndSpecs) {
  ModelSpec spec;
  spec.units.push_back({"u", {{"w", {3, 4}, false}}});
  EXPECT_FALSE(FlatLayout::Create(spec, 0).ok());
  EXPECT_FALSE(FlatLayout::Create(spec, kMaxWorldSize + 1).ok());
  EXPECT_TRUE(FlatLayout::Create(spec, kMaxWorldSize).ok());
  ModelSpec bad = spec;
  bad.units[0].params[0].shape = {3, 0};
  auto status = FlatLayout::Create(bad, 2).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("u.w"), std::string::npos) << status;
  bad = spec;
  bad.units.push_back(spec.units[0]);
  EXPECT_NE(FlatLayout::Create(bad, 2).status().message().find("twice"), std::string::npos);
}

TEST(FlatLayoutTest, FrozenAndTiedParamsGetStorageSegmentsOfTheirOwn) {
  std::mt19937_64 rng(Seed());
  auto dim = [&]() { return 1 + static_cast<int64_t>(rng() % 300); };
  const int64_t h = dim();
  ModelSpec spec;
  // a: w (the tie's owner), b (trained), f (frozen); frz: x (frozen only);
  // c: w (tied to a.w), c (trained).
  spec.units.push_back({"a", {{"w", {dim(), h}}, {"b", {dim()}}, {"f", {dim(), 3}}}});
  spec.units[0].params[2].trainable = false;
  spec.units.push_back({"frz", {{"x", {dim()}}}});
  spec.units[1].params[0].trainable = false;
  spec.units.push_back({"c", {{"w", spec.units[0].params[0].shape}, {"c", {dim()}}}});
  spec.units[2].params[0].tied_to = ParamRef{"a", "w"};
  ASSERT_FALSE(OneSegmentPerUnit(spec));
  const int world = 1 + static_cast<int>(rng() % 5);
  SCOPED_TRACE(SeedTrace());
  auto layout = FlatLayout::Create(spec, world);
  ASSERT_TRUE(layout.ok()) << layout.status();
  // Segments in order: a's trained {b}, a's frozen {f}, the tie {a.w},
  // frz's frozen {x}, c's trained {c}.
  ASSERT_EQ(layout->num_units(), 5);
  ASSERT_EQ(layout->num_spec_units(), 3);
  const std::vector<std::vector<std::pair<int, int>>> holds = {
      {{0, 1}}, {{0, 2}}, {{0, 0}}, {{1, 0}}, {{2, 1}}};
  const std::vector<bool> trainable = {true, false, true, false, true};
  int64_t train_total = 0;
  for (int s = 0; s < 5; ++s) {
    const UnitSegment& seg = layout->unit(s);
    ASSERT_EQ(seg.params.size(), holds[s].size()) << s;
    for (size_t k = 0; k < seg.params.size(); ++k) {
      EXPECT_EQ(seg.params[k].spec_unit, holds[s][k].first) << s;
      EXPECT_EQ(seg.params[k].spec_param, holds[s][k].second) << s;
    }
    EXPECT_EQ(seg.trainable, trainable[s]) << s;
    // Gradients and optimizer state: the trainable segments, back to back.
    EXPECT_EQ(seg.train_offset, trainable[s] ? train_total : -1) << s;
    if (trainable[s]) train_total += seg.padded_numel;
  }
  EXPECT_EQ(layout->train_total_numel(), train_total);
  EXPECT_EQ(
      layout->train_total_numel() + layout->unit(1).padded_numel + layout->unit(3).padded_numel,
      layout->total_numel());
  EXPECT_EQ(layout->SegmentsOf(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(layout->SegmentsOf(1), (std::vector<int>{3}));
  EXPECT_EQ(layout->SegmentsOf(2), (std::vector<int>{2, 4}));
  // The alias is its owner's storage; both units write the tie's gradient.
  EXPECT_EQ(layout->PlaceOf(2, 0).segment, 2);
  EXPECT_EQ(layout->PlaceOf(2, 0).slot, 0);
  EXPECT_EQ(layout->PlaceOf(0, 0).segment, 2);
  EXPECT_EQ(layout->UsersOf(2), (std::vector<int>{0, 2}));
  EXPECT_EQ(layout->UsersOf(0), (std::vector<int>{0}));
  EXPECT_TRUE(layout->UsersOf(1).empty());
  EXPECT_TRUE(layout->UsersOf(3).empty());
  // Without frozen or tied params: one segment per unit, as before.
  spec.units[0].params[2].trainable = true;
  spec.units[1].params[0].trainable = true;
  spec.units[2].params[0].tied_to.reset();
  EXPECT_TRUE(OneSegmentPerUnit(spec));
  auto plain = FlatLayout::Create(spec, world);
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->num_units(), 3);
  for (int u = 0; u < 3; ++u) {
    EXPECT_EQ(plain->SegmentsOf(u), std::vector<int>{u});
    EXPECT_EQ(plain->unit(u).params.size(), spec.units[u].params.size());
  }
}

}  // namespace
}  // namespace zeroshard::internal

namespace zeroshard::internal {
namespace {

// With frozen and tied params: the segments Create makes, given to
// FromUsedNumels with their flags and the segments each unit reads, give
// the same segments, trainable sums, SegmentsOf and UsersOf.
TEST(FlatLayoutTest, SizesOnlyLayoutWithGroupsMatchesCreateWithFrozenAndTiedParams) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 3);
  auto coin = [&rng] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  for (int trial = 0; trial < 40; ++trial) {
    ModelSpec spec;
    const int64_t h = std::uniform_int_distribution<int64_t>(1, 97)(rng);
    const int64_t vocab = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    ParamSpec table{"table", {vocab, h}};
    table.trainable = coin();
    UnitSpec embed{"embed", {table}};
    if (coin()) embed.params.push_back(ParamSpec{"pos", {h}});
    spec.units.push_back(embed);
    const int blocks = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int b = 0; b < blocks; ++b) {
      UnitSpec unit;
      unit.name = "block" + std::to_string(b);
      const int params = std::uniform_int_distribution<int>(1, 5)(rng);
      for (int p = 0; p < params; ++p) {
        ParamSpec param{"p" + std::to_string(p),
                        {std::uniform_int_distribution<int64_t>(1, 200)(rng), h}};
        param.trainable = coin();
        unit.params.push_back(param);
      }
      spec.units.push_back(unit);
    }
    ParamSpec head_w{"w", {vocab, h}};
    head_w.trainable = table.trainable;
    head_w.tied_to = ParamRef{"embed", "table"};
    UnitSpec head{"head", {head_w}};
    if (coin()) head.params.push_back(ParamSpec{"bias", {vocab}});
    spec.units.push_back(head);
    ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
    const int world = std::uniform_int_distribution<int>(1, 64)(rng);
    auto layout = FlatLayout::Create(spec, world);
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::vector<int64_t> used;
    std::vector<bool> trainable;
    for (int s = 0; s < layout->num_units(); ++s) {
      used.push_back(layout->unit(s).used_numel);
      trainable.push_back(layout->unit(s).trainable);
    }
    std::vector<std::vector<int>> groups;
    for (int u = 0; u < layout->num_spec_units(); ++u) groups.push_back(layout->SegmentsOf(u));
    auto sizes = FlatLayout::FromUsedNumels(used, world, trainable, groups);
    ASSERT_TRUE(sizes.ok()) << sizes.status();
    ASSERT_EQ(sizes->num_units(), layout->num_units());
    for (int s = 0; s < layout->num_units(); ++s) {
      const UnitSegment& a = sizes->unit(s);
      const UnitSegment& b = layout->unit(s);
      EXPECT_EQ(a.padded_numel, b.padded_numel);
      EXPECT_EQ(a.shard_offset, b.shard_offset);
      EXPECT_EQ(a.trainable, b.trainable);
      EXPECT_EQ(a.train_offset, b.train_offset);
      EXPECT_EQ(a.train_shard_offset, b.train_shard_offset);
      EXPECT_EQ(a.spec_unit, b.spec_unit);
      EXPECT_EQ(sizes->UsersOf(s), layout->UsersOf(s)) << "segment " << s;
    }
    ASSERT_EQ(sizes->num_spec_units(), layout->num_spec_units());
    for (int u = 0; u < layout->num_spec_units(); ++u) {
      EXPECT_EQ(sizes->SegmentsOf(u), layout->SegmentsOf(u));
    }
    EXPECT_EQ(sizes->train_total_numel(), layout->train_total_numel());
    EXPECT_EQ(sizes->train_shard_numel(), layout->train_shard_numel());
    EXPECT_EQ(sizes->max_unit_numel(), layout->max_unit_numel());
  }
  // A segment index out of range, and a segment no unit reads.
  EXPECT_FALSE(FlatLayout::FromUsedNumels({5, 6}, 1, {}, {{0}, {2}}).ok());
  EXPECT_FALSE(FlatLayout::FromUsedNumels({5, 6}, 1, {}, {{0}}).ok());
  EXPECT_TRUE(FlatLayout::FromUsedNumels({5, 6}, 1, {true, false}, {{0, 1}}).ok());
}

}  // namespace
}  // namespace zeroshard::internal
