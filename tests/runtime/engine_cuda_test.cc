// The engine on one GPU: 1-4 ranks as threads sharing the GPU (the local
// communicator over its memory), stages 0-3, fp32 / bf16 / fp16, against the
// same run on the CPU device: the weights, norms and loss scales are the
// same bits. Labelled gpu; without a CUDA device every test skips visibly.
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/runtime/synthetic_trainer.h"
#include "tests/test_seed.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

struct Run {
  std::vector<std::vector<float>> params;  // rank 0, after the last step
  std::vector<StepResult> steps;           // rank 0
  int64_t device_bytes = 0;                // rank 0's ledger
};

TrainSpec Train(int stage, Precision precision) {
  TrainSpec t;
  t.zero_stage = stage;
  t.precision = precision;
  t.optimizer.lr = 1e-2;
  t.optimizer.weight_decay = 0.05;
  t.max_grad_norm = 5.0;
  return t;
}

// `gpu`: every rank's engine on its own Device object for cuda:0, the
// group's collectives on that GPU's memory; else CPU devices.
absl::StatusOr<Run> RunOn(bool gpu, int world, const TrainSpec& train, int steps) {
  const ModelSpec spec = SyntheticSpec();
  std::unique_ptr<Device> group_device;
  CommOptions options;
  options.timeout = absl::Seconds(60);
  if (gpu) {
    ZS_ASSIGN_OR_RETURN(group_device, CreateCudaDevice(0));
    options.device = group_device.get();
  }
  Run run;
  std::mutex mu;
  ZS_RETURN_IF_ERROR(RunLocalRanks(
      world,
      [&](int rank, Communicator& comm) -> absl::Status {
        std::unique_ptr<Device> device;
        if (gpu) {
          ZS_ASSIGN_OR_RETURN(device, CreateCudaDevice(0));
        } else {
          device = CreateCpuDevice();
        }
        ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
        ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
        std::vector<StepResult> results;
        for (int s = 0; s < steps; ++s) {
          ZS_ASSIGN_OR_RETURN(StepResult r, SyntheticStep(*engine, spec, {}, device.get()));
          results.push_back(r);
        }
        ZS_ASSIGN_OR_RETURN(auto params, AllParams(*engine, spec));
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(mu);
          run.params = std::move(params);
          run.steps = results;
          run.device_bytes = device->ledger().current_total();
        }
        return absl::OkStatus();
      },
      options));
  return run;
}

bool HaveGpu() { return CreateCudaDevice(0).ok(); }

std::string FirstDifference(const Run& cpu, const Run& gpu) {
  if (cpu.params.size() != gpu.params.size()) return "a different number of params";
  for (size_t p = 0; p < cpu.params.size(); ++p) {
    for (size_t i = 0; i < cpu.params[p].size(); ++i) {
      if (std::memcmp(&cpu.params[p][i], &gpu.params[p][i], sizeof(float)) != 0) {
        return absl::StrFormat("param %d element %d: cpu %.9g, gpu %.9g", p, i, cpu.params[p][i],
                               gpu.params[p][i]);
      }
    }
  }
  for (size_t s = 0; s < cpu.steps.size(); ++s) {
    if (std::memcmp(&cpu.steps[s].grad_norm, &gpu.steps[s].grad_norm, sizeof(double)) != 0 ||
        cpu.steps[s].loss_scale != gpu.steps[s].loss_scale ||
        cpu.steps[s].skipped != gpu.steps[s].skipped) {
      return absl::StrFormat("step %d: norm %.17g vs %.17g, loss scale %g vs %g", s + 1,
                             cpu.steps[s].grad_norm, gpu.steps[s].grad_norm,
                             cpu.steps[s].loss_scale, gpu.steps[s].loss_scale);
    }
  }
  return "";
}

TEST(EngineCudaTest, ThreadRanksOnOneGpuTrainTheCpuRunsModelBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: " << CreateCudaDevice(0).status();
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    for (int world = 1; world <= 4; ++world) {
      for (int stage = 0; stage <= 3; ++stage) {
        const std::string what = absl::StrFormat(
            "%s, %d rank(s), stage %d, %s", PrecisionName(precision), world, stage, SeedTrace());
        auto cpu = RunOn(false, world, Train(stage, precision), 4);
        ASSERT_TRUE(cpu.ok()) << cpu.status() << " " << what;
        auto gpu = RunOn(true, world, Train(stage, precision), 4);
        ASSERT_TRUE(gpu.ok()) << gpu.status() << " " << what;
        EXPECT_EQ(FirstDifference(*cpu, *gpu), "") << what;
        EXPECT_EQ(cpu->device_bytes, gpu->device_bytes) << "the ledgers differ: " << what;
      }
    }
  }
}

TEST(EngineCudaTest, AHostCommunicatorIsRefusedForAGpuDevice) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: " << CreateCudaDevice(0).status();
  auto device = CreateCudaDevice(0);
  ASSERT_TRUE(device.ok());
  auto group = CreateLocalGroup(1);
  ASSERT_TRUE(group.ok());
  auto engine = Engine::Create(SyntheticSpec(), Train(1, Precision::kFp32), **device, *(*group)[0]);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
}

}  // namespace
}  // namespace zeroshard::testing
