// CheckSliceShape: a model-parallel param is a slice of the checkpoint's
// whole param only when its split dimension is exactly ceil(group / parts)
// per group. A wider part would read the indices past the group's end as
// padding (zeros), so a model with a larger dimension, e.g. a vocabulary
// widened from 256 to 300 rows, would load a 256-row checkpoint silently.
#include "engine/src/runtime/slice_reader.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

ParamOrigin Split(int dim, int groups, int parts, int part) {
  ParamOrigin o;
  o.unit = "embed";
  o.param = "wte.weight";
  o.split_dim = dim;
  o.groups = groups;
  o.parts = parts;
  o.part = part;
  return o;
}

TEST(SliceReaderTest, OnlyTheCeilPartOfEachGroupFits) {
  std::mt19937_64 rng(zeroshard::testing::Seed());
  std::uniform_int_distribution<int64_t> size(1, 400);
  std::uniform_int_distribution<int> small(1, 4);
  for (int trial = 0; trial < 500; ++trial) {
    const int groups = small(rng);
    const int parts = small(rng);
    const int64_t group = size(rng);
    const int64_t cols = size(rng) % 16 + 1;
    const std::vector<int64_t> whole = {group * groups, cols};
    const int64_t ceil = (group + parts - 1) / parts;
    for (int64_t local_part = 1; local_part <= group + 2; ++local_part) {
      const std::vector<int64_t> local = {local_part * groups, cols};
      const absl::Status s =
          CheckSliceShape(local, whole, Split(0, groups, parts, parts - 1), "param");
      EXPECT_EQ(s.ok(), local_part == ceil)
          << "group " << group << " parts " << parts << " part " << local_part << ": " << s;
    }
  }
}

TEST(SliceReaderTest, AWidenedVocabularyIsRefusedOnEveryTp) {
  // GPT-2's vocabulary as GridGptTrainer pads it: ceil(V / tp) rows a rank.
  const std::vector<int64_t> saved = {256, 32};
  for (int tp = 1; tp <= 4; ++tp) {
    const int64_t rows = (256 + tp - 1) / tp;
    EXPECT_TRUE(CheckSliceShape({rows, 32}, saved, Split(0, 1, tp, 0), "wte").ok()) << tp;
    const int64_t widened = (300 + tp - 1) / tp;
    const absl::Status s = CheckSliceShape({widened, 32}, saved, Split(0, 1, tp, tp - 1), "wte");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << tp << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "not ceil(256 / " + std::to_string(tp) + ")")) << s;
  }
  // The whole param (no split): the shapes must be equal.
  EXPECT_FALSE(CheckSliceShape({300, 32}, saved, Split(-1, 1, 1, 0), "wte").ok());
}

TEST(SliceReaderTest, RunsOfAPaddedPartMarkOnlyIndicesPastTheGroupAsPadding) {
  // 10 rows in 3 parts of ceil(10 / 3) = 4: the last part holds rows 8, 9
  // and two rows of padding.
  const std::vector<int64_t> whole = {10, 3};
  const std::vector<int64_t> local = {4, 3};
  const ParamOrigin o = Split(0, 1, 3, 2);
  ASSERT_TRUE(CheckSliceShape(local, whole, o, "p").ok());
  int64_t valid = 0;
  for (const SliceRun& r : SliceRuns(local, whole, o, 0, 12)) {
    valid += r.valid;
    if (r.valid > 0) EXPECT_EQ(r.source, 8 * 3 + (r.local)) << r.local;
  }
  EXPECT_EQ(valid, 2 * 3);
}

}  // namespace
}  // namespace zeroshard::internal
