// ModelSpec counts are exact or refused: no product or sum of int64s wraps,
// and the documented limits (2^56 elements, 65536 units, 2^20 tensors) are
// checked with errors naming the unit and the param. Also the checked
// arithmetic they rest on. Also the model-parallel cuts: ShardModelSpec's
// tp splits and PipelineStageUnits' balance (against a brute force).
#include "zeroshard/model_spec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "engine/src/common/checked_math.h"
#include "engine/src/common/tp_split.h"
#include "gtest/gtest.h"
#include "tests/common/model_spec_test_util.h"
#include "tests/grid_test_util.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

using testing::ExpectRefused;
using testing::OneParam;

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

TEST(ShardModelSpecTest, SplitsTheMarkedDimensionAndKeepsReplicatedParamsWhole) {
  const ModelSpec model = testing::MlpGridSpec(4, 8);
  for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
    auto shard = ShardModelSpec(model, 2, tp_rank, 2, 1);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_EQ(shard->units.size(), 2u);
    EXPECT_EQ(shard->units[0].name, "block.2");
    EXPECT_EQ(shard->units[1].name, "block.3");
    const UnitSpec& unit = shard->units[0];
    EXPECT_EQ(unit.params[0].shape, (std::vector<int64_t>{16, 8}));  // w1 [4h/2, h]
    EXPECT_EQ(unit.params[1].shape, (std::vector<int64_t>{16}));     // b1 [4h/2]
    EXPECT_EQ(unit.params[2].shape, (std::vector<int64_t>{8, 16}));  // w2 [h, 4h/2]
    EXPECT_EQ(unit.params[3].shape, (std::vector<int64_t>{8}));      // b2 whole
    EXPECT_EQ(unit.params[2].tp_split_dim, 1);
    EXPECT_EQ(unit.params[3].tp_split_dim, -1);
    EXPECT_TRUE(unit.params[1].no_decay);
    EXPECT_TRUE(shard->Validate().ok());
  }
  // tp = pp = 1 is the model itself.
  auto whole = ShardModelSpec(model, 1, 0, 1, 0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->NumParams(), model.NumParams());
  // The tp shards of every stage together hold the model, replicated params
  // once per tp rank: per unit 3 split params / tp + b2 whole.
  for (int tp : {1, 2, 4}) {
    int64_t sum = 0;
    for (int pp_rank = 0; pp_rank < 4; ++pp_rank) {
      for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
        auto shard = ShardModelSpec(model, tp, tp_rank, 4, pp_rank);
        ASSERT_TRUE(shard.ok()) << shard.status();
        sum += shard->NumParams();
      }
    }
    EXPECT_EQ(sum, model.NumParams() + int64_t{4} * 8 * (tp - 1)) << "tp " << tp;
  }
}

TEST(ShardModelSpecTest, RefusesIndivisibleSplitsAndBadRanksNamingTheParam) {
  const ModelSpec model = testing::MlpGridSpec(2, 6);  // 4h = 24, h = 6
  auto three = ShardModelSpec(model, 3, 0, 1, 0);      // 24 and 6 divide by 3
  EXPECT_TRUE(three.ok()) << three.status();
  auto four = ShardModelSpec(model, 4, 1, 1, 0);  // w1 [24, 6] ok; w2 [6, 24] ok; b1 ok ...
  EXPECT_TRUE(four.ok()) << four.status();
  auto five = ShardModelSpec(model, 5, 0, 1, 0);
  ASSERT_FALSE(five.ok());
  EXPECT_EQ(five.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(five.status().message().find("param 'block.0.w1' of shape [24, 6] splits dimension 0"),
            std::string::npos)
      << five.status();
  EXPECT_NE(five.status().message().find("tp 5"), std::string::npos) << five.status();
  // Only the split dimension matters: h = 6 is not split in w1.
  ModelSpec odd = testing::MlpGridSpec(2, 6);
  odd.units[1].params[2].shape = {6, 25};      // w2 of block.1: 25 over tp 5 would do, 25 / 2 not
  auto two = ShardModelSpec(odd, 2, 0, 2, 0);  // stage 0 holds block.0 only: fine
  EXPECT_TRUE(two.ok()) << two.status();
  auto two_last = ShardModelSpec(odd, 2, 0, 2, 1);
  ASSERT_FALSE(two_last.ok());
  EXPECT_NE(two_last.status().message().find("'block.1.w2'"), std::string::npos)
      << two_last.status();
  for (auto [tp, tp_rank, pp, pp_rank] : std::vector<std::array<int, 4>>{
           {0, 0, 1, 0}, {2, 2, 1, 0}, {2, -1, 1, 0}, {1, 0, 0, 0}, {1, 0, 2, 2}, {1, 0, 3, 0}}) {
    auto bad = ShardModelSpec(model, tp, tp_rank, pp, pp_rank);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument)
        << tp << " " << tp_rank << " " << pp << " " << pp_rank;
  }
  ModelSpec out_of_range = testing::MlpGridSpec(1, 4);
  out_of_range.units[0].params[3].tp_split_dim = 1;  // b2 has one dimension
  ExpectRefused(out_of_range, "param 'block.0.b2' of shape [4] has tp_split_dim 1");
  EXPECT_FALSE(ShardModelSpec(out_of_range, 1, 0, 1, 0).ok());
}

