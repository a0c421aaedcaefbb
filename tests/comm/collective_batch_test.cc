// Batching of small collectives (collective_batch.h) and the progress
// loop's batch path (async_communicator.cc), on the CPU: the nccl backend
// that batches needs a GPU, but which collectives go into a batch, how the
// ranks agree on it, and how the queue is served are host logic.
#include "engine/src/comm/collective_batch.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/src/comm/async_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace internal {
namespace {

using ::testing::HasSubstr;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// Runs a collective as one rank sees it, on bytes of an arena: it reads
// every byte of its send range and writes every byte of its recv range with
// a value depending on all it read and on `salt`. Only the footprint
// matters: running a batch in any order gives the issue-order result only
// when its collectives are independent.
void Apply(const CollectiveArgs& a, int size, uint64_t salt) {
  const uint64_t block = static_cast<uint64_t>(a.count) * DTypeSize(a.dtype);
  const bool whole_send = a.kind == CollectiveKind::kReduceScatter;
  const bool whole_recv = a.kind == CollectiveKind::kAllGather;
  const uint64_t send_bytes = whole_send ? block * size : block;
  const uint64_t recv_bytes = whole_recv ? block * size : block;
  uint64_t h = salt * 0x9e3779b97f4a7c15ull;
  const auto* send = static_cast<const uint8_t*>(a.send);
  for (uint64_t i = 0; i < send_bytes; ++i) h = (h ^ send[i]) * 0x100000001b3ull;
  auto* recv = static_cast<uint8_t*>(a.recv);
  for (uint64_t i = 0; i < recv_bytes; ++i) {
    h = (h ^ i) * 0x100000001b3ull;
    recv[i] = static_cast<uint8_t>(h >> 56);
  }
}

CollectiveArgs RandomOp(std::mt19937_64& rng, uint8_t* arena, size_t arena_bytes, int size,
                        uint64_t seq) {
  static constexpr CollectiveKind kKinds[] = {
      CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather,
      CollectiveKind::kBroadcast};
  CollectiveArgs a;
  a.kind = kKinds[rng() % 4];
  a.dtype = DType::kFloat32;
  a.count = 1 + static_cast<int64_t>(rng() % 24);
  const size_t block = static_cast<size_t>(a.count) * 4;
  const size_t span = block * size;  // room for the larger side
  const size_t send_at = rng() % (arena_bytes - span);
  a.send = arena + send_at;
  if (a.kind == CollectiveKind::kBroadcast || rng() % 4 == 0) {
    a.recv = const_cast<void*>(a.send);  // in place
    if (a.kind == CollectiveKind::kReduceScatter) a.recv = arena + send_at + block * (seq % size);
    if (a.kind == CollectiveKind::kAllGather) {
      // send is block rank() of recv: choose recv so that it fits.
      const size_t recv_at = send_at >= block * (seq % size) ? send_at - block * (seq % size) : 0;
      a.recv = arena + recv_at;
      a.send = arena + recv_at + block * (seq % size);
    }
  } else {
    a.recv = arena + rng() % (arena_bytes - span);
  }
  a.seq = seq;
  return a;
}

TEST(BatchablePrefixTest, BatchesGiveTheIssueOrderResultAndStopAtTheFirstDependence) {
  std::mt19937_64 rng(Seed());
  constexpr size_t kArena = 4096;
  int batched_more_than_one = 0, stopped_at_dependence = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int size = 1 + static_cast<int>(rng() % 4);
    std::vector<uint8_t> arena(kArena);
    for (auto& b : arena) b = static_cast<uint8_t>(rng());
    std::vector<CollectiveArgs> ops;
    const int queued = 1 + static_cast<int>(rng() % 20);
    // Sparse or crowded arena: crowded ones give dependences.
    const size_t used = rng() % 2 ? kArena : 512;
    for (int i = 0; i < queued; ++i) {
      ops.push_back(RandomOp(rng, arena.data(), used, size, static_cast<uint64_t>(i + 1)));
    }
    const int n = BatchablePrefix(ops, size, kMaxBatchOps);
    ASSERT_GE(n, 1);
    ASSERT_LE(n, std::min(queued, kMaxBatchOps));
    // Issue order vs reverse order over the batch: equal for independent
    // collectives (a wrong dependence rule makes them differ).
    std::vector<uint8_t> forward = arena, backward = arena;
    const auto rebase = [&](CollectiveArgs a, std::vector<uint8_t>& to) {
      a.send = to.data() + (static_cast<const uint8_t*>(a.send) - arena.data());
      a.recv = to.data() + (static_cast<uint8_t*>(a.recv) - arena.data());
      return a;
    };
    for (int i = 0; i < n; ++i) Apply(rebase(ops[i], forward), size, i);
    for (int i = n - 1; i >= 0; --i) Apply(rebase(ops[i], backward), size, i);
    ASSERT_EQ(forward, backward) << "a batch of " << n << " holds dependent collectives; "
                                 << SeedTrace();
    if (n > 1) ++batched_more_than_one;
    // Maximal: the next collective, when there is room, touches memory the
    // batch writes or writes memory it reads (checked on byte masks, not on
    // the intervals the code uses).
    if (n < std::min(queued, kMaxBatchOps)) {
      ++stopped_at_dependence;
      std::vector<uint8_t> batch_reads(kArena), batch_writes(kArena);
      const auto mark = [&](const CollectiveArgs& a, std::vector<uint8_t>* reads,
                            std::vector<uint8_t>* writes) {
        const size_t block = static_cast<size_t>(a.count) * 4;
        const size_t send_bytes = a.kind == CollectiveKind::kReduceScatter ? block * size : block;
        const size_t recv_bytes = a.kind == CollectiveKind::kAllGather ? block * size : block;
        const size_t s0 = static_cast<const uint8_t*>(a.send) - arena.data();
        const size_t r0 = static_cast<uint8_t*>(a.recv) - arena.data();
        for (size_t i = 0; i < send_bytes; ++i) (*reads)[s0 + i] = 1;
        for (size_t i = 0; i < recv_bytes; ++i) (*writes)[r0 + i] = 1;
      };
      for (int i = 0; i < n; ++i) mark(ops[i], &batch_reads, &batch_writes);
      std::vector<uint8_t> next_reads(kArena), next_writes(kArena);
      mark(ops[n], &next_reads, &next_writes);
      bool depends = false;
      for (size_t i = 0; i < kArena; ++i) {
        depends |= (next_reads[i] && batch_writes[i]) || (next_writes[i] && batch_writes[i]) ||
                   (next_writes[i] && batch_reads[i]);
      }
      EXPECT_TRUE(depends) << "collective " << n << " was left out of an independent batch; "
                           << SeedTrace();
    }
  }
  // Both outcomes happened: the test saw batches and dependences.
  EXPECT_GT(batched_more_than_one, 300);
  EXPECT_GT(stopped_at_dependence, 300);
}

