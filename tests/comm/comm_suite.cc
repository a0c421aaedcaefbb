// The communicator test bodies, run on every rank of every TestWorld.
#include "tests/comm/comm_suite.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"

namespace zeroshard {
namespace testing_comm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Sizes that exercise empty, single-element, odd and non-divisible paths.
constexpr int64_t kSizes[] = {0, 1, 7, 131, 1009};

CommOptions Timeout(absl::Duration timeout) {
  CommOptions options;
  options.timeout = timeout;
  return options;
}

// Normal tests: generous, so a loaded 2-core machine does not fail them.
const CommOptions kRelaxed = Timeout(absl::Seconds(60));

std::string Label(const Communicator& comm, const char* what, DType dtype, int64_t count,
                  bool in_place) {
  return absl::StrFormat("%s rank %d/%d %s %s count %d%s", comm.backend(), comm.rank(), comm.size(),
                         what, DTypeName(dtype), count, in_place ? " in place" : "");
}

uint8_t* Block(std::vector<uint8_t>& buffer, DType dtype, int64_t count, int index) {
  return buffer.data() + static_cast<size_t>(index) * count * DTypeSize(dtype);
}

TEST_P(CommSuite, AllReduceMatchesRankOrderSum) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    struct Case {
      TestData data;
      int64_t count;
      bool in_place;
      uint64_t salt;
      std::vector<uint8_t> send, recv;
      CommHandle handle;
    };
    std::vector<Case> cases;
    uint64_t salt = 0;
    for (DType dtype :
         {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64, DType::kInt64}) {
      for (int64_t count : kSizes) {
        for (bool in_place : {false, true}) {
          TestData data(seed(), dtype);
          Case c{data, count, in_place, ++salt, data.Make(salt, comm.rank(), count), {}, {}};
          if (!in_place) c.recv.assign(c.send.size(), 0xab);
          cases.push_back(std::move(c));
        }
      }
    }
    // Everything in flight before the first wait.
    for (Case& c : cases) {
      void* recv = c.in_place ? c.send.data() : c.recv.data();
      c.handle = comm.AllReduce(c.send.data(), recv, c.count, c.data.dtype());
    }
    for (Case& c : cases) {
      const std::string what = Label(comm, "AllReduce", c.data.dtype(), c.count, c.in_place);
      const absl::Status status = c.handle.Wait();
      ASSERT_TRUE(status.ok()) << what << ": " << status;
      const void* result = c.in_place ? c.send.data() : c.recv.data();
      EXPECT_EQ(CheckSum(c.data, c.salt, comm.size(), result, c.count, 0, what), 0) << what;
    }
  });
}

TEST_P(CommSuite, ReduceScatterMatchesReferenceAndAllReduceBits) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    const int world_size = comm.size();
    uint64_t salt = 100;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const TestData data(seed(), dtype);
      for (int64_t count : kSizes) {
        for (bool in_place : {false, true}) {
          ++salt;
          const std::string what = Label(comm, "ReduceScatter", dtype, count, in_place);
          std::vector<uint8_t> send = data.Make(salt, comm.rank(), count * world_size);
          std::vector<uint8_t> all_reduce_in = send;
          std::vector<uint8_t> all_reduce_out(send.size(), 0xcd);
          std::vector<uint8_t> recv(count * DTypeSize(dtype), 0xab);
          void* recv_ptr = in_place ? Block(send, dtype, count, comm.rank()) : recv.data();
          CommHandle scatter = comm.ReduceScatter(send.data(), recv_ptr, count, dtype);
          CommHandle reduce = comm.AllReduce(all_reduce_in.data(), all_reduce_out.data(),
                                             count * world_size, dtype);
          ASSERT_TRUE(scatter.Wait().ok()) << what << ": " << scatter.Wait();
          ASSERT_TRUE(reduce.Wait().ok()) << what << ": " << reduce.Wait();
          EXPECT_EQ(CheckSum(data, salt, world_size, recv_ptr, count, comm.rank() * count, what),
                    0);
          // The engine needs both collectives to give the same bits.
          EXPECT_TRUE(count == 0 ||
                      std::memcmp(recv_ptr, Block(all_reduce_out, dtype, count, comm.rank()),
                                  count * DTypeSize(dtype)) == 0)
              << what << ": differs from the AllReduce of the same input";
        }
      }
    }
  });
}

TEST_P(CommSuite, AllGatherCollectsBlocksInRankOrder) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    const int world_size = comm.size();
    uint64_t salt = 200;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kUInt8}) {
      const TestData data(seed(), dtype);
      for (int64_t count : kSizes) {
        for (bool in_place : {false, true}) {
          ++salt;
          const std::string what = Label(comm, "AllGather", dtype, count, in_place);
          std::vector<uint8_t> mine = data.Make(salt, comm.rank(), count);
          std::vector<uint8_t> recv(count * world_size * DTypeSize(dtype), 0xab);
          const void* send = mine.data();
          if (in_place) {
            uint8_t* own = Block(recv, dtype, count, comm.rank());
            if (!mine.empty()) std::memcpy(own, mine.data(), mine.size());
            send = own;
          }
          const absl::Status status = comm.AllGather(send, recv.data(), count, dtype).Wait();
          ASSERT_TRUE(status.ok()) << what << ": " << status;
          for (int p = 0; p < world_size; ++p) {
            EXPECT_EQ(CheckCopy(data, salt, p, Block(recv, dtype, count, p), count, 0, what), 0)
                << what << ": block " << p;
          }
        }
      }
    }
  });
}