// The smallest possible largest-stage element count over every split of
// `sizes` into `pp` contiguous non-empty stages (exhaustive).
int64_t BruteForceBound(const std::vector<int64_t>& sizes, int pp) {
  int64_t best = std::numeric_limits<int64_t>::max();
  std::function<void(size_t, int, int64_t)> go = [&](size_t begin, int left, int64_t worst) {
    if (left == 1) {
      int64_t rest = 0;
      for (size_t i = begin; i < sizes.size(); ++i) rest += sizes[i];
      best = std::min(best, std::max(worst, rest));
      return;
    }
    int64_t run = 0;
    for (size_t end = begin + 1; end + (left - 1) <= sizes.size(); ++end) {
      run += sizes[end - 1];
      go(end, left - 1, std::max(worst, run));
    }
  };
  go(0, pp, 0);
  return best;
}

TEST(PipelineStageUnitsTest, ContiguousCoveringNonEmptyAndOptimalOnRandomSpecs) {
  std::mt19937_64 rng(testing::Seed());
  for (int trial = 0; trial < 400; ++trial) {
    const int units = 1 + static_cast<int>(rng() % 9);
    ModelSpec model;
    std::vector<int64_t> sizes;
    for (int u = 0; u < units; ++u) {
      // Mostly similar units, now and then a very large or tiny one.
      const int64_t n = rng() % 5 == 0 ? 1 + static_cast<int64_t>(rng() % 5000)
                                       : 90 + static_cast<int64_t>(rng() % 20);
      model.units.push_back({"u" + std::to_string(u), {{"w", {n}, false}}});
      sizes.push_back(n);
    }
    const int pp = 1 + static_cast<int>(rng() % units);
    auto stages = PipelineStageUnits(model, pp);
    ASSERT_TRUE(stages.ok()) << stages.status() << " " << testing::SeedTrace();
    ASSERT_EQ(static_cast<int>(stages->size()), pp);
    int next = 0;
    int64_t worst = 0;
    for (const auto& [first, last] : *stages) {
      EXPECT_EQ(first, next) << testing::SeedTrace();
      EXPECT_LT(first, last) << testing::SeedTrace();
      int64_t sum = 0;
      for (int u = first; u < last; ++u) sum += sizes[u];
      worst = std::max(worst, sum);
      next = last;
    }
    EXPECT_EQ(next, units) << testing::SeedTrace();
    EXPECT_EQ(worst, BruteForceBound(sizes, pp))
        << "trial " << trial << ", " << units << " units, pp " << pp << ", "
        << testing::SeedTrace();
  }
}

TEST(PipelineStageUnitsTest, EqualUnitsSplitEvenlyWithTheFirstStageLightest) {
  const ModelSpec model = testing::MlpGridSpec(10, 4);
  auto stages = PipelineStageUnits(model, 4);
  ASSERT_TRUE(stages.ok()) << stages.status();
  const std::vector<std::pair<int, int>> expected = {{0, 1}, {1, 4}, {4, 7}, {7, 10}};
  EXPECT_EQ(*stages, expected);
  for (int pp : {0, 11, -1}) {
    auto bad = PipelineStageUnits(model, pp);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("pp " + std::to_string(pp)), std::string::npos)
        << bad.status();
  }
}