TEST(BatchablePrefixTest, LargeBarrierAndEmptyCollectivesRunAlone) {
  std::vector<float> a(1 << 20), b(1 << 20), e(1 << 16), c(64), d(64);
  CollectiveArgs large{CollectiveKind::kAllReduce, a.data(), a.data(), 1 << 20, DType::kFloat32};
  CollectiveArgs small{CollectiveKind::kAllReduce, c.data(), c.data(), 64, DType::kFloat32};
  CollectiveArgs small2{CollectiveKind::kAllReduce, d.data(), d.data(), 64, DType::kFloat32};
  CollectiveArgs barrier{CollectiveKind::kBarrier};
  std::vector<CollectiveArgs> ops = {large, small, small2};
  EXPECT_EQ(BatchablePrefix(ops, 2, kMaxBatchOps), 1);  // 4 MiB is not small
  ops = {small, small2, large};
  EXPECT_EQ(BatchablePrefix(ops, 2, kMaxBatchOps), 2);
  ops = {small, barrier, small2};
  EXPECT_EQ(BatchablePrefix(ops, 2, kMaxBatchOps), 1);
  ops = {small, small2};
  EXPECT_EQ(BatchablePrefix(ops, 2, 1), 1);  // batching off
  // A reduce-scatter is measured by its whole send buffer: 2^16 floats per
  // block times 8 ranks is 2 MiB.
  CollectiveArgs rs{CollectiveKind::kReduceScatter, b.data(), e.data(), 1 << 16, DType::kFloat32};
  ops = {rs, small2};
  EXPECT_EQ(BatchablePrefix(ops, 8, kMaxBatchOps), 1);
  EXPECT_EQ(BatchablePrefix(ops, 2, kMaxBatchOps), 2);
}

std::vector<CollectiveDescriptor> Offers(const std::vector<std::vector<CollectiveArgs>>& ranks) {
  std::vector<CollectiveDescriptor> all(ranks.size() * kBatchSlots);
  for (size_t r = 0; r < ranks.size(); ++r) PackBatchOffer(ranks[r], &all[r * kBatchSlots]);
  return all;
}

