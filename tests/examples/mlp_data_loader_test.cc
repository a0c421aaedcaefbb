// MicroBatchLoader: the micro-batches of DistributedSampler in its order, bit
// for bit, from its thread at every depth; restarts off the order (a resume);
// a clean stop at any point; the wait it reports.
//
// Every micro-batch is also checked against an expectation that does not go
// through the sampler: the sample ids from the rule mlp.h documents (global
// micro-batch r * accum + m of step s holds samples
// s * world * accum * b + (r * accum + m) * b + k), their inputs, and the
// teacher's outputs recomputed in double precision from the teacher's
// weights. A sampler that shards wrongly fails here, not only in mlp_test.
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "examples/mlp/data_loader.h"
#include "examples/mlp/internal/block_math.h"
#include "gtest/gtest.h"

namespace zeroshard::mlp {
namespace {

MlpConfig TinyConfig() {
  MlpConfig cfg;
  cfg.hidden = 24;
  cfg.blocks = 2;
  cfg.micro_batch = 5;
  return cfg;
}

struct MicroBatch {
  std::vector<float> x, y;
};

MicroBatch Expected(const MlpConfig& cfg, int world, int rank, int accum, int64_t step, int micro) {
  const size_t n = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  MicroBatch b{std::vector<float>(n), std::vector<float>(n)};
  DistributedSampler(cfg, world, rank, accum).Fill(step, micro, b.x.data(), b.y.data());
  return b;
}

// The sample ids of local micro-batch `micro` of step `step` on rank `rank`,
// by the documented rule, counted here rather than asked of the sampler.
std::vector<int64_t> HandCountedIds(const MlpConfig& cfg, int world, int rank, int accum,
                                    int64_t step, int micro) {
  const int64_t b = cfg.micro_batch;
  const int64_t first = step * world * accum * b + (static_cast<int64_t>(rank) * accum + micro) * b;
  std::vector<int64_t> ids;
  for (int64_t k = 0; k < b; ++k) ids.push_back(first + k);
  return ids;
}

// The teacher network in double precision: per block
// y = x + W2 gelu(W1 x + b1) + b2 with W1 [4h, h], W2 [h, 4h] row-major and
// the exact GELU 0.5 z (1 + erf(z / sqrt(2))), on the teacher's weights.
std::vector<double> TeacherForward(const MlpConfig& cfg, std::vector<double> x) {
  const int64_t h = cfg.hidden, inner = 4 * cfg.hidden, rows = cfg.micro_batch;
  for (int u = 0; u < cfg.blocks; ++u) {
    const std::vector<float> w1 = RandomParam(cfg, cfg.teacher_seed, u, kW1);
    const std::vector<float> b1 = RandomParam(cfg, cfg.teacher_seed, u, kB1);
    const std::vector<float> w2 = RandomParam(cfg, cfg.teacher_seed, u, kW2);
    const std::vector<float> b2 = RandomParam(cfg, cfg.teacher_seed, u, kB2);
    std::vector<double> y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      const double* xr = &x[static_cast<size_t>(r * h)];
      std::vector<double> act(static_cast<size_t>(inner));
      for (int64_t i = 0; i < inner; ++i) {
        double z = b1[i];
        for (int64_t j = 0; j < h; ++j) z += static_cast<double>(w1[i * h + j]) * xr[j];
        act[i] = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
      }
      for (int64_t j = 0; j < h; ++j) {
        double out = b2[j];
        for (int64_t i = 0; i < inner; ++i) out += static_cast<double>(w2[j * inner + i]) * act[i];
        y[static_cast<size_t>(r * h + j)] = xr[j] + out;
      }
    }
    x = std::move(y);
  }
  return x;
}

// x and y of one micro-batch against the hand-counted expectation: x holds
// the inputs of the hand-counted samples exactly (InputAt is a function of
// data_seed and the sample id alone, whatever the world), y the teacher's
// outputs for them within fp32 rounding of the double reference.
void ExpectHandCountedBatch(const MlpConfig& cfg, int world, int rank, int accum, int64_t step,
                            int micro, const std::vector<float>& x, const std::vector<float>& y) {
  const int64_t h = cfg.hidden;
  const DistributedSampler inputs(cfg, 1, 0, 1);
  const std::vector<int64_t> ids = HandCountedIds(cfg, world, rank, accum, step, micro);
  std::vector<double> want_x(x.size());
  int failures = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    int64_t first_wrong = -1;
    for (int64_t j = 0; j < h; ++j) {
      want_x[k * h + j] = inputs.InputAt(ids[k], j);
      if (x[k * h + j] != want_x[k * h + j] && first_wrong < 0) first_wrong = j;
    }
    if (first_wrong >= 0 && ++failures <= 3) {
      const size_t i = k * h + static_cast<size_t>(first_wrong);
      ADD_FAILURE() << "x of step " << step << " micro " << micro << " (world " << world
                    << ", rank " << rank << ", accum " << accum << ") row " << k
                    << " is not sample " << ids[k] << ": element " << first_wrong << " is " << x[i]
                    << ", sample " << ids[k] << " has " << want_x[i];
    }
  }
  const std::vector<double> want_y = TeacherForward(cfg, want_x);
  int y_failures = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double tol = 1e-4 * (1.0 + std::fabs(want_y[i]));
    if (!(std::fabs(y[i] - want_y[i]) <= tol) && ++y_failures <= 3) {
      ADD_FAILURE() << "y of step " << step << " micro " << micro << " element " << i << " is "
                    << y[i] << ", the double-precision teacher gives " << want_y[i];
    }
  }
}