TEST_P(CommSuite, BroadcastFromEveryRoot) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    struct Case {
      TestData data;
      int root;
      int64_t count;
      uint64_t salt;
      std::vector<uint8_t> buf;
      CommHandle handle;
    };
    std::vector<Case> cases;
    uint64_t salt = 300;
    for (int root = 0; root < comm.size(); ++root) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        for (int64_t count : kSizes) {
          TestData data(seed(), dtype);
          ++salt;
          std::vector<uint8_t> buf = comm.rank() == root
                                         ? data.Make(salt, root, count)
                                         : std::vector<uint8_t>(count * DTypeSize(dtype), 0xab);
          cases.push_back(Case{data, root, count, salt, std::move(buf), {}});
        }
      }
    }
    for (Case& c : cases) {
      c.handle = comm.Broadcast(c.buf.data(), c.count, c.data.dtype(), c.root);
    }
    for (Case& c : cases) {
      const std::string what = Label(comm, "Broadcast", c.data.dtype(), c.count, false) +
                               absl::StrFormat(" root %d", c.root);
      const absl::Status status = c.handle.Wait();
      ASSERT_TRUE(status.ok()) << what << ": " << status;
      EXPECT_EQ(CheckCopy(c.data, c.salt, c.root, c.buf.data(), c.count, 0, what), 0);
    }
  });
}

TEST_P(CommSuite, BarrierWaitsForTheSlowestRank) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    std::vector<CommHandle> barriers;
    for (int i = 0; i < 16; ++i) barriers.push_back(comm.Barrier());
    for (CommHandle& handle : barriers) ASSERT_TRUE(handle.Wait().ok());

    constexpr auto kDelay = std::chrono::milliseconds(300);
    if (comm.rank() == 0) std::this_thread::sleep_for(kDelay);
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = comm.Barrier().Wait();
    const auto waited = std::chrono::steady_clock::now() - start;
    ASSERT_TRUE(status.ok()) << status;
    if (comm.rank() != 0) {
      EXPECT_GE(waited, kDelay - std::chrono::milliseconds(50))
          << "rank " << comm.rank() << " left the barrier before rank 0 entered it";
    }
  });
}

TEST_P(CommSuite, ManyMixedCollectivesInFlight) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    const int world_size = comm.size();
    struct Op {
      int kind;
      TestData data;
      int64_t count;
      uint64_t salt;
      std::vector<uint8_t> send, recv;
      CommHandle handle;
    };
    std::vector<Op> ops;
    for (int j = 0; j < 60; ++j) {
      const int kind = j % 5;
      const DType dtype = j % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
      const int64_t count = kSizes[(j / 5) % 5];
      const uint64_t salt = 400 + j;
      TestData data(seed(), dtype);
      Op op{kind, data, count, salt, {}, {}, {}};
      const size_t bytes = count * DTypeSize(dtype);
      switch (kind) {
        case 0:  // AllReduce
          op.send = data.Make(salt, comm.rank(), count);
          op.recv.assign(bytes, 0xab);
          break;
        case 1:  // ReduceScatter
          op.send = data.Make(salt, comm.rank(), count * world_size);
          op.recv.assign(bytes, 0xab);
          break;
        case 2:  // AllGather
          op.send = data.Make(salt, comm.rank(), count);
          op.recv.assign(bytes * world_size, 0xab);
          break;
        case 3:  // Broadcast from a rotating root
          op.recv = comm.rank() == j % world_size ? data.Make(salt, j % world_size, count)
                                                  : std::vector<uint8_t>(bytes, 0xab);
          break;
        default:  // Barrier
          break;
      }
      ops.push_back(std::move(op));
    }
    for (size_t j = 0; j < ops.size(); ++j) {
      Op& op = ops[j];
      const DType dtype = op.data.dtype();
      switch (op.kind) {
        case 0:
          op.handle = comm.AllReduce(op.send.data(), op.recv.data(), op.count, dtype);
          break;
        case 1:
          op.handle = comm.ReduceScatter(op.send.data(), op.recv.data(), op.count, dtype);
          break;
        case 2:
          op.handle = comm.AllGather(op.send.data(), op.recv.data(), op.count, dtype);
          break;
        case 3:
          op.handle = comm.Broadcast(op.recv.data(), op.count, dtype, j % world_size);
          break;
        default:
          op.handle = comm.Barrier();
          break;
      }
    }
    // Waiting out of issue order must not matter.
    for (size_t j = ops.size(); j-- > 0;) {
      Op& op = ops[j];
      const std::string what =
          absl::StrFormat("%s rank %d op %d (kind %d, %s, count %d)", comm.backend(), comm.rank(),
                          j, op.kind, DTypeName(op.data.dtype()), op.count);
      const absl::Status status = op.handle.Wait();
      ASSERT_TRUE(status.ok()) << what << ": " << status;
      switch (op.kind) {
        case 0:
          EXPECT_EQ(CheckSum(op.data, op.salt, world_size, op.recv.data(), op.count, 0, what), 0);
          break;
        case 1:
          EXPECT_EQ(CheckSum(op.data, op.salt, world_size, op.recv.data(), op.count,
                             comm.rank() * op.count, what),
                    0);
          break;
        case 2:
          for (int p = 0; p < world_size; ++p) {
            EXPECT_EQ(CheckCopy(op.data, op.salt, p, Block(op.recv, op.data.dtype(), op.count, p),
                                op.count, 0, what),
                      0);
          }
          break;
        case 3:
          EXPECT_EQ(CheckCopy(op.data, op.salt, j % world_size, op.recv.data(), op.count, 0, what),
                    0);
          break;
        default:
          break;
      }
    }
  });
}

