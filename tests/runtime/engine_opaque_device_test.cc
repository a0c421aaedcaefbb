// The engine's paths for a device whose memory the host may not touch (a
// GPU's), exercised on the CPU: a device that hands out host memory but says
// it is not host-accessible makes the engine take them all — params and
// checkpoints through device copies, the norm's block sums copied back, the
// small start-up / norm / checkpoint records staged through device memory,
// GetParam gathering into a device temporary — and the trainer read and
// write its views through copies. The run must be bit for bit the plain CPU
// device's, for every stage, precision and world size 1-4, and a checkpoint
// written on one must load on the other.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/runtime/opaque_cpu_device.h"
#include "tests/runtime/synthetic_trainer.h"
#include "tests/test_seed.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

// From the start, or from `load_dir`'s checkpoint; saved into `save_dir`
// when given. `copies` counts the opaque devices' copies.
absl::StatusOr<SyntheticRunResult> RunOn(bool opaque, int world, const TrainSpec& train, int steps,
                                         const std::string& load_dir = "",
                                         const std::string& save_dir = "",
                                         std::atomic<int64_t>* copies = nullptr) {
  SyntheticRunSpec run;
  run.world = world;
  run.train = train;
  run.steps = steps;
  run.load_dir = load_dir;
  run.save_dir = save_dir;
  run.comm.timeout = absl::Seconds(30);
  run.make_device = [opaque, copies](int) -> absl::StatusOr<std::unique_ptr<Device>> {
    if (opaque) return std::unique_ptr<Device>(std::make_unique<OpaqueCpuDevice>(copies));
    return CreateCpuDevice();
  };
  return RunSyntheticRanks(run);
}

TEST(EngineOpaqueDeviceTest, TheDeviceCopyPathsTrainTheHostRunsModelBitForBit) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    for (int world = 1; world <= 4; ++world) {
      for (int stage = 0; stage <= 3; ++stage) {
        const std::string what = absl::StrFormat(
            "%s, %d rank(s), stage %d, %s", PrecisionName(precision), world, stage, SeedTrace());
        // Two micro-batches per rank on 2 and 3 ranks (accumulation, stage-2
        // staging slots).
        const int accum = (world == 2 || world == 3) ? 2 : 1;
        auto host = RunOn(false, world, SyntheticTrain(stage, precision, accum), 3);
        ASSERT_TRUE(host.ok()) << host.status() << " " << what;
        std::atomic<int64_t> copies{0};
        auto opaque =
            RunOn(true, world, SyntheticTrain(stage, precision, accum), 3, "", "", &copies);
        ASSERT_TRUE(opaque.ok()) << opaque.status() << " " << what;
        EXPECT_EQ(FirstDifference(*host, *opaque), "") << "host vs opaque device: " << what;
        // The engine and the trainer really went through the device.
        EXPECT_GT(copies.load(), 0) << what;
      }
    }
  }
}

TEST(EngineOpaqueDeviceTest, ACheckpointMovesBetweenHostAndDeviceMemoryBitForBit) {
  ExpectCheckpointsMoveBitForBit(
      [](bool opaque, int world, const TrainSpec& train, int steps, const std::string& load,
         const std::string& save) { return RunOn(opaque, world, train, steps, load, save); },
      "opaque device");
}

}  // namespace
}  // namespace zeroshard::testing
