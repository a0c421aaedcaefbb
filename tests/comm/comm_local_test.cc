// The communicator suite on the local backend (world sizes 1..5 in one
// process), plus what only the local backend has: RunLocalRanks and group
// teardown.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "tests/comm/comm_suite.h"
#include "tests/test_env.h"
#include "tests/test_seed.h"
#include "zeroshard/device.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace testing_comm {
namespace {

using ::testing::HasSubstr;

class LocalWorld : public TestWorld {
 public:
  explicit LocalWorld(int size) : size_(size) {}
  int size() const override { return size_; }
  void Run(const CommOptions& options,
           const std::function<void(Communicator& comm)>& body) override {
    const absl::Status status = RunLocalRanks(
        size_,
        [&](int rank, Communicator& comm) -> absl::Status {
          body(comm);
          // A rank whose assertions failed leaves, so its peers fail fast.
          if (::testing::Test::HasFatalFailure()) {
            return absl::AbortedError("a fatal test assertion failed on this rank");
          }
          return absl::OkStatus();
        },
        options);
    EXPECT_TRUE(status.ok()) << status;
  }

 private:
  int size_;
};

}  // namespace

std::unique_ptr<TestWorld> MakeWorld(const WorldParam& param) {
  return std::make_unique<LocalWorld>(param.size);
}

// The test binary's seed (tests/test_seed.h: ZS_TEST_SEED or fresh, printed).
uint64_t BaseSeed() { return ::zeroshard::testing::Seed(); }

INSTANTIATE_TEST_SUITE_P(Local, CommSuite,
                         ::testing::Values(WorldParam{"local", 1}, WorldParam{"local", 2},
                                           WorldParam{"local", 3}, WorldParam{"local", 4},
                                           WorldParam{"local", 5}),
                         WorldName);