// Small collectives of every kind and several dtypes issued back to back,
// each in buffers of its own, in place and not, behind a gate that holds the
// progress thread until all are queued (the mpi backend then runs them in
// batches: one descriptor exchange and two data rounds for up to 16). Every
// result must have the bits of one collective at a time: the rank-order sum
// (and within the double-precision bound), or the root's / each rank's
// data. A large all-reduce and a barrier in the middle end a batch.
TEST_P(CommSuite, SmallCollectivesIssuedTogetherMatchOneAtATime) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    enum Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
    constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                 DType::kFloat64, DType::kInt64};
    const int world_size = comm.size();
    const int rank = comm.rank();
    struct Op {
      Kind kind;
      TestData data;
      int64_t count;
      bool in_place;
      int root;
      uint64_t salt;
      std::vector<uint8_t> send, recv;
      CommHandle handle;
    };
    // The same draws on every rank: seed() is.
    std::mt19937_64 rng(seed());
    std::vector<Op> ops;
    for (int j = 0; j < 80; ++j) {
      Kind kind = static_cast<Kind>(rng() % 4);
      DType dtype = kDTypes[rng() % 5];
      // Counts below the group size leave some ranks an empty all-reduce piece.
      int64_t count = rng() % 4 == 0 ? 1 + rng() % 3 : 1 + rng() % 300;
      if (j == 40) {  // more than 1 MiB: runs alone
        kind = kAllReduce;
        dtype = DType::kFloat32;
        count = 300'000;
      }
      if (j == 60) kind = kBarrier;
      const bool in_place = rng() % 2 == 0;
      const int root = static_cast<int>(rng() % world_size);
      const uint64_t salt = 1000 + j;
      const TestData data(seed(), dtype);
      Op op{kind, data, count, in_place, root, salt, {}, {}, {}};
      const size_t bytes = count * DTypeSize(dtype);
      switch (kind) {
        case kAllReduce:
          op.send = data.Make(salt, rank, count);
          if (!in_place) op.recv.assign(bytes, 0xab);
          break;
        case kReduceScatter:
          op.send = data.Make(salt, rank, count * world_size);
          if (!in_place) op.recv.assign(bytes, 0xab);
          break;
        case kAllGather:
          op.send = data.Make(salt, rank, count);
          op.recv.assign(bytes * world_size, 0xab);
          if (in_place) std::memcpy(Block(op.recv, dtype, count, rank), op.send.data(), bytes);
          break;
        case kBroadcast:
          op.recv = rank == root ? data.Make(salt, root, count) : std::vector<uint8_t>(bytes, 0xab);
          break;
        case kBarrier:
          break;
      }
      ops.push_back(std::move(op));
    }
    auto gate = std::make_shared<GateEvent>();
    std::vector<float> gated(GateEvent::kGatedCount, 1.0f);
    CommHandle first = comm.AllReduceAfter(gate, gated.data(), gated.data(), GateEvent::kGatedCount,
                                           DType::kFloat32, /*tag=*/0);
    for (Op& op : ops) {
      const DType dtype = op.data.dtype();
      switch (op.kind) {
        case kAllReduce:
          op.handle = comm.AllReduce(op.send.data(), op.in_place ? op.send.data() : op.recv.data(),
                                     op.count, dtype);
          break;
        case kReduceScatter:
          op.handle = comm.ReduceScatter(
              op.send.data(), op.in_place ? Block(op.send, dtype, op.count, rank) : op.recv.data(),
              op.count, dtype);
          break;
        case kAllGather:
          op.handle =
              comm.AllGather(op.in_place ? Block(op.recv, dtype, op.count, rank) : op.send.data(),
                             op.recv.data(), op.count, dtype);
          break;
        case kBroadcast:
          op.handle = comm.Broadcast(op.recv.data(), op.count, dtype, op.root);
          break;
        case kBarrier:
          op.handle = comm.Barrier();
          break;
      }
    }
    gate->Open();
    ASSERT_TRUE(first.Wait().ok()) << first.Wait();
    for (size_t j = 0; j < ops.size(); ++j) {
      Op& op = ops[j];
      const DType dtype = op.data.dtype();
      const std::string what =
          absl::StrFormat("%s rank %d/%d op %d (kind %d, %s, count %d%s, root %d)", comm.backend(),
                          rank, world_size, j, op.kind, DTypeName(dtype), op.count,
                          op.in_place ? ", in place" : "", op.root);
      const absl::Status status = op.handle.Wait();
      ASSERT_TRUE(status.ok()) << what << ": " << status;
      switch (op.kind) {
        case kAllReduce:
          EXPECT_EQ(CheckSum(op.data, op.salt, world_size,
                             op.in_place ? op.send.data() : op.recv.data(), op.count, 0, what),
                    0);
          break;
        case kReduceScatter:
          EXPECT_EQ(CheckSum(op.data, op.salt, world_size,
                             op.in_place ? Block(op.send, dtype, op.count, rank) : op.recv.data(),
                             op.count, rank * op.count, what),
                    0);
          break;
        case kAllGather:
          for (int p = 0; p < world_size; ++p) {
            EXPECT_EQ(CheckCopy(op.data, op.salt, p, Block(op.recv, dtype, op.count, p), op.count,
                                0, absl::StrFormat("%s block %d", what, p)),
                      0);
          }
          break;
        case kBroadcast:
          EXPECT_EQ(CheckCopy(op.data, op.salt, op.root, op.recv.data(), op.count, 0, what), 0);
          break;
        case kBarrier:
          break;
      }
    }
  });
}

