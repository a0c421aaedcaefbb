// CollectiveLog on its own: the sequence hash of two "ranks" agrees exactly
// when their sequences agree in kind, unit, count and order; the total
// counts every collective; waits are booked to their site.
#include "engine/src/runtime/collective_log.h"

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

struct Record {
  CollectiveKind kind;
  int unit;
  int64_t count;
};

std::vector<Record> RandomSequence(std::mt19937_64& rng, int n) {
  std::vector<Record> seq;
  for (int i = 0; i < n; ++i) {
    seq.push_back({static_cast<CollectiveKind>(1 + rng() % 7), static_cast<int>(rng() % 16),
                   1 + static_cast<int64_t>(rng() % 100000)});
  }
  return seq;
}

CollectiveLog Replay(const std::vector<Record>& seq, bool check = true) {
  CollectiveLog log(check);
  for (const Record& r : seq) log.Note(r.kind, r.unit, r.count);
  return log;
}

TEST(CollectiveLogTest, HashAgreesExactlyWhenTheSequencesAgree) {
  std::mt19937_64 rng(testing::Seed());
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<Record> rank0 = RandomSequence(rng, 2 + static_cast<int>(rng() % 30));
    const CollectiveLog a = Replay(rank0);
    const CollectiveLog same = Replay(rank0);
    EXPECT_EQ(a.sequence_hash(), same.sequence_hash()) << testing::SeedTrace();
    EXPECT_EQ(a.sequence_count(), static_cast<int64_t>(rank0.size()));
    EXPECT_EQ(a.total(), static_cast<int64_t>(rank0.size()));
    EXPECT_NE(a.sequence_hash(), 0u);

    // The other rank differs in one record: its kind, its unit, its count,
    // or the order of two different records.
    const size_t at = rng() % (rank0.size() - 1);
    std::vector<std::pair<std::string, std::vector<Record>>> others;
    std::vector<Record> kind = rank0;
    kind[at].kind = static_cast<CollectiveKind>(1 + static_cast<uint64_t>(kind[at].kind) % 7);
    others.push_back({"kind", kind});
    std::vector<Record> unit = rank0;
    unit[at].unit += 1;
    others.push_back({"unit", unit});
    std::vector<Record> count = rank0;
    count[at].count += 1;
    others.push_back({"count", count});
    std::vector<Record> order = rank0;
    order[at + 1] = order[at];
    order[at + 1].unit += 100;  // surely different from order[at]
    std::vector<Record> swapped = order;
    std::swap(swapped[at], swapped[at + 1]);
    EXPECT_NE(Replay(order).sequence_hash(), Replay(swapped).sequence_hash())
        << "order, " << testing::SeedTrace();
    for (const auto& [what, seq] : others) {
      const CollectiveLog b = Replay(seq);
      EXPECT_NE(a.sequence_hash(), b.sequence_hash()) << what << ", " << testing::SeedTrace();
      EXPECT_EQ(a.sequence_count(), b.sequence_count());
    }
    // One collective more is also a difference.
    std::vector<Record> longer = rank0;
    longer.push_back(rank0.back());
    EXPECT_NE(a.sequence_hash(), Replay(longer).sequence_hash()) << testing::SeedTrace();
  }
}

TEST(CollectiveLogTest, StepsStartFreshAndTheTotalKeepsCounting) {
  std::mt19937_64 rng(testing::Seed() + 1);
  const std::vector<Record> step1 = RandomSequence(rng, 5);
  const std::vector<Record> step2 = RandomSequence(rng, 7);
  CollectiveLog log(true);
  for (const Record& r : step1) log.Note(r.kind, r.unit, r.count);
  log.BeginNextStep();
  EXPECT_EQ(log.sequence_hash(), 0u);
  EXPECT_EQ(log.sequence_count(), 0);
  for (const Record& r : step2) log.Note(r.kind, r.unit, r.count);
  // The second step's hash is that of its own records alone.
  EXPECT_EQ(log.sequence_hash(), Replay(step2).sequence_hash()) << testing::SeedTrace();
  EXPECT_EQ(log.total(), 12);
  // Without the check only the total counts.
  const CollectiveLog unchecked = Replay(step1, /*check=*/false);
  EXPECT_EQ(unchecked.sequence_hash(), 0u);
  EXPECT_EQ(unchecked.sequence_count(), 0);
  EXPECT_EQ(unchecked.total(), 5);
}

TEST(CollectiveLogTest, WaitsAreBookedToTheirSiteWhileStepsRun) {
  auto group = CreateLocalGroup(1);
  ASSERT_TRUE(group.ok()) << group.status();
  Communicator& comm = *(*group)[0];
  StepTimeline timeline;
  CollectiveLog log(true);
  CommHandle before = comm.Barrier();
  ASSERT_TRUE(log.Wait(before, WaitSite::kSave, timeline).ok());
  EXPECT_FALSE(before.valid());
  EXPECT_EQ(log.site_waits(WaitSite::kSave), 0);  // no step runs yet
  timeline.BeginSteps();
  for (int i = 0; i < 3; ++i) {
    CommHandle h = comm.Barrier();
    ASSERT_TRUE(log.Wait(h, WaitSite::kGetParam, timeline).ok());
  }
  CommHandle waited;  // not valid: nothing to wait for, nothing booked
  ASSERT_TRUE(log.Wait(waited, WaitSite::kSave, timeline).ok());
  EXPECT_EQ(log.site_waits(WaitSite::kGetParam), 3);
  EXPECT_EQ(log.site_waits(WaitSite::kSave), 0);
  const std::string report = log.FormatWaits(0, 3);
  EXPECT_NE(report.find("rank 0: collective waits over 3 steps"), std::string::npos) << report;
  EXPECT_NE(report.find("GetParam"), std::string::npos) << report;
  EXPECT_NE(report.find("(1.0 waits)"), std::string::npos) << report;
  EXPECT_EQ(report.find("Save"), std::string::npos) << report;
}

}  // namespace
}  // namespace zeroshard::internal
