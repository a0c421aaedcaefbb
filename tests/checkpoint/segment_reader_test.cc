// SegmentReader: a range of a unit's segment read from the rank files of a
// checkpoint written at any world size, compared with the segment as the
// test generated it (an independent reference: no layout code involved in
// the expected values), with random models, world sizes, ranges and tensor
// subsets from the test seed.
#include "engine/src/checkpoint/segment_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/layout/flat_layout.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

constexpr float kUntouched = -1234.5f;

class SegmentReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/zs_segment_reader_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  // A checkpoint of `world` ranks of a random model in dir_; values[u][t]
  // is tensor t of unit u over its used elements, as generated.
  void WriteCheckpoint(std::mt19937_64& rng, int world) {
    const int units = static_cast<int>(rng() % 3) + 2;
    for (int u = 0; u < units; ++u) {
      UnitSpec unit{absl::StrCat("unit.", u), {}};
      const int params = static_cast<int>(rng() % 3) + 1;
      for (int p = 0; p < params; ++p) {
        // Some params past one checksum chunk (65536 elements).
        // Unit 0's first param: at least 1000 elements, so that every one
        // of up to 4 ranks holds some of unit 0's used elements.
        const int64_t numel = u == 0 && p == 0
                                  ? 1000 + static_cast<int64_t>(rng() % 90000)
                                  : static_cast<int64_t>(rng() % (rng() % 2 ? 90000 : 900)) + 1;
        unit.params.push_back({absl::StrCat("p", p), {numel}, p % 2 == 1});
      }
      manifest_.model.units.push_back(unit);
    }
    absl::StatusOr<FlatLayout> layout = FlatLayout::Create(manifest_.model, world);
    ASSERT_TRUE(layout.ok()) << layout.status();
    manifest_.world_size = world;
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    values_.assign(units, {});
    for (int u = 0; u < units; ++u) {
      manifest_.used_numel.push_back(layout->unit(u).used_numel);
      manifest_.shard_numel.push_back(layout->unit(u).shard_numel);
      for (int t = 0; t < kTensorsPerUnit; ++t) {
        std::vector<float> v(static_cast<size_t>(layout->unit(u).used_numel));
        for (float& x : v) x = uniform(rng);
        values_[u].push_back(std::move(v));
      }
    }
    for (int r = 0; r < world; ++r) {
      // The file's data: for each unit, for each tensor, rank r's shard.
      std::vector<float> data;
      for (int u = 0; u < units; ++u) {
        const int64_t shard = manifest_.shard_numel[u];
        for (int t = 0; t < kTensorsPerUnit; ++t) {
          for (int64_t i = r * shard; i < (r + 1) * shard; ++i) {
            data.push_back(i < manifest_.used_numel[u] ? values_[u][t][i] : 0.0f);
          }
        }
      }
      absl::StatusOr<FileRecord> rec =
          WriteRankFile(JoinPath(dir_, RankFileName(r)), r, world, manifest_.shard_numel, data);
      ASSERT_TRUE(rec.ok()) << rec.status();
      manifest_.files.push_back(*rec);
    }
  }

  // Reads [begin, end) of unit u for the tensors in `wanted` and compares.
  void ExpectRange(SegmentReader& reader, int u, int64_t begin, int64_t end,
                   const bool wanted[kTensorsPerUnit]) {
    std::vector<float> out[kTensorsPerUnit];
    float* ptrs[kTensorsPerUnit] = {};
    for (int t = 0; t < kTensorsPerUnit; ++t) {
      out[t].assign(static_cast<size_t>(end - begin), kUntouched);
      if (wanted[t]) ptrs[t] = out[t].data();
    }
    const absl::Status read = reader.Read(u, begin, end, ptrs);
    ASSERT_TRUE(read.ok()) << read << "; " << SeedTrace();
    const int64_t used = static_cast<int64_t>(values_[u][0].size());
    for (int t = 0; t < kTensorsPerUnit; ++t) {
      for (int64_t i = begin; i < end; ++i) {
        const float expected = wanted[t] && i < used ? values_[u][t][i] : kUntouched;
        ASSERT_EQ(out[t][i - begin], expected)
            << "unit " << u << " tensor " << t << " element " << i << " of [" << begin << ", "
            << end << "); " << SeedTrace();
      }
    }
  }

  std::string dir_;
  Manifest manifest_;
  std::vector<std::vector<std::vector<float>>> values_;  // [unit][tensor][element]
};

TEST_F(SegmentReaderTest, RandomRangesOfEveryWorldSizeMatchTheWrittenSegment) {
  std::mt19937_64 rng(Seed());
  const int world = static_cast<int>(rng() % 4) + 1;
  WriteCheckpoint(rng, world);
  SegmentReader reader(dir_, manifest_);
  for (int u = 0; u < static_cast<int>(manifest_.shard_numel.size()); ++u) {
    const int64_t padded = manifest_.shard_numel[u] * world;
    const bool all[kTensorsPerUnit] = {true, true, true};
    // The whole segment, each old shard whole (as Load at the same world
    // size), and random ranges with random tensor subsets (as Load at
    // another world size, and export's master only).
    ExpectRange(reader, u, 0, padded, all);
    for (int r = 0; r < world; ++r) {
      ExpectRange(reader, u, r * manifest_.shard_numel[u], (r + 1) * manifest_.shard_numel[u], all);
    }
    for (int k = 0; k < 6; ++k) {
      int64_t a = static_cast<int64_t>(rng() % (padded + 1));
      int64_t b = static_cast<int64_t>(rng() % (padded + 1));
      if (a > b) std::swap(a, b);
      bool wanted[kTensorsPerUnit];
      for (bool& w : wanted) w = rng() % 2 == 1;
      ExpectRange(reader, u, a, b, wanted);
    }
  }
  EXPECT_EQ(reader.files_opened(), world);
}

TEST_F(SegmentReaderTest, OpensOnlyTheFilesWhoseShardsOverlapAndChecksWhatItReads) {
  std::mt19937_64 rng(Seed());
  const int world = 3;
  WriteCheckpoint(rng, world);
  // Unit 0 inside old rank 1's shard: one file opened.
  const int64_t shard = manifest_.shard_numel[0];
  const bool master[kTensorsPerUnit] = {true, false, false};
  {
    SegmentReader reader(dir_, manifest_);
    ExpectRange(reader, 0, shard, shard + std::max<int64_t>(1, shard / 2), master);
    EXPECT_EQ(reader.files_opened(), 1);
  }
  // A damaged byte in rank 2's data of unit 0, tensor 0: a read that
  // touches it fails naming the file; one that does not still succeeds.
  const std::string path = JoinPath(dir_, RankFileName(2));
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte = 0;
  const off_t at = kHeaderBytes + 4;  // unit 0, tensor 0, element 1 of the shard
  ASSERT_EQ(pread(fd, &byte, 1, at), 1);
  byte ^= 0x40;
  ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
  close(fd);
  SegmentReader reader(dir_, manifest_);
  ExpectRange(reader, 0, 0, 2 * shard, master);
  ASSERT_GT(manifest_.used_numel[0], 2 * shard + 1);
  float two[2];
  float* ptrs[kTensorsPerUnit] = {two, nullptr, nullptr};
  const absl::Status damaged = reader.Read(0, 2 * shard, 2 * shard + 2, ptrs);
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss) << damaged;
  EXPECT_NE(damaged.message().find(RankFileName(2)), std::string::npos) << damaged;
  float out[1];
  float* bad_unit[kTensorsPerUnit] = {out, nullptr, nullptr};
  EXPECT_EQ(reader.Read(99, 0, 1, bad_unit).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zeroshard::internal