// Tens of MiB per rank: crosses the MPI backend's 4 MiB chunks and the local
// backend's piece split with counts that do not divide evenly.
TEST_P(CommSuite, LargeMessages) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    const int world_size = comm.size();
    const int rank = comm.rank();
    {
      const int64_t count = 12'000'003;
      const TestData data(seed(), DType::kFloat32);
      std::vector<uint8_t> buf = data.Make(1, rank, count);
      const std::string what = Label(comm, "AllReduce", DType::kFloat32, count, true);
      const absl::Status status = comm.AllReduceSync(buf.data(), buf.data(), count, data.dtype());
      ASSERT_TRUE(status.ok()) << what << ": " << status;
      EXPECT_EQ(CheckSum(data, 1, world_size, buf.data(), count, 0, what), 0);
    }
    {
      const int64_t count = 6'000'001;
      const TestData data(seed(), DType::kBFloat16);
      const std::vector<uint8_t> send = data.Make(2, rank, count);
      std::vector<uint8_t> recv(send.size(), 0xab);
      const std::string what = Label(comm, "AllReduce", DType::kBFloat16, count, false);
      const absl::Status status = comm.AllReduceSync(send.data(), recv.data(), count, data.dtype());
      ASSERT_TRUE(status.ok()) << what << ": " << status;
      EXPECT_EQ(CheckSum(data, 2, world_size, recv.data(), count, 0, what), 0);
    }
    {
      const int64_t count = 12'000'001 / world_size;
      const TestData data(seed(), DType::kFloat32);
      std::vector<uint8_t> send = data.Make(3, rank, count * world_size);
      void* recv = Block(send, DType::kFloat32, count, rank);
      const std::string what = Label(comm, "ReduceScatter", DType::kFloat32, count, true);
      const absl::Status status = comm.ReduceScatter(send.data(), recv, count, data.dtype()).Wait();
      ASSERT_TRUE(status.ok()) << what << ": " << status;
      EXPECT_EQ(CheckSum(data, 3, world_size, recv, count, rank * count, what), 0);
    }
    {
      const int64_t count = 12'000'001 / world_size;
      const TestData data(seed(), DType::kFloat32);
      const std::vector<uint8_t> send = data.Make(4, rank, count);
      std::vector<uint8_t> recv(send.size() * world_size, 0xab);
      const std::string what = Label(comm, "AllGather", DType::kFloat32, count, false);
      const absl::Status status = comm.AllGatherSync(send.data(), recv.data(), count, data.dtype());
      ASSERT_TRUE(status.ok()) << what << ": " << status;
      for (int p = 0; p < world_size; ++p) {
        EXPECT_EQ(CheckCopy(data, 4, p, Block(recv, DType::kFloat32, count, p), count, 0, what), 0);
      }
    }
  });
}

TEST_P(CommSuite, InvalidArgumentsFailOnTheHandleAndPoison) {
  std::vector<float> buffer(8, 1.0f);
  // Valid edge cases first: zero elements with null buffers, non-sum uint8.
  world().Run(kRelaxed, [&](Communicator& comm) {
    EXPECT_TRUE(comm.AllReduce(nullptr, nullptr, 0, DType::kFloat32).Wait().ok());
    EXPECT_TRUE(comm.Broadcast(nullptr, 0, DType::kBFloat16, comm.size() - 1).Wait().ok());
    std::vector<uint8_t> bytes(3 * comm.size(), static_cast<uint8_t>(comm.rank()));
    EXPECT_TRUE(
        comm.AllGather(bytes.data() + 3 * comm.rank(), bytes.data(), 3, DType::kUInt8).Wait().ok());
    for (int p = 0; p < comm.size(); ++p) EXPECT_EQ(bytes[3 * p], p);
  });

  struct BadCall {
    const char* name;
    std::function<CommHandle(Communicator&, std::vector<float>&)> issue;
    const char* expected_text;
  };
  const std::vector<BadCall> bad_calls = {
      {"negative count",
       [](Communicator& c, std::vector<float>& b) {
         return c.AllReduce(b.data(), b.data(), -1, DType::kFloat32);
       },
       "negative"},
      {"null send",
       [](Communicator& c, std::vector<float>& b) {
         return c.AllReduce(nullptr, b.data(), 4, DType::kFloat32);
       },
       "null"},
      {"root out of range",
       [](Communicator& c, std::vector<float>& b) {
         return c.Broadcast(b.data(), 4, DType::kFloat32, c.size());
       },
       "root"},
      {"uint8 sum",
       [](Communicator& c, std::vector<float>& b) {
         return c.ReduceScatter(b.data(), b.data(), 1, DType::kUInt8);
       },
       "cannot be summed"},
      {"partial overlap",
       [](Communicator& c, std::vector<float>& b) {
         return c.AllReduce(b.data(), b.data() + 1, 4, DType::kFloat32);
       },
       "overlap"},
  };
  for (const BadCall& bad : bad_calls) {
    world().Run(kRelaxed, [&](Communicator& comm) {
      std::vector<float> local_buffer(8, 1.0f);
      const absl::Status status = bad.issue(comm, local_buffer).Wait();
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.name << ": " << status;
      EXPECT_THAT(std::string(status.message()), HasSubstr(bad.expected_text)) << bad.name;
      // Poisoned: the next call fails at once with the first error.
      const auto start = std::chrono::steady_clock::now();
      const absl::Status next = comm.Barrier().Wait();
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
      EXPECT_EQ(next.code(), absl::StatusCode::kInvalidArgument) << bad.name << ": " << next;
      EXPECT_THAT(std::string(next.message()), HasSubstr("earlier collective failed"));
    });
  }
}

// A collective that failed because rank `stuck` never issued AllReduce #2
// (peers time out after 1 s): either this rank timed out itself, or (local)
// a peer that timed out left first; both messages name the stuck rank and
// say it is running (alive, not dead: the backend tells the two apart), in
// about the timeout.
void ExpectNamesStuckRank(const absl::Status& status, int stuck, absl::Duration took,
                          absl::Duration timeout) {
  EXPECT_TRUE(status.code() == absl::StatusCode::kDeadlineExceeded ||
              status.code() == absl::StatusCode::kAborted)
      << status;
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr(absl::StrFormat("waiting for rank(s) %d", stuck)));
  EXPECT_THAT(message, HasSubstr("timed out after 1s"));
  EXPECT_THAT(message, HasSubstr("AllReduce #2"));
  EXPECT_THAT(message, HasSubstr("running"));
  EXPECT_LT(took, timeout + absl::Seconds(4)) << message;
}