std::vector<CollectiveArgs> Sequence(int n, uint64_t first_seq, int64_t count = 8) {
  std::vector<CollectiveArgs> ops;
  for (int i = 0; i < n; ++i) {
    CollectiveArgs a{CollectiveKind::kAllReduce, nullptr, nullptr, count + i, DType::kFloat32};
    a.tag = 1 + i;
    a.seq = first_seq + i;
    ops.push_back(a);
  }
  return ops;
}

// The mpi backend numbers its communicators: every slot of an offer, the
// header and the unused ones included, carries the number.
TEST(PackBatchOfferTest, EverySlotCarriesTheCommunicatorInstance) {
  CollectiveDescriptor slots[kBatchSlots];
  PackBatchOffer(Sequence(3, 5), slots, /*instance=*/42);
  EXPECT_EQ(slots[0].kind, -1);
  EXPECT_EQ(slots[0].count, 3);
  for (int i = 0; i < kBatchSlots; ++i) EXPECT_EQ(slots[i].instance, 42) << "slot " << i;
  EXPECT_EQ(FromDescriptor(slots[3]).seq, 7u);
  EXPECT_EQ(slots[4].kind, -1);
}

TEST(AgreeOnBatchTest, TheBatchIsTheShortestOfferOnEveryRank) {
  std::mt19937_64 rng(Seed());
  for (int trial = 0; trial < 200; ++trial) {
    const int size = 1 + static_cast<int>(rng() % 6);
    const std::vector<CollectiveArgs> all = Sequence(kMaxBatchOps, 40);
    std::vector<std::vector<CollectiveArgs>> offers(size);
    int shortest = kMaxBatchOps;
    for (int r = 0; r < size; ++r) {
      const int n = 1 + static_cast<int>(rng() % kMaxBatchOps);
      offers[r].assign(all.begin(), all.begin() + n);
      shortest = std::min(shortest, n);
    }
    const std::vector<CollectiveDescriptor> slots = Offers(offers);
    for (int r = 0; r < size; ++r) {
      absl::StatusOr<int> n = AgreeOnBatch(slots.data(), size, r, offers[r], "test comm");
      ASSERT_TRUE(n.ok()) << n.status() << "; " << SeedTrace();
      EXPECT_EQ(*n, shortest) << "rank " << r << "; " << SeedTrace();
    }
  }
}

TEST(AgreeOnBatchTest, AMismatchInsideTheBatchNamesTheRankOutsideItWaits) {
  std::vector<std::vector<CollectiveArgs>> offers = {Sequence(4, 7), Sequence(4, 7),
                                                     Sequence(2, 7)};
  offers[1][1].count += 1;  // rank 1 differs at position 1, inside the batch of 2
  std::vector<CollectiveDescriptor> slots = Offers(offers);
  absl::StatusOr<int> n = AgreeOnBatch(slots.data(), 3, 0, offers[0], "test comm rank 0");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(n.status().message(),
              HasSubstr("does not match rank 1's collective #8, AllReduce #8 (count 10"));
  EXPECT_THAT(n.status().message(), HasSubstr("count 9 vs 10"));

  // The same difference beyond the shortest offer is not compared yet: the
  // next batch will see it.
  offers = {Sequence(4, 7), Sequence(4, 7), Sequence(2, 7)};
  offers[1][3].tag = 99;
  slots = Offers(offers);
  n = AgreeOnBatch(slots.data(), 3, 0, offers[0], "test comm rank 0");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);

  // A sequence number that differs (a rank skipped a collective).
  offers = {Sequence(3, 7), Sequence(3, 8)};
  slots = Offers(offers);
  n = AgreeOnBatch(slots.data(), 2, 0, offers[0], "test comm rank 0");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), HasSubstr("sequence number 7 vs 8"));
}

// The progress loop's batch path with a backend that batches (max_batch 16)
// but moves no data: it records what ran, in which batches.
class RecordingComm final : public AsyncCommunicator {
 public:
  // Each RunBatch runs min(offered, caps[k % caps.size()]) collectives; the
  // first call waits until `release` is set, so that the queue fills.
  RecordingComm(std::vector<int> caps, int fail_at_batch)
      : AsyncCommunicator(0, 2, Options()), caps_(std::move(caps)), fail_at_(fail_at_batch) {
    StartProgressThread();
  }
  ~RecordingComm() override { Shutdown(); }