// The one tensor-parallel split of a param (ShardModelSpec refuses a
// remainder, the planner rounds it up): random shapes from the test seed,
// expected extents counted by hand.
TEST(TpShardShapeTest, DividesTheSplitDimensionAndRoundsUpOrRefusesARemainder) {
  std::mt19937_64 rng(testing::Seed());
  for (int k = 0; k < 200; ++k) {
    ParamSpec p;
    p.name = "w";
    const int dims = static_cast<int>(rng() % 3) + 1;
    for (int d = 0; d < dims; ++d) p.shape.push_back(static_cast<int64_t>(rng() % 1000) + 1);
    p.tp_split_dim = static_cast<int>(rng() % (dims + 1)) - 1;  // -1 .. dims-1
    const int tp = static_cast<int>(rng() % 8) + 1;
    std::vector<int64_t> padded = p.shape;
    bool divides = true;
    if (p.tp_split_dim >= 0 && tp > 1) {
      int64_t ranks_extent = 0;  // the least e with e * tp >= extent
      while (ranks_extent * tp < p.shape[p.tp_split_dim]) ++ranks_extent;
      divides = ranks_extent * tp == p.shape[p.tp_split_dim];
      padded[p.tp_split_dim] = ranks_extent;
    }
    const auto round_up = internal::TpShardShape(p, tp, internal::TpRemainder::kRoundUp, "u");
    ASSERT_TRUE(round_up.ok()) << round_up.status();
    EXPECT_EQ(*round_up, padded) << testing::SeedTrace();
    const auto refuse = internal::TpShardShape(p, tp, internal::TpRemainder::kRefuse, "u");
    if (divides) {
      ASSERT_TRUE(refuse.ok()) << refuse.status();
      EXPECT_EQ(*refuse, padded) << testing::SeedTrace();
    } else {
      EXPECT_EQ(refuse.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(refuse.status().message().find("param 'u.w'"), std::string::npos)
          << refuse.status();
    }
  }
}

// A unit on one of tp ranks, as ShardModelSpec and the planner both take
// it: every param split by hand (the least e with e * tp >= extent), names,
// no_decay and tp_split_dim kept; kRefuse fails on the first remainder.
TEST(TpShardShapeTest, AUnitSplitsEveryParamAndKeepsTheRest) {
  std::mt19937_64 rng(testing::Seed() + 1);
  for (int k = 0; k < 100; ++k) {
    UnitSpec unit;
    unit.name = "block." + std::to_string(k);
    const int tp = static_cast<int>(rng() % 8) + 1;
    const int params = static_cast<int>(rng() % 4) + 1;
    std::vector<std::vector<int64_t>> expected;
    bool divides = true;
    for (int i = 0; i < params; ++i) {
      ParamSpec p;
      p.name = "p" + std::to_string(i);
      p.shape = {static_cast<int64_t>(rng() % 300) + 1, static_cast<int64_t>(rng() % 300) + 1};
      p.tp_split_dim = static_cast<int>(rng() % 3) - 1;  // -1, 0 or 1
      p.no_decay = (rng() % 2) == 1;
      std::vector<int64_t> shape = p.shape;
      if (p.tp_split_dim >= 0) {
        int64_t e = 0;
        while (e * tp < p.shape[p.tp_split_dim]) ++e;
        divides = divides && e * tp == p.shape[p.tp_split_dim];
        shape[p.tp_split_dim] = e;
      }
      expected.push_back(shape);
      unit.params.push_back(p);
    }
    const auto round_up = internal::TpShardUnit(unit, tp, internal::TpRemainder::kRoundUp);
    ASSERT_TRUE(round_up.ok()) << round_up.status();
    EXPECT_EQ(round_up->name, unit.name);
    ASSERT_EQ(round_up->params.size(), unit.params.size());
    for (int i = 0; i < params; ++i) {
      const ParamSpec& got = round_up->params[i];
      EXPECT_EQ(got.shape, expected[i])
          << unit.name << "." << got.name << " tp " << tp << "; " << testing::SeedTrace();
      EXPECT_EQ(got.name, unit.params[i].name);
      EXPECT_EQ(got.no_decay, unit.params[i].no_decay);
      EXPECT_EQ(got.tp_split_dim, unit.params[i].tp_split_dim);
    }
    const auto refuse = internal::TpShardUnit(unit, tp, internal::TpRemainder::kRefuse);
    EXPECT_EQ(refuse.ok(), divides || tp == 1) << refuse.status();
  }
}

}  // namespace
}  // namespace zeroshard