TEST_P(CommSuite, StuckRankTimesOutAndIsNamed) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const absl::Duration timeout = absl::Seconds(1);
  world().Run(Timeout(timeout), [&](Communicator& comm) {
    const int stuck = comm.size() - 1;
    std::vector<float> buf(7, 1.0f);
    ASSERT_TRUE(comm.AllReduceSync(buf.data(), buf.data(), 7, DType::kFloat32).ok());
    if (comm.rank() == stuck) {
      // Busy elsewhere (a hung data loader, a deadlock) well past the peers'
      // timeout, then gone without issuing collective #2.
      absl::SleepFor(timeout + absl::Milliseconds(1500));
      return;
    }
    const absl::Time start = absl::Now();
    const absl::Status status = comm.AllReduce(buf.data(), buf.data(), 7, DType::kFloat32).Wait();
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(status.ok()) << "rank " << comm.rank() << " finished without rank " << stuck;
    ExpectNamesStuckRank(status, stuck, took, timeout);
    const std::string message(status.message());
    EXPECT_THAT(message, Not(HasSubstr("died")));
    // Poisoned: fails fast from now on.
    const absl::Time again = absl::Now();
    EXPECT_FALSE(comm.Barrier().Wait().ok());
    EXPECT_LT(absl::Now() - again, absl::Milliseconds(500));
  });
}

TEST_P(CommSuite, DifferentTagsAreAMismatch) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  world().Run(Timeout(absl::Seconds(10)), [&](Communicator& comm) {
    // Same kind, count and dtype: only the tag says the data differs.
    const int odd_one = comm.size() - 1;
    const uint64_t tag = comm.rank() == odd_one ? 9 : 4;
    std::vector<float> mine(6, 1.0f);
    std::vector<float> all(6 * comm.size());
    const absl::Status status =
        comm.AllGather(mine.data(), all.data(), 6, DType::kFloat32, tag).Wait();
    ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    const std::string message(status.message());
    EXPECT_THAT(message, HasSubstr(comm.rank() == odd_one ? "tag 9 vs 4" : "tag 4 vs 9"));
    EXPECT_THAT(message, HasSubstr("count 6, fp32, tag"));
  });
  // Equal tags pass (and 0 is no tag).
  world().Run(kRelaxed, [&](Communicator& comm) {
    std::vector<float> buf(3, 1.0f);
    EXPECT_TRUE(comm.AllReduce(buf.data(), buf.data(), 3, DType::kFloat32, 77).Wait().ok());
    EXPECT_TRUE(comm.Broadcast(buf.data(), 3, DType::kFloat32, 0, 5).Wait().ok());
    EXPECT_TRUE(comm.AllReduce(buf.data(), buf.data(), 3, DType::kFloat32).Wait().ok());
  });
}

TEST_P(CommSuite, MismatchedCollectiveNamesBothRanks) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  world().Run(Timeout(absl::Seconds(10)), [&](Communicator& comm) {
    const int odd_one = comm.size() - 1;
    const int64_t count = comm.rank() == odd_one ? 8 : 7;
    std::vector<float> buf(8, 1.0f);
    const absl::Time start = absl::Now();
    const absl::Status status =
        comm.AllReduce(buf.data(), buf.data(), count, DType::kFloat32).Wait();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "a mismatch must not wait for a timeout";
    ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    const int other = comm.rank() == odd_one ? 0 : odd_one;
    const std::string message(status.message());
    EXPECT_THAT(message, HasSubstr(absl::StrFormat("comm rank %d:", comm.rank())));
    EXPECT_THAT(message, HasSubstr(absl::StrFormat("rank %d's collective #1", other)));
    EXPECT_THAT(message, HasSubstr(comm.rank() == odd_one ? "count 8 vs 7" : "count 7 vs 8"));
  });
}

// Ranks that issue different collectives among several queued together
// (on mpi: inside one batch) fail with FailedPrecondition naming the rank
// and the collective, without waiting for a timeout. The collectives before
// the mismatch may have run or have failed with it (a batch fails as a
// whole); the ones after it fail.
TEST_P(CommSuite, MismatchAmongCollectivesIssuedTogetherNamesTheRank) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  world().Run(Timeout(absl::Seconds(10)), [&](Communicator& comm) {
    const int odd_one = comm.size() - 1;
    const int other = comm.rank() == odd_one ? 0 : odd_one;
    constexpr int kOps = 10;
    constexpr int kOdd = 4;  // collective #6: #1 is the gated one
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(7 * comm.size(), 1.0f));
    std::vector<float> gated(GateEvent::kGatedCount, 1.0f);
    auto gate = std::make_shared<GateEvent>();
    const absl::Time start = absl::Now();
    CommHandle first = comm.AllReduceAfter(gate, gated.data(), gated.data(), GateEvent::kGatedCount,
                                           DType::kFloat32, /*tag=*/0);
    std::vector<CommHandle> handles;
    for (int i = 0; i < kOps; ++i) {
      float* buf = bufs[i].data();
      handles.push_back(i == kOdd && comm.rank() == odd_one
                            ? comm.AllGather(buf, buf + 7, 7, DType::kFloat32)
                            : comm.AllReduce(buf, buf, 7, DType::kFloat32));
    }
    gate->Open();
    EXPECT_TRUE(first.Wait().ok()) << first.Wait();
    const absl::Status odd = handles[kOdd].Wait();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "a mismatch must not wait for a timeout";
    ASSERT_EQ(odd.code(), absl::StatusCode::kFailedPrecondition) << odd;
    const std::string message(odd.message());
    EXPECT_THAT(message, HasSubstr(absl::StrFormat("comm rank %d:", comm.rank())));
    EXPECT_THAT(message, HasSubstr(absl::StrFormat("rank %d's collective #6", other)));
    EXPECT_THAT(message, HasSubstr(comm.rank() == odd_one ? "kind AllGather vs AllReduce"
                                                          : "kind AllReduce vs AllGather"));
    for (int i = 0; i < kOps; ++i) {
      const absl::Status status = handles[i].Wait();
      if (i > kOdd || !status.ok()) {
        EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << "#" << i + 2 << status;
        EXPECT_THAT(std::string(status.message()), HasSubstr("collective #6")) << "#" << i + 2;
      }
    }
  });
}

