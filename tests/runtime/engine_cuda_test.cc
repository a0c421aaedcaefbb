// The engine on one GPU: 1-4 ranks as threads sharing the GPU (the local
// communicator over its memory), stages 0-3, fp32 / bf16 / fp16, against the
// same run on the CPU device: the weights, norms and loss scales are the
// same bits. Labelled gpu; without a CUDA device every test skips visibly.
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/runtime/synthetic_trainer.h"
#include "tests/test_seed.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

// `gpu`: every rank's engine on its own Device object for cuda:0, the
// group's collectives on that GPU's memory; else CPU devices. From the
// start, or from `load_dir`'s checkpoint; saved into `save_dir` when given.
absl::StatusOr<SyntheticRunResult> RunOn(bool gpu, int world, const TrainSpec& train, int steps,
                                         const std::string& load_dir = "",
                                         const std::string& save_dir = "") {
  std::unique_ptr<Device> group_device;
  SyntheticRunSpec run;
  run.world = world;
  run.train = train;
  run.steps = steps;
  run.load_dir = load_dir;
  run.save_dir = save_dir;
  run.comm.timeout = absl::Seconds(60);
  if (gpu) {
    ZS_ASSIGN_OR_RETURN(group_device, CreateCudaDevice(0));
    run.comm.device = group_device.get();
    run.make_device = [](int) { return CreateCudaDevice(0); };
  } else {
    run.make_device = [](int) -> absl::StatusOr<std::unique_ptr<Device>> {
      return CreateCpuDevice();
    };
  }
  return RunSyntheticRanks(run);
}

bool HaveGpu() { return CreateCudaDevice(0).ok(); }

TEST(EngineCudaTest, ThreadRanksOnOneGpuTrainTheCpuRunsModelBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: " << CreateCudaDevice(0).status();
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    for (int world = 1; world <= 4; ++world) {
      for (int stage = 0; stage <= 3; ++stage) {
        // Two micro-batches per rank on 2 and 3 ranks: the accumulation and
        // (stage 2) the staging slots' retirement run on the GPU too.
        const int accum = (world == 2 || world == 3) ? 2 : 1;
        const std::string what =
            absl::StrFormat("%s, %d rank(s), stage %d, accum %d, %s", PrecisionName(precision),
                            world, stage, accum, SeedTrace());
        auto cpu = RunOn(false, world, SyntheticTrain(stage, precision, accum), 4);
        ASSERT_TRUE(cpu.ok()) << cpu.status() << " " << what;
        auto gpu = RunOn(true, world, SyntheticTrain(stage, precision, accum), 4);
        ASSERT_TRUE(gpu.ok()) << gpu.status() << " " << what;
        EXPECT_EQ(FirstDifference(*cpu, *gpu), "") << "cpu vs gpu: " << what;
        // Model states only: a GPU engine also keeps a small workspace for
        // its host-record exchanges.
        EXPECT_EQ(cpu->model_state_bytes, gpu->model_state_bytes) << "ledgers differ: " << what;
      }
    }
  }
}

// The optimizer state on the pinned host tier and on NVMe beside the GPU
// (OffloadSpec): the gradients and params cross PCIe on the offload's copy
// stream, the update runs the CPU kernels; the same bits as the CPU device's
// run without offload, and each tier's ledger equals the plan.
TEST(EngineCudaTest, OffloadedOptimizerStateTrainsTheCpuRunsModelBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: " << CreateCudaDevice(0).status();
  char pattern[] = "/tmp/zs_cuda_offload_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string swap = pattern;
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    for (int world : {1, 2}) {
      for (int stage = 1; stage <= 3; ++stage) {
        const TrainSpec train = SyntheticTrain(stage, precision, 2);
        auto cpu = RunOn(false, world, train, 3);
        ASSERT_TRUE(cpu.ok()) << cpu.status();
        for (MemoryTier tier : {MemoryTier::kHost, MemoryTier::kNvme}) {
          TrainSpec offloaded = train;
          offloaded.offload.optimizer = tier;
          offloaded.offload.grads = MemoryTier::kHost;
          offloaded.offload.params = stage == 3 ? MemoryTier::kHost : MemoryTier::kDevice;
          offloaded.offload.dir = swap;
          offloaded.offload.chunk_numel = 1024;
          const std::string what =
              absl::StrFormat("%s, %d rank(s), stage %d, %s tier, %s", PrecisionName(precision),
                              world, stage, MemoryTierName(tier), SeedTrace());
          auto gpu = RunOn(true, world, offloaded, 3);
          ASSERT_TRUE(gpu.ok()) << gpu.status() << " " << what;
          EXPECT_EQ(FirstDifference(*cpu, *gpu), "") << "cpu vs offloaded gpu: " << what;
          EXPECT_TRUE(gpu->ledger_vs_plan.empty()) << gpu->ledger_vs_plan.front() << " " << what;
        }
      }
    }
  }
  rmdir(swap.c_str());
}

// A checkpoint written from GPU memory continues on the CPU, and one written
// from host memory continues on the GPU, both bit for bit like the
// uninterrupted CPU run.
TEST(EngineCudaTest, ACheckpointMovesBetweenGpuAndCpuBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: " << CreateCudaDevice(0).status();
  ExpectCheckpointsMoveBitForBit(
      [](bool gpu, int world, const TrainSpec& train, int steps, const std::string& load,
         const std::string& save) { return RunOn(gpu, world, train, steps, load, save); },
      "GPU");
}

TEST(EngineCudaTest, AHostCommunicatorIsRefusedForAGpuDevice) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: " << CreateCudaDevice(0).status();
  auto device = CreateCudaDevice(0);
  ASSERT_TRUE(device.ok());
  auto group = CreateLocalGroup(1);
  ASSERT_TRUE(group.ok());
  auto engine =
      Engine::Create(SyntheticSpec(), SyntheticTrain(1, Precision::kFp32), **device, *(*group)[0]);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
}

}  // namespace
}  // namespace zeroshard::testing