void ExpectBatch(MicroBatchLoader& loader, const MlpConfig& cfg, int world, int rank, int accum,
                 int64_t step, int micro) {
  const size_t n = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  std::vector<float> x(n, -1.0f), y(n, -1.0f);
  const absl::Duration waited = loader.Next(step, micro, x.data(), y.data());
  EXPECT_GE(waited, absl::ZeroDuration());
  const MicroBatch want = Expected(cfg, world, rank, accum, step, micro);
  EXPECT_EQ(std::memcmp(x.data(), want.x.data(), n * sizeof(float)), 0)
      << "x of step " << step << " micro " << micro << " depth " << loader.depth();
  EXPECT_EQ(std::memcmp(y.data(), want.y.data(), n * sizeof(float)), 0)
      << "y of step " << step << " micro " << micro << " depth " << loader.depth();
  ExpectHandCountedBatch(cfg, world, rank, accum, step, micro, x, y);
}

// Destroys `loader` on another thread and fails, instead of hanging the
// binary, when the destructor does not return (its thread never stopped).
void ExpectDestroyed(std::unique_ptr<MicroBatchLoader> loader, const char* what) {
  // Shared: a destroyer left blocked must not outlive what it writes to.
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread destroyer([done, l = std::move(loader)]() mutable {
    l.reset();
    done->set_value();
  });
  if (finished.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    destroyer.detach();  // still blocked: leave it, the test has failed
    ADD_FAILURE() << what << ": the loader's destructor did not return within 30 s";
    return;
  }
  destroyer.join();
}