  std::string backend() const override { return "recording"; }

  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  std::vector<uint64_t> ran() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ran_;
  }
  std::vector<int> batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }

 protected:
  int max_batch() const override { return kMaxBatchOps; }
  absl::Status RunCollective(const CollectiveArgs& args, absl::Time deadline) override {
    return RunBatch(absl::MakeConstSpan(&args, 1), deadline).status();
  }
  absl::StatusOr<int> RunBatch(absl::Span<const CollectiveArgs> ops, absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return released_; });
    const int k = static_cast<int>(batches_.size());
    const int n = std::min<int>(static_cast<int>(ops.size()), caps_[k % caps_.size()]);
    batches_.push_back(n);
    if (k == fail_at_) return absl::InternalError(absl::StrCat("batch ", k, " failed"));
    for (int i = 0; i < n; ++i) ran_.push_back(ops[i].seq);
    return n;
  }

 private:
  static CommOptions Options() {
    CommOptions o;
    o.timeout = absl::Seconds(30);
    return o;
  }
  const std::vector<int> caps_;
  const int fail_at_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  std::vector<uint64_t> ran_;
  std::vector<int> batches_;
};

TEST(ProgressLoopBatchTest, EveryCollectiveRunsOnceInIssueOrderWhateverTheBatchesTake) {
  std::mt19937_64 rng(Seed());
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int> caps;
    for (int i = 0; i < 7; ++i) caps.push_back(1 + static_cast<int>(rng() % kMaxBatchOps));
    RecordingComm comm(caps, /*fail_at_batch=*/-1);
    const int total = 20 + static_cast<int>(rng() % 60);
    std::vector<std::vector<float>> buffers(total, std::vector<float>(16));
    std::vector<CommHandle> handles;
    for (int i = 0; i < total; ++i) {
      // Every fifth one large (runs alone), the others small and disjoint.
      // The first is large: the progress thread takes it alone and blocks
      // in it until Release(), so the rest are all queued by then.
      const int64_t count = i % 5 == 0 ? (1 << 19) : 16;  // 2 MiB: not small
      if (count > 16) buffers[i].resize(count);
      handles.push_back(
          comm.AllReduce(buffers[i].data(), buffers[i].data(), count, DType::kFloat32, 0));
    }
    comm.Release();
    for (int i = 0; i < total; ++i) ASSERT_TRUE(handles[i].Wait().ok()) << i;
    const std::vector<uint64_t> ran = comm.ran();
    ASSERT_EQ(ran.size(), static_cast<size_t>(total)) << SeedTrace();
    for (int i = 0; i < total; ++i) EXPECT_EQ(ran[i], static_cast<uint64_t>(i + 1)) << SeedTrace();
    int largest = 0;
    for (int b : comm.batches()) largest = std::max(largest, b);
    EXPECT_GT(largest, 1) << "nothing was batched; " << SeedTrace();
  }
}

TEST(ProgressLoopBatchTest, AFailedBatchFailsWhatItWasOfferedAndPoisonsTheRest) {
  RecordingComm comm({3}, /*fail_at_batch=*/2);
  // #1 is large: it runs alone (batch 0) and holds the progress thread until
  // Release(), so #2-#13 are all queued when the batches are cut.
  std::vector<float> gate(1 << 19);  // 2 MiB: not small
  std::vector<std::vector<float>> buffers(12, std::vector<float>(16));
  std::vector<CommHandle> handles;
  handles.push_back(comm.AllReduce(gate.data(), gate.data(), 1 << 19, DType::kFloat32, 0));
  for (auto& b : buffers) {
    handles.push_back(comm.AllReduce(b.data(), b.data(), 16, DType::kFloat32, 0));
  }
  comm.Release();
  // Batch 1 ran #2-#4; batch 2 was offered the rest (#5..#13) and failed.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(handles[i].Wait().ok()) << i;
  for (int i = 4; i < 13; ++i) {
    const absl::Status s = handles[i].Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << i << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("batch 2 failed")) << i;
  }
  const absl::Status later =
      comm.AllReduce(buffers[0].data(), buffers[0].data(), 16, DType::kFloat32, 0).Wait();
  EXPECT_THAT(later.message(), HasSubstr("an earlier collective failed"));
  EXPECT_EQ(comm.ran().size(), 4u);
  EXPECT_EQ(comm.batches(), (std::vector<int>{1, 3, 3}))
      << ::testing::PrintToString(comm.batches());
}

}  // namespace
}  // namespace internal
}  // namespace zeroshard
