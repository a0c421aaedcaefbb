// MicroBatchLoader: the micro-batches of DistributedSampler in its order, bit
// for bit, from its thread at every depth; restarts off the order (a resume);
// a clean stop at any point; the wait it reports.
#include <cstring>
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
  // Destroyed at once (the thread may be mid-Fill), with a full queue, and
  // after a restart whose old micro-batch is still being made.
  { MicroBatchLoader loader(cfg, 2, 0, 2, 2, 0); }
  {
    MicroBatchLoader loader(cfg, 2, 0, 2, 2, 0);
    absl::SleepFor(absl::Milliseconds(20));
  }
  {
    MicroBatchLoader loader(cfg, 2, 0, 2, 4, 0);
    ExpectBatch(loader, cfg, 2, 0, 2, 5, 1);
  }
}

TEST(MicroBatchLoader, ReportsOnlyTheTimeItBlocked) {
  internal::UseSingleThreadedBlas();
  const MlpConfig cfg = TinyConfig();
  const size_t n = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  std::vector<float> x(n), y(n);
  // Made ahead while the trainer was busy: no wait at all.
  MicroBatchLoader ahead(cfg, 1, 0, 1, 2, 0);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(ahead.Next(0, 0, x.data(), y.data()), absl::ZeroDuration());
  // Synchronous: the making itself is the wait.
  MicroBatchLoader sync(cfg, 1, 0, 1, 0, 0);
  EXPECT_GT(sync.Next(0, 0, x.data(), y.data()), absl::ZeroDuration());
}

}  // namespace
}  // namespace zeroshard::mlp