// The hand-counted rule itself, on a case small enough to read: world 2,
// accum 3, micro-batches of 5: step 4 is samples 120..149, rank 1's second
// micro-batch the fifth of the step's six, samples 140..144.
TEST(MicroBatchLoader, HandCountedIdsFollowTheDocumentedRule) {
  MlpConfig cfg = TinyConfig();
  EXPECT_EQ(HandCountedIds(cfg, 2, 1, 3, 4, 1), (std::vector<int64_t>{140, 141, 142, 143, 144}));
  EXPECT_EQ(HandCountedIds(cfg, 2, 0, 3, 0, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(MicroBatchLoader, SameBitsAsTheSamplerInOrderAtEveryDepth) {
  internal::UseSingleThreadedBlas();
  const MlpConfig cfg = TinyConfig();
  const int world = 3, rank = 1, accum = 3;
  for (int depth : {0, 1, 2, 4}) {
    MicroBatchLoader loader(cfg, world, rank, accum, depth, /*first_step=*/0);
    for (int64_t step = 0; step < 4; ++step) {
      for (int micro = 0; micro < accum; ++micro) {
        ExpectBatch(loader, cfg, world, rank, accum, step, micro);
      }
    }
  }
}

TEST(MicroBatchLoader, RestartsWhereTheTrainerAsks) {
  internal::UseSingleThreadedBlas();
  const MlpConfig cfg = TinyConfig();
  const int accum = 2;
  // A resumed run starts the loader at its step; a trainer that leaves the
  // order (a skipped step, a repeat) gets what it asks for.
  MicroBatchLoader loader(cfg, 1, 0, accum, /*depth=*/3, /*first_step=*/7);
  ExpectBatch(loader, cfg, 1, 0, accum, 7, 0);
  ExpectBatch(loader, cfg, 1, 0, accum, 7, 1);
  ExpectBatch(loader, cfg, 1, 0, accum, 9, 1);
  ExpectBatch(loader, cfg, 1, 0, accum, 10, 0);
  ExpectBatch(loader, cfg, 1, 0, accum, 2, 0);
  ExpectBatch(loader, cfg, 1, 0, accum, 2, 1);
  ExpectBatch(loader, cfg, 1, 0, accum, 3, 0);
}

TEST(MicroBatchLoader, StopsCleanlyAtAnyPoint) {
  internal::UseSingleThreadedBlas();
  const MlpConfig cfg = TinyConfig();
  // Destroyed at once (the thread may be mid-Fill).
  ExpectDestroyed(std::make_unique<MicroBatchLoader>(cfg, 2, 0, 2, 2, 0), "destroyed at once");
  // Destroyed while its thread refills the queue: two micro-batches taken
  // (each frees room), the next two being made or already queued (the
  // queue full, the thread waiting for room).
  {
    auto loader = std::make_unique<MicroBatchLoader>(cfg, 2, 0, 2, 2, 0);
    ExpectBatch(*loader, cfg, 2, 0, 2, 0, 0);
    ExpectBatch(*loader, cfg, 2, 0, 2, 0, 1);
    ExpectDestroyed(std::move(loader), "destroyed while refilling");
  }
  // Destroyed with its queue full (the thread waiting for room).
  {
    auto loader = std::make_unique<MicroBatchLoader>(cfg, 2, 0, 2, 2, 0);
    loader->WaitQueued(2);
    ExpectDestroyed(std::move(loader), "destroyed with a full queue");
  }
  // Destroyed after a restart whose old micro-batch may still be being made.
  {
    auto loader = std::make_unique<MicroBatchLoader>(cfg, 2, 0, 2, 4, 0);
    ExpectBatch(*loader, cfg, 2, 0, 2, 5, 1);
    ExpectDestroyed(std::move(loader), "destroyed after a restart");
  }
}

TEST(MicroBatchLoader, ReportsOnlyTheTimeItBlocked) {
  internal::UseSingleThreadedBlas();
  const MlpConfig cfg = TinyConfig();
  const size_t n = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  std::vector<float> x(n), y(n);
  // The wait it reports is never more than the call took.
  auto timed_next = [&](MicroBatchLoader& loader, int64_t step, int micro) {
    const auto begin = std::chrono::steady_clock::now();
    const absl::Duration waited = loader.Next(step, micro, x.data(), y.data());
    const absl::Duration took = absl::FromChrono(std::chrono::steady_clock::now() - begin);
    EXPECT_GE(waited, absl::ZeroDuration());
    EXPECT_LE(waited, took) << "step " << step << " micro " << micro;
    return waited;
  };
  // Made ahead while the trainer was busy: no wait at all.
  {
    MicroBatchLoader ahead(cfg, 1, 0, 1, 2, 0);
    ahead.WaitQueued(1);
    EXPECT_EQ(timed_next(ahead, 0, 0), absl::ZeroDuration())
        << "a micro-batch made ahead still reported a wait";
    ExpectHandCountedBatch(cfg, 1, 0, 1, 0, 0, x, y);
  }
  // Synchronous: the making itself is the wait.
  MicroBatchLoader sync(cfg, 1, 0, 1, 0, 0);
  EXPECT_GT(timed_next(sync, 0, 0), absl::ZeroDuration());
  ExpectHandCountedBatch(cfg, 1, 0, 1, 0, 0, x, y);
}

}  // namespace
}  // namespace zeroshard::mlp