namespace {

CommOptions Timeout(absl::Duration timeout) {
  CommOptions options;
  options.timeout = timeout;
  return options;
}

// busy_time counts a collective's run time on the progress thread, waits
// for a late peer included: the rank that arrives first is busy while it
// waits, the late one only briefly, and nothing counts before a collective.
TEST(LocalGroup, BusyTimeCountsTheCollectivesRunTime) {
  auto group = CreateLocalGroup(2);
  ASSERT_TRUE(group.ok());
  Communicator& early = *(*group)[0];
  Communicator& late = *(*group)[1];
  EXPECT_EQ(early.busy_time(), absl::ZeroDuration());
  double a = 1.0, b = 2.0, out_a = 0.0, out_b = 0.0;
  CommHandle first = early.AllReduce(&a, &out_a, 1, DType::kFloat64);
  absl::SleepFor(absl::Milliseconds(300));
  CommHandle second = late.AllReduce(&b, &out_b, 1, DType::kFloat64);
  ASSERT_TRUE(first.Wait().ok());
  ASSERT_TRUE(second.Wait().ok());
  EXPECT_EQ(out_a, 3.0);
  EXPECT_GE(early.busy_time(), absl::Milliseconds(250)) << early.busy_time();
  EXPECT_LT(late.busy_time(), absl::Seconds(::zeroshard::testing::TimeLimit(0.25)))
      << late.busy_time();
}

// AllReduceAfter / ReduceScatterAfter run only once the device work recorded
// in the event has finished: each rank's send buffer is written by a copy
// queued behind a long chain of others on a CPU stream, and the collective
// is issued at once; had it not waited, it would sum the zeros the buffer
// held before.
TEST(LocalGroup, CollectivesAfterAnEventWaitForTheDeviceWork) {
  constexpr int kWorld = 2;
  constexpr int64_t kCount = 1 << 16;
  std::mt19937_64 rng(::zeroshard::testing::Seed());
  std::vector<std::vector<float>> source(kWorld, std::vector<float>(kCount));
  for (auto& v : source) {
    for (float& x : v) x = static_cast<float>(rng() % 1000) + 1.0f;  // never zero
  }
  std::vector<std::vector<float>> reduced(kWorld), scattered(kWorld);
  const absl::Status status = RunLocalRanks(kWorld, [&](int rank, Communicator& comm) {
    auto device = CreateCpuDevice();
    auto stream = device->CreateStream();
    if (!stream.ok()) return stream.status();
    std::vector<float> send(kCount, 0.0f), send2(kCount, 0.0f);
    std::vector<float> busy_a(8 << 20), busy_b(8 << 20);
    for (int i = 0; i < 16; ++i) {  // tens of milliseconds of queued work
      ZS_RETURN_IF_ERROR(
          device->CopyAsync(busy_b.data(), busy_a.data(), busy_a.size() * 4, **stream));
    }
    ZS_RETURN_IF_ERROR(device->CopyAsync(send.data(), source[rank].data(), kCount * 4, **stream));
    ZS_RETURN_IF_ERROR(device->CopyAsync(send2.data(), source[rank].data(), kCount * 4, **stream));
    auto event = device->CreateEvent();
    if (!event.ok()) return event.status();
    ZS_RETURN_IF_ERROR((*event)->Record(**stream));
    std::shared_ptr<Event> ready(std::move(*event));
    reduced[rank].assign(kCount, 0.0f);
    scattered[rank].assign(kCount / kWorld, 0.0f);
    CommHandle a =
        comm.AllReduceAfter(ready, send.data(), reduced[rank].data(), kCount, DType::kFloat32, 0);
    CommHandle b = comm.ReduceScatterAfter(ready, send2.data(), scattered[rank].data(),
                                           kCount / kWorld, DType::kFloat32, 0);
    ZS_RETURN_IF_ERROR(a.Wait());
    ZS_RETURN_IF_ERROR(b.Wait());
    return (*stream)->Synchronize();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(reduced[r][i], source[0][i] + source[1][i]) << "rank " << r << " element " << i;
    }
    for (int64_t i = 0; i < kCount / kWorld; ++i) {
      const int64_t j = r * (kCount / kWorld) + i;
      ASSERT_EQ(scattered[r][i], source[0][j] + source[1][j]) << "rank " << r << " element " << i;
    }
  }
}

TEST(LocalGroup, RejectsBadWorldSize) {
  EXPECT_EQ(CreateLocalGroup(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunLocalRanks(-1, [](int, Communicator&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalGroup, RanksAndBackend) {
  auto group = CreateLocalGroup(3);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ((*group)[r]->rank(), r);
    EXPECT_EQ((*group)[r]->size(), 3);
    EXPECT_EQ((*group)[r]->backend(), "local");
  }
}

TEST(LocalGroup, FailingRankMakesPeersFailFast) {
  std::atomic<int> peers_named_rank{0};
  const absl::Time start = absl::Now();
  const absl::Status status = RunLocalRanks(
      3,
      [&](int rank, Communicator& comm) -> absl::Status {
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return absl::InternalError("boom");
        }
        std::vector<float> buf(4, 1.0f);
        const absl::Status s = comm.AllReduceSync(buf.data(), buf.data(), 4, DType::kFloat32);
        EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 left the group (its error: boom)"));
        if (!s.ok()) ++peers_named_rank;
        return absl::OkStatus();
      },
      Timeout(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "peers waited for the timeout";
  EXPECT_EQ(peers_named_rank.load(), 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 1: boom"));
}

TEST(LocalGroup, ARankThatReturnsLeavesAndPeersFailAtOnce) {
  // The in-process analogue of a killed rank: rank 2 stops after collective
  // #1. Its peers must not wait out the 60 s timeout for collective #2.
  std::atomic<int> named{0};
  const absl::Time start = absl::Now();
  const absl::Status status = RunLocalRanks(
      3,
      [&](int rank, Communicator& comm) -> absl::Status {
        std::vector<float> buf(4, 1.0f);
        ZS_RETURN_IF_ERROR(comm.AllReduceSync(buf.data(), buf.data(), 4, DType::kFloat32));
        if (rank == 2) return absl::OkStatus();
        const absl::Status s = comm.AllReduceSync(buf.data(), buf.data(), 4, DType::kFloat32);
        EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
        // Either rank 2's departure itself, or the peer that saw it first.
        if (s.message().find("rank 2 left the group after its collective #1 (its function "
                             "returned)") != absl::string_view::npos) {
          ++named;
        }
        return s;
      },
      Timeout(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "peers waited for the timeout";
  EXPECT_GE(named.load(), 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 2 left the group"));
}

TEST(LocalGroup, ARankThatReturnsStillCompletesWhatItIssued) {
  // Rank 1 issues collective #2 and returns without waiting for it: its
  // peers complete #2 with its data, and only #3 fails.
  std::vector<std::vector<float>> data(2, std::vector<float>(5));
  const absl::Status status = RunLocalRanks(
      2,
      [&](int rank, Communicator& comm) -> absl::Status {
        std::vector<float>& buf = data[rank];
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(rank * 10 + i);
        ZS_RETURN_IF_ERROR(comm.BarrierSync());
        CommHandle second = comm.AllReduce(buf.data(), buf.data(), 5, DType::kFloat32);
        if (rank == 1) return absl::OkStatus();  // the handle is dropped, the collective runs
        ZS_RETURN_IF_ERROR(second.Wait());
        const absl::Status third = comm.BarrierSync();
        EXPECT_EQ(third.code(), absl::StatusCode::kAborted) << third;
        EXPECT_THAT(std::string(third.message()), HasSubstr("after its collective #2"));
        return absl::OkStatus();
      },
      Timeout(absl::Seconds(60)));
  EXPECT_TRUE(status.ok()) << status;
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(data[0][i], static_cast<float>(10 + 2 * i)) << i;
}

TEST(LocalGroup, AStuckRankDoesNotHangTheRun) {
  // The in-process analogue of a stopped (SIGSTOP) rank: rank 3 blocks
  // outside the communicator and never returns by itself. Its peers time out
  // naming it, and RunLocalRanks gives up on it after the grace period
  // instead of joining it forever.
  struct Latch {
    absl::Notification release;
    absl::Notification finished;
  };
  auto latch = std::make_shared<Latch>();
  CommOptions options = Timeout(absl::Seconds(1));
  options.local_grace = absl::Seconds(1);
  const absl::Time start = absl::Now();
  const absl::Status status = RunLocalRanks(
      4,
      [latch](int rank, Communicator& comm) -> absl::Status {
        std::vector<float> buf(4, 1.0f);
        ZS_RETURN_IF_ERROR(comm.AllReduceSync(buf.data(), buf.data(), 4, DType::kFloat32));
        if (rank == 3) {
          latch->release.WaitForNotification();
          latch->finished.Notify();
          return absl::OkStatus();
        }
        return comm.AllReduceSync(buf.data(), buf.data(), 4, DType::kFloat32);
      },
      options);
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, options.timeout + options.local_grace + absl::Seconds(3)) << status;
  EXPECT_GE(took, options.timeout) << status;
  ASSERT_FALSE(status.ok());
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("waiting for rank(s) 3"));
  EXPECT_THAT(message, HasSubstr("still running"));
  EXPECT_THAT(message, HasSubstr("rank(s) 3 had not returned 1s after that failure"));
  // Let the detached rank finish, so the process ends cleanly.
  latch->release.Notify();
  latch->finished.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(200));
}

TEST(LocalGroup, TimeoutComesFromTheEnvironmentWhenNotGiven) {
  ASSERT_EQ(setenv(kCommTimeoutEnvVar, "0.3", 1), 0);
  const absl::Time start = absl::Now();
  const absl::Status status = RunLocalRanks(2, [](int rank, Communicator& comm) -> absl::Status {
    if (rank == 1) {
      absl::SleepFor(absl::Seconds(1));
      return absl::OkStatus();
    }
    return comm.BarrierSync();
  });
  unsetenv(kCommTimeoutEnvVar);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("timed out after 300ms"));
}

TEST(CommOptions, ResolveCommTimeout) {
  unsetenv(kCommTimeoutEnvVar);
  EXPECT_EQ(*ResolveCommTimeout(CommOptions{}), kDefaultCommTimeout);
  EXPECT_EQ(*ResolveCommTimeout(Timeout(absl::Seconds(7))), absl::Seconds(7));
  struct Case {
    const char* env;
    absl::Duration expected;  // ZeroDuration: an error
  };
  const Case cases[] = {{"30", absl::Seconds(30)},       {"2.5", absl::Milliseconds(2500)},
                        {"90s", absl::Seconds(90)},      {"2m", absl::Minutes(2)},
                        {" 10 ", absl::Seconds(10)},     {"0", absl::ZeroDuration()},
                        {"-3", absl::ZeroDuration()},    {"ten", absl::ZeroDuration()},
                        {"inf", absl::ZeroDuration()},   {"nan", absl::ZeroDuration()},
                        {"1e300", absl::ZeroDuration()}, {"5 parsecs", absl::ZeroDuration()}};
  for (const Case& c : cases) {
    ASSERT_EQ(setenv(kCommTimeoutEnvVar, c.env, 1), 0);
    const absl::StatusOr<absl::Duration> got = ResolveCommTimeout(CommOptions{});
    if (c.expected == absl::ZeroDuration()) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.env;
      EXPECT_THAT(std::string(got.status().message()), HasSubstr(kCommTimeoutEnvVar)) << c.env;
      // The error reaches whoever creates a communicator.
      EXPECT_EQ(CreateLocalGroup(2).status().code(), absl::StatusCode::kInvalidArgument) << c.env;
    } else {
      ASSERT_TRUE(got.ok()) << c.env << ": " << got.status();
      EXPECT_EQ(*got, c.expected) << c.env;
    }
    // An explicit timeout wins over the environment.
    EXPECT_EQ(*ResolveCommTimeout(Timeout(absl::Seconds(3))), absl::Seconds(3)) << c.env;
  }
  unsetenv(kCommTimeoutEnvVar);
  EXPECT_EQ(ResolveCommTimeout(Timeout(absl::Seconds(-1))).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue 17: ZS_COMM_TIMEOUT=1e9 was "not a positive timeout" (it is too
// long: say so, with the range) and 1e-9 was taken, timing every collective
// out after 1 ns. Every source of a timeout has one range,
// [kMinCommTimeout, kMaxCommTimeout], bounds included.
TEST(CommOptions, TimeoutsOutsideTheirRangeSayWhichBoundAndWhy) {
  unsetenv(kCommTimeoutEnvVar);
  auto from_env = [](const char* text) {
    EXPECT_EQ(setenv(kCommTimeoutEnvVar, text, 1), 0);
    absl::StatusOr<absl::Duration> got = ResolveCommTimeout(CommOptions{});
    unsetenv(kCommTimeoutEnvVar);
    return got;
  };
  absl::StatusOr<absl::Duration> got = from_env("1e9");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("environment variable ZS_COMM_TIMEOUT '1e9' is longer than the largest "
                        "collective timeout 1000000 s (11.6 days); give a timeout in [0.1 s, "
                        "1000000 s], or unset it for the default 2m"));
  got = from_env("1e-9");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("environment variable ZS_COMM_TIMEOUT '1e-9' is shorter than the least "
                        "collective timeout 100ms"));
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("give a timeout in [0.1 s, "));
  EXPECT_THAT(std::string(from_env("soon").status().message()),
              HasSubstr("'soon' is not a timeout; write seconds"));
  // The bounds are in, in either notation; just past them is out.
  EXPECT_EQ(*from_env("0.1"), absl::Milliseconds(100));
  EXPECT_EQ(*from_env("100ms"), absl::Milliseconds(100));
  EXPECT_EQ(*from_env("1000000"), absl::Seconds(1000000));
  EXPECT_FALSE(from_env("99ms").ok());
  EXPECT_FALSE(from_env("1000000.5").ok());
  EXPECT_FALSE(from_env("277h46m41s").ok());
}

TEST(CommOptions, EveryTimeoutSourceHasOneRange) {
  // The rule of ZS_COMM_TIMEOUT for a timeout set in code, and for
  // mlp_demo's flag.
  for (absl::Duration d : {absl::Nanoseconds(1), kMinCommTimeout - absl::Nanoseconds(1),
                           kMaxCommTimeout + absl::Nanoseconds(1), -absl::Seconds(1)}) {
    CommOptions options;
    options.timeout = d;
    const absl::Status status = ResolveCommTimeout(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(std::string(status.message()), HasSubstr("CommOptions::timeout ")) << d;
    EXPECT_THAT(std::string(status.message()), HasSubstr("[0.1 s, 1000000 s]")) << d;
  }
  EXPECT_THAT(std::string(ParseCommTimeout("0.01", "flag --comm-timeout").status().message()),
              HasSubstr("flag --comm-timeout '0.01' is shorter than the least"));

  // Random timeouts from 1 ns to 10^9 s, as seconds or milliseconds: taken
  // exactly when in range, refused naming the bound otherwise.
  std::mt19937_64 rng(::zeroshard::testing::Seed());
  std::uniform_real_distribution<double> log10_seconds(-9, 9);
  for (int i = 0; i < 500; ++i) {
    const double seconds = std::pow(10.0, log10_seconds(rng));
    const bool as_ms = rng() & 1;
    // absl::ParseDuration takes no exponent: milliseconds in fixed point.
    const std::string text =
        as_ms ? absl::StrFormat("%.6fms", seconds * 1e3) : absl::StrFormat("%.17g", seconds);
    const absl::StatusOr<absl::Duration> parsed = ParseCommTimeout(text, "test");
    const double number = std::strtod(text.c_str(), nullptr);
    const absl::Duration expected = as_ms ? absl::Milliseconds(number) : absl::Seconds(number);
    const bool in_range = expected >= kMinCommTimeout && expected <= kMaxCommTimeout;
    if (in_range) {
      ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status() << " "
                               << ::zeroshard::testing::SeedTrace();
      EXPECT_LE(absl::AbsDuration(*parsed - expected), absl::Nanoseconds(1)) << text;
    } else {
      ASSERT_FALSE(parsed.ok()) << text << " " << ::zeroshard::testing::SeedTrace();
      EXPECT_THAT(std::string(parsed.status().message()),
                  HasSubstr(expected < kMinCommTimeout ? "is shorter than the least"
                                                       : "is longer than the largest"))
          << text << " " << ::zeroshard::testing::SeedTrace();
    }
  }
}

TEST(LocalGroup, DestroyingTheGroupFailsPendingCollectives) {
  auto group = CreateLocalGroup(2, Timeout(absl::Seconds(60)));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<float> buf(4, 1.0f);
  CommHandle pending = (*group)[0]->AllReduce(buf.data(), buf.data(), 4, DType::kFloat32);
  CommHandle queued = (*group)[0]->Barrier();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(pending.Ready());
  const absl::Time start = absl::Now();
  group->clear();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "destruction waited for the timeout";
  const absl::Status first = pending.Wait();
  EXPECT_EQ(first.code(), absl::StatusCode::kCancelled) << first;
  EXPECT_THAT(std::string(first.message()), HasSubstr("destroyed"));
  EXPECT_FALSE(queued.Wait().ok());
}

TEST(CommHandle, DefaultIsCompleteAndWaitIsIdempotent) {
  CommHandle none;
  EXPECT_FALSE(none.valid());
  EXPECT_TRUE(none.Ready());
  EXPECT_TRUE(none.Wait().ok());

  auto group = CreateLocalGroup(1);
  ASSERT_TRUE(group.ok());
  CommHandle bad = (*group)[0]->AllReduce(nullptr, nullptr, -5, DType::kFloat32);
  EXPECT_TRUE(bad.valid());
  const absl::Status first = bad.Wait();
  EXPECT_EQ(first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(bad.valid());
  EXPECT_TRUE(bad.Ready());
  EXPECT_EQ(bad.Wait(), first);
}

TEST(MpiBackend, StubSaysBuiltWithoutMpi) {
  if (HaveMpi()) GTEST_SKIP() << "this build has MPI; comm_mpi_test covers it under mpirun";
  const auto comm = CreateMpiCommunicator();
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("built without MPI"));
}

}  // namespace
}  // namespace testing_comm
}  // namespace zeroshard
