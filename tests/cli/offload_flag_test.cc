// --offload optimizer=device|host|nvme, --offload-dir and --offload-chunk
// (cli/offload_flag.h): the tiers, the errors naming the flag and the bad
// part, and the flags through a FlagSet walk.
#include "cli/offload_flag.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::cli {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

TEST(OffloadFlagTest, EachTierSetsTheOptimizerAndKeepsTheOtherFields) {
  std::mt19937_64 rng(Seed());
  const std::pair<const char*, MemoryTier> tiers[] = {
      {"device", MemoryTier::kDevice}, {"host", MemoryTier::kHost}, {"nvme", MemoryTier::kNvme}};
  for (int round = 0; round < 20; ++round) {
    const auto& [word, tier] = tiers[rng() % 3];
    OffloadSpec spec;
    spec.dir = absl::StrCat("/tmp/d", rng() % 1000);
    spec.chunk_numel = 1024 * static_cast<int64_t>(1 + rng() % 64);
    const OffloadSpec before = spec;
    ASSERT_TRUE(ParseOffloadFlag("--offload", absl::StrCat("optimizer=", word), &spec).ok())
        << word << " " << SeedTrace();
    EXPECT_EQ(spec.optimizer, tier) << word << " " << SeedTrace();
    EXPECT_EQ(spec.dir, before.dir);
    EXPECT_EQ(spec.chunk_numel, before.chunk_numel);
  }
}

TEST(OffloadFlagTest, GradsAndParamsTakeTheirTiersInAnyOrder) {
  std::mt19937_64 rng(Seed());
  const char* words[] = {"device", "host", "nvme"};
  const MemoryTier tiers[] = {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme};
  for (int round = 0; round < 30; ++round) {
    const int g = static_cast<int>(rng() % 2), p = static_cast<int>(rng() % 3);
    std::vector<std::string> parts = {"optimizer=host", absl::StrCat("grads=", words[g]),
                                      absl::StrCat("params=", words[p])};
    std::shuffle(parts.begin(), parts.end(), rng);
    const std::string text = absl::StrJoin(parts, ",");
    OffloadSpec spec;
    ASSERT_TRUE(ParseOffloadFlag("--offload", text, &spec).ok()) << text << " " << SeedTrace();
    EXPECT_EQ(spec.optimizer, MemoryTier::kHost) << text;
    EXPECT_EQ(spec.grads, g == 0 ? MemoryTier::kDevice : MemoryTier::kHost) << text;
    EXPECT_EQ(spec.params, tiers[p]) << text;
  }
}

TEST(OffloadFlagTest, BadValuesNameTheFlagAndThePartAndChangeNothing) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "empty"},
      {"host", "'host' is not state=tier"},
      {"optimizer", "'optimizer' is not state=tier"},
      {"=host", "is not state=tier"},
      {"optimizer=", "'' is not device, host or nvme"},
      {"optimizer=disk", "'disk' is not device, host or nvme"},
      {"optimizer=HOST", "'HOST' is not device, host or nvme"},
      {"master=host", "'master' cannot be offloaded"},
      {"optimizer=host,optimizer=nvme", "optimizer given twice"},
      {"optimizer=host,grads=nvme", "--offload grads: 'nvme' is not device or host"},
      {"params=disk", "--offload params: 'disk' is not device, host or nvme"},
      {"optimizer=host,params=host,params=device", "params given twice"},
      {"optimizer=host,", "'' is not state=tier"},
  };
  for (const auto& [text, message] : bad) {
    OffloadSpec spec;
    spec.optimizer = MemoryTier::kHost;
    const absl::Status s = ParseOffloadFlag("--offload", text, &spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "'" << text << "'";
    EXPECT_NE(s.message().find("--offload"), std::string::npos) << s;
    EXPECT_NE(s.message().find(message), std::string::npos) << "'" << text << "': " << s;
    EXPECT_EQ(spec.optimizer, MemoryTier::kHost) << "'" << text << "' changed the spec";
  }
}

TEST(OffloadFlagTest, FlagSetWalkAndTheChecksAfterIt) {
  std::mt19937_64 rng(Seed());
  const int64_t chunk = 1024 * static_cast<int64_t>(1 + rng() % 1024);
  std::vector<std::string> words = {
      "prog",      "--offload",       "optimizer=nvme",     "--offload-dir",
      "/tmp/swap", "--offload-chunk", std::to_string(chunk)};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  OffloadSpec spec;
  FlagSet flags;
  AddOffloadFlags(flags, &spec);
  bool help = false;
  ASSERT_TRUE(flags.Parse(static_cast<int>(argv.size()), argv.data(), &help).ok()) << SeedTrace();
  EXPECT_EQ(spec.optimizer, MemoryTier::kNvme);
  EXPECT_EQ(spec.dir, "/tmp/swap");
  EXPECT_EQ(spec.chunk_numel, chunk) << SeedTrace();
  EXPECT_TRUE(CheckOffloadFlags(spec).ok());

  OffloadSpec host_with_dir;
  host_with_dir.optimizer = MemoryTier::kHost;
  host_with_dir.dir = "/tmp/swap";
  const absl::Status s = CheckOffloadFlags(host_with_dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--offload-dir"), std::string::npos) << s;
  EXPECT_NE(s.message().find("host tier"), std::string::npos) << s;

  OffloadSpec odd_chunk;
  odd_chunk.chunk_numel = 1024 * static_cast<int64_t>(1 + rng() % 64) + 1 + rng() % 1023;
  EXPECT_EQ(CheckOffloadFlags(odd_chunk).code(), absl::StatusCode::kInvalidArgument)
      << odd_chunk.chunk_numel << " " << SeedTrace();
}

}  // namespace
}  // namespace zeroshard::cli