// As StuckRankTimesOutAndIsNamed, but the collectives the stuck rank never
// issues were queued together (on mpi: one batch): the timeout names the
// first of them and the stuck rank, as for one collective.
TEST_P(CommSuite, StuckRankTimesOutAmongCollectivesIssuedTogether) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const absl::Duration timeout = absl::Seconds(1);
  world().Run(Timeout(timeout), [&](Communicator& comm) {
    const int stuck = comm.size() - 1;
    std::vector<float> gated(GateEvent::kGatedCount, 1.0f);
    if (comm.rank() == stuck) {
      // Takes part in #1, then is busy elsewhere well past the peers'
      // timeout and gone without issuing #2.
      ASSERT_TRUE(
          comm.AllReduceSync(gated.data(), gated.data(), GateEvent::kGatedCount, DType::kFloat32)
              .ok());
      absl::SleepFor(timeout + absl::Milliseconds(1500));
      return;
    }
    auto gate = std::make_shared<GateEvent>();
    CommHandle first = comm.AllReduceAfter(gate, gated.data(), gated.data(), GateEvent::kGatedCount,
                                           DType::kFloat32, /*tag=*/0);
    std::vector<std::vector<float>> bufs(8, std::vector<float>(7, 1.0f));
    std::vector<CommHandle> handles;
    for (std::vector<float>& buf : bufs) {
      handles.push_back(comm.AllReduce(buf.data(), buf.data(), 7, DType::kFloat32));
    }
    gate->Open();
    ASSERT_TRUE(first.Wait().ok()) << first.Wait();
    const absl::Time start = absl::Now();
    const absl::Status status = handles[0].Wait();
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(status.ok()) << "rank " << comm.rank() << " finished without rank " << stuck;
    ExpectNamesStuckRank(status, stuck, took, timeout);
    for (CommHandle& handle : handles) EXPECT_FALSE(handle.Wait().ok());
  });
}

// ---- Send, Recv and Split ----

int Next(const Communicator& comm) { return (comm.rank() + 1) % comm.size(); }
int Previous(const Communicator& comm) { return (comm.rank() + comm.size() - 1) % comm.size(); }

// Each rank sends to rank + 1 and receives from rank - 1, every size and
// dtype in flight at once; sizes past 1 MiB take MPI's rendezvous path.
TEST_P(CommSuite, SendRecvRingMovesExactBytes) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  world().Run(kRelaxed, [&](Communicator& comm) {
    struct Case {
      TestData data;
      int64_t count;
      uint64_t salt;
      std::vector<uint8_t> send, recv;
      CommHandle sent, received;
    };
    std::vector<Case> cases;
    uint64_t salt = 500;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kUInt8}) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1009}, int64_t{(1 << 19) + 3}}) {
        TestData data(seed(), dtype);
        ++salt;
        cases.push_back(Case{data,
                             count,
                             salt,
                             data.Make(salt, comm.rank(), count),
                             std::vector<uint8_t>(count * DTypeSize(dtype), 0xab),
                             {},
                             {}});
      }
    }
    {
      const int64_t count = 3'000'001;  // 6 MB of bf16
      TestData data(seed(), DType::kBFloat16);
      cases.push_back(Case{data,
                           count,
                           ++salt,
                           data.Make(salt, comm.rank(), count),
                           std::vector<uint8_t>(count * 2, 0xab),
                           {},
                           {}});
    }
    for (Case& c : cases) {
      c.sent = comm.Send(c.send.data(), c.count, c.data.dtype(), Next(comm), c.salt);
      c.received = comm.Recv(c.recv.data(), c.count, c.data.dtype(), Previous(comm), c.salt);
    }
    for (Case& c : cases) {
      const std::string what = Label(comm, "Send/Recv ring", c.data.dtype(), c.count, false);
      const absl::Status received = c.received.Wait();
      ASSERT_TRUE(received.ok()) << what << ": " << received;
      ASSERT_TRUE(c.sent.Wait().ok()) << what << ": " << c.sent.Wait();
      EXPECT_EQ(CheckCopy(c.data, c.salt, Previous(comm), c.recv.data(), c.count, 0, what), 0);
    }
  });
}

// Pipeline 1F1B: ranks in pairs each Send to the other, then Recv, and wait
// for the Recv first. An implementation that runs sends and receives one at a
// time in issue order (each waiting for its peer) deadlocks here: both send
// first, and a 16 MiB send cannot finish before its receive is posted.
TEST_P(CommSuite, CrossSendThenRecvDoesNotDeadlock) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  world().Run(Timeout(absl::Seconds(20)), [&](Communicator& comm) {
    const int partner = comm.rank() ^ 1;
    if (partner >= comm.size()) return;  // the odd one out of an odd world
    const int64_t count = 4 << 20;
    const TestData data(seed(), DType::kFloat32);
    const std::vector<uint8_t> activations = data.Make(600, comm.rank(), count);
    std::vector<uint8_t> received(activations.size(), 0xab);
    CommHandle sent = comm.Send(activations.data(), count, DType::kFloat32, partner, 3);
    const absl::Status status =
        comm.Recv(received.data(), count, DType::kFloat32, partner, 3).Wait();
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(sent.Wait().ok()) << sent.Wait();
    EXPECT_EQ(CheckCopy(data, 600, partner, received.data(), count, 0, "cross send/recv"), 0);
  });
  // Nor behind a collective: rank 0's Send completes while its AllReduce,
  // issued first, waits for rank 1, which joins it only after its Recv.
  world().Run(Timeout(absl::Seconds(20)), [&](Communicator& comm) {
    const TestData data(seed(), DType::kFloat32);
    std::vector<uint8_t> reduced = data.Make(601, comm.rank(), 257);
    std::vector<uint8_t> message = data.Make(602, 0, 1 << 20);
    CommHandle all_reduce;
    if (comm.rank() == 0) {
      all_reduce = comm.AllReduce(reduced.data(), reduced.data(), 257, DType::kFloat32);
      const absl::Status sent = comm.Send(message.data(), 1 << 20, DType::kFloat32, 1, 0).Wait();
      ASSERT_TRUE(sent.ok()) << sent;
    } else {
      if (comm.rank() == 1) {
        std::fill(message.begin(), message.end(), 0);
        const absl::Status received =
            comm.Recv(message.data(), 1 << 20, DType::kFloat32, 0, 0).Wait();
        ASSERT_TRUE(received.ok()) << received;
        EXPECT_EQ(CheckCopy(data, 602, 0, message.data(), 1 << 20, 0, "send beside AllReduce"), 0);
      }
      all_reduce = comm.AllReduce(reduced.data(), reduced.data(), 257, DType::kFloat32);
    }
    ASSERT_TRUE(all_reduce.Wait().ok()) << all_reduce.Wait();
    EXPECT_EQ(CheckSum(data, 601, comm.size(), reduced.data(), 257, 0, "AllReduce beside p2p"), 0);
  });
}

// Several messages per tag to the same peer: the receiver posts its Recvs
// tag by tag in reverse, so only matching by (sender, tag) in issue order
// gives each buffer its message.
TEST_P(CommSuite, MessagesMatchByTagInIssueOrder) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  world().Run(kRelaxed, [&](Communicator& comm) {
    constexpr int kTags = 5;
    constexpr int kPerTag = 3;
    constexpr int64_t kCount = 211;
    const TestData data(seed(), DType::kFloat32);
    auto salt_of = [](int tag, int k) { return static_cast<uint64_t>(700 + 10 * tag + k); };
    std::vector<std::vector<uint8_t>> outgoing;
    std::vector<CommHandle> sends;
    for (int tag = 1; tag <= kTags; ++tag) {
      for (int k = 0; k < kPerTag; ++k) {
        outgoing.push_back(data.Make(salt_of(tag, k), comm.rank(), kCount));
        sends.push_back(comm.Send(outgoing.back().data(), kCount, DType::kFloat32, Next(comm),
                                  static_cast<uint64_t>(tag)));
      }
    }
    std::vector<std::vector<uint8_t>> incoming(kTags * kPerTag,
                                               std::vector<uint8_t>(kCount * 4, 0xab));
    std::vector<CommHandle> receives(kTags * kPerTag);
    for (int tag = kTags; tag >= 1; --tag) {
      for (int k = 0; k < kPerTag; ++k) {
        const int slot = (tag - 1) * kPerTag + k;
        receives[slot] = comm.Recv(incoming[slot].data(), kCount, DType::kFloat32, Previous(comm),
                                   static_cast<uint64_t>(tag));
      }
    }
    for (int tag = 1; tag <= kTags; ++tag) {
      for (int k = 0; k < kPerTag; ++k) {
        const int slot = (tag - 1) * kPerTag + k;
        const std::string what = absl::StrFormat("rank %d tag %d message %d", comm.rank(), tag, k);
        ASSERT_TRUE(receives[slot].Wait().ok()) << what << ": " << receives[slot].Wait();
        EXPECT_EQ(CheckCopy(data, salt_of(tag, k), Previous(comm), incoming[slot].data(), kCount, 0,
                            what),
                  0);
      }
    }
    for (CommHandle& send : sends) ASSERT_TRUE(send.Wait().ok()) << send.Wait();
  });
}

TEST_P(CommSuite, SendRecvMismatchNamesBothRanks) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  struct Variant {
    int64_t send_count, recv_count;
    DType send_dtype, recv_dtype;
    const char* sender_sees;
    const char* receiver_sees;
  };
  for (const Variant& v :
       {Variant{7, 8, DType::kFloat32, DType::kFloat32, "count 7 vs 8", "count 8 vs 7"},
        Variant{5, 5, DType::kFloat32, DType::kBFloat16, "dtype fp32 vs bf16",
                "dtype bf16 vs fp32"}}) {
    world().Run(Timeout(absl::Seconds(10)), [&](Communicator& comm) {
      if (comm.rank() > 1) return;
      std::vector<float> buf(8, 1.0f);
      const absl::Time start = absl::Now();
      const absl::Status status =
          comm.rank() == 0 ? comm.Send(buf.data(), v.send_count, v.send_dtype, 1, 4).Wait()
                           : comm.Recv(buf.data(), v.recv_count, v.recv_dtype, 0, 4).Wait();
      EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "a mismatch must not wait for a timeout";
      ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
      const std::string message(status.message());
      EXPECT_THAT(message, HasSubstr(absl::StrFormat("comm rank %d:", comm.rank())));
      EXPECT_THAT(message, HasSubstr(comm.rank() == 0 ? "rank 1's Recv #1 from rank 0"
                                                      : "rank 0's Send #1 to rank 1"));
      EXPECT_THAT(message, HasSubstr(comm.rank() == 0 ? v.sender_sees : v.receiver_sees));
      // Poisoned.
      EXPECT_FALSE(comm.Send(buf.data(), 1, DType::kFloat32, 1 - comm.rank(), 0).Wait().ok());
    });
  }
}

TEST_P(CommSuite, RecvFromSilentRankTimesOutNamingIt) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const absl::Duration timeout = absl::Seconds(1);
  world().Run(Timeout(timeout), [&](Communicator& comm) {
    const int silent = comm.size() - 1;
    if (comm.rank() == silent) {
      absl::SleepFor(timeout + absl::Milliseconds(1500));
      return;
    }
    std::vector<float> buf(9, 0.0f);
    const absl::Time start = absl::Now();
    const absl::Status status = comm.Recv(buf.data(), 9, DType::kFloat32, silent, 2).Wait();
    const absl::Duration took = absl::Now() - start;
    ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    const std::string message(status.message());
    EXPECT_THAT(message, HasSubstr(absl::StrFormat("Recv #1 from rank %d", silent)));
    EXPECT_THAT(message, HasSubstr(absl::StrFormat("waiting for rank %d", silent)));
    EXPECT_THAT(message, HasSubstr("timed out after 1s"));
    EXPECT_THAT(message, HasSubstr("running"));
    EXPECT_GE(took, timeout - absl::Milliseconds(50));
    EXPECT_LT(took, timeout + absl::Seconds(4)) << message;
  });
}

TEST_P(CommSuite, InvalidSendRecvArgumentsFail) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  struct BadCall {
    const char* name;
    std::function<CommHandle(Communicator&, float*)> issue;
    const char* expected_text;
  };
  const std::vector<BadCall> bad_calls = {
      {"self", [](Communicator& c, float* b) { return c.Send(b, 1, DType::kFloat32, c.rank(), 0); },
       "this rank"},
      {"peer out of range",
       [](Communicator& c, float* b) { return c.Recv(b, 1, DType::kFloat32, c.size(), 0); },
       "out of range"},
      {"negative count",
       [](Communicator& c, float* b) { return c.Send(b, -2, DType::kFloat32, Next(c), 0); },
       "negative"},
      {"null buffer",
       [](Communicator& c, float* b) { return c.Recv(nullptr, 3, DType::kFloat32, Next(c), 0); },
       "null"},
  };
  for (const BadCall& bad : bad_calls) {
    world().Run(kRelaxed, [&](Communicator& comm) {
      float buf[4] = {};
      const absl::Status status = bad.issue(comm, buf).Wait();
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.name << ": " << status;
      EXPECT_THAT(std::string(status.message()), HasSubstr(bad.expected_text)) << bad.name;
      const absl::Status next = comm.Barrier().Wait();
      EXPECT_EQ(next.code(), absl::StatusCode::kInvalidArgument) << bad.name << ": " << next;
    });
  }
}

// Even and odd ranks form two groups ordered by descending rank (key =
// -rank); with 3 or more ranks the last one passes color -1 and gets none.
TEST_P(CommSuite, SplitFormsGroupsOrderedByKey) {
  world().Run(kRelaxed, [&](Communicator& comm) {
    const int world_size = comm.size();
    const bool opts_out = world_size >= 3 && comm.rank() == world_size - 1;
    const int color = opts_out ? -1 : comm.rank() % 2;
    auto child_or = comm.Split(color, -comm.rank());
    ASSERT_TRUE(child_or.ok()) << child_or.status();
    std::unique_ptr<Communicator> child = std::move(child_or).value();
    if (opts_out) {
      EXPECT_EQ(child, nullptr);
      ASSERT_TRUE(comm.Barrier().Wait().ok());
      return;
    }
    ASSERT_NE(child, nullptr);
    std::vector<int> members;  // world ranks of the group, in key order
    for (int r = world_size - 1; r >= 0; --r) {
      const bool member_opts_out = world_size >= 3 && r == world_size - 1;
      if (!member_opts_out && r % 2 == color) members.push_back(r);
    }
    ASSERT_EQ(child->size(), static_cast<int>(members.size()));
    ASSERT_EQ(members[child->rank()], comm.rank());
    EXPECT_EQ(child->backend(), comm.backend());
    // An AllReduce in the group: each member contributes as its group rank.
    const TestData data(seed(), DType::kFloat32);
    std::vector<uint8_t> buf = data.Make(800 + color, child->rank(), 1009);
    const absl::Status reduced =
        child->AllReduce(buf.data(), buf.data(), 1009, DType::kFloat32).Wait();
    ASSERT_TRUE(reduced.ok()) << reduced;
    EXPECT_EQ(CheckSum(data, 800 + color, child->size(), buf.data(), 1009, 0, "AllReduce in group"),
              0);
    // A ring of Send/Recv in the group, group ranks as peers.
    if (child->size() >= 2) {
      const std::vector<uint8_t> out = data.Make(810 + color, child->rank(), 4099);
      std::vector<uint8_t> in(out.size(), 0xab);
      CommHandle sent = child->Send(out.data(), 4099, DType::kFloat32, Next(*child), 1);
      const absl::Status received =
          child->Recv(in.data(), 4099, DType::kFloat32, Previous(*child), 1).Wait();
      ASSERT_TRUE(received.ok()) << received;
      ASSERT_TRUE(sent.Wait().ok()) << sent.Wait();
      EXPECT_EQ(CheckCopy(data, 810 + color, Previous(*child), in.data(), 4099, 0, "ring in group"),
                0);
      // Its errors say which group and which parent rank.
      const absl::Status bad = child->Send(out.data(), 1, DType::kFloat32, child->rank(), 0).Wait();
      EXPECT_THAT(std::string(bad.message()),
                  HasSubstr(absl::StrFormat("comm rank %d of group %d (parent rank %d)",
                                            child->rank(), color, comm.rank())));
    }
    // The parent still works.
    ASSERT_TRUE(comm.Barrier().Wait().ok());
  });
}

TEST_P(CommSuite, SplitWithoutOneRankNamesIt) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const absl::Duration timeout = absl::Seconds(1);
  world().Run(Timeout(timeout), [&](Communicator& comm) {
    const int absent = comm.size() - 1;
    if (comm.rank() == absent) {
      absl::SleepFor(timeout + absl::Milliseconds(1500));
      return;
    }
    const absl::Time start = absl::Now();
    auto child = comm.Split(0, 0);
    ASSERT_FALSE(child.ok()) << "Split finished without rank " << absent;
    EXPECT_TRUE(child.status().code() == absl::StatusCode::kDeadlineExceeded ||
                child.status().code() == absl::StatusCode::kAborted)
        << child.status();
    const std::string message(child.status().message());
    EXPECT_THAT(message, HasSubstr("Split(color 0, key 0)"));
    EXPECT_THAT(message, HasSubstr(absl::StrFormat("waiting for rank(s) %d", absent)));
    EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(4)) << message;
  });
}

}  // namespace
}  // namespace testing_comm
}  // namespace zeroshard
