// The engine on one GPU: 1-4 ranks as threads sharing the GPU (the local
// communicator over its memory), stages 0-3, fp32 / bf16 / fp16, against the
// same run on the CPU device: the weights, norms and loss scales are the
// same bits. Labelled gpu; without a CUDA device every test skips visibly.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/runtime/synthetic_trainer.h"
#include "tests/test_seed.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

struct Run {
  std::vector<std::vector<float>> params;  // rank 0, after the last step
  std::vector<StepResult> steps;           // rank 0
  int64_t device_bytes = 0;                // rank 0's ledger
};

TrainSpec Train(int stage, Precision precision, int accum = 1) {
  TrainSpec t;
  t.grad_accum_steps = accum;
  t.zero_stage = stage;
  t.precision = precision;
  t.optimizer.lr = 1e-2;
  t.optimizer.weight_decay = 0.05;
  t.max_grad_norm = 5.0;
  return t;
}

// `gpu`: every rank's engine on its own Device object for cuda:0, the
// group's collectives on that GPU's memory; else CPU devices.
// From the start, or from `load_dir`'s checkpoint; saves into `save_dir` at
// the end when given.
absl::StatusOr<Run> RunOn(bool gpu, int world, const TrainSpec& train, int steps,
                          const std::string& load_dir = "", const std::string& save_dir = "") {
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
        if (load_dir.empty()) {
          ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
        } else {
          ZS_RETURN_IF_ERROR(engine->Load(load_dir).status());
          ZS_RETURN_IF_ERROR(engine->Start());
        }
        std::vector<StepResult> results;
        for (int s = 0; s < steps; ++s) {
          ZS_ASSIGN_OR_RETURN(StepResult r, SyntheticStep(*engine, spec, {}, device.get()));
          results.push_back(r);
        }
        if (!save_dir.empty()) {
          ZS_RETURN_IF_ERROR(engine->Save(save_dir, "{}", CheckpointOptions{}));
          ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
        }
        ZS_ASSIGN_OR_RETURN(auto params, AllParams(*engine, spec));
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(mu);
          run.params = std::move(params);
          run.steps = results;
          // Model states: a GPU engine also keeps a small workspace for its
          // host-record exchanges.
          run.device_bytes = device->ledger().current_model_states();
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
        // Two micro-batches per rank on 2 and 3 ranks: the accumulation and
        // (stage 2) the staging slots' retirement run on the GPU too.
        const int accum = (world == 2 || world == 3) ? 2 : 1;
        const std::string what =
            absl::StrFormat("%s, %d rank(s), stage %d, accum %d, %s", PrecisionName(precision),
                            world, stage, accum, SeedTrace());
        auto cpu = RunOn(false, world, Train(stage, precision, accum), 4);
        ASSERT_TRUE(cpu.ok()) << cpu.status() << " " << what;
        auto gpu = RunOn(true, world, Train(stage, precision, accum), 4);
        ASSERT_TRUE(gpu.ok()) << gpu.status() << " " << what;
        EXPECT_EQ(FirstDifference(*cpu, *gpu), "") << what;
        EXPECT_EQ(cpu->device_bytes, gpu->device_bytes) << "the ledgers differ: " << what;
      }
    }
  }
}

// A checkpoint written from GPU memory continues on the CPU, and one written
// from host memory continues on the GPU, both bit for bit like the
// uninterrupted CPU run.
TEST(EngineCudaTest, ACheckpointMovesBetweenGpuAndCpuBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: " << CreateCudaDevice(0).status();
  char pattern[] = "/tmp/zs_cuda_ckpt_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  for (Precision precision : {Precision::kFp32, Precision::kFp16Mixed}) {
    const std::string what = absl::StrFormat("%s, %s", PrecisionName(precision), SeedTrace());
    const TrainSpec train = Train(2, precision);
    auto whole = RunOn(false, 2, train, 6);
    ASSERT_TRUE(whole.ok()) << whole.status() << " " << what;
    const std::string a = dir + "/" + PrecisionName(precision) + "_from_gpu";
    const std::string b = dir + "/" + PrecisionName(precision) + "_from_cpu";
    ASSERT_TRUE(RunOn(true, 2, train, 3, "", a).ok()) << what;
    auto cpu_rest = RunOn(false, 2, train, 3, a);
    ASSERT_TRUE(cpu_rest.ok()) << cpu_rest.status() << " " << what;
    ASSERT_TRUE(RunOn(false, 2, train, 3, "", b).ok()) << what;
    auto gpu_rest = RunOn(true, 2, train, 3, b);
    ASSERT_TRUE(gpu_rest.ok()) << gpu_rest.status() << " " << what;
    for (size_t p = 0; p < whole->params.size(); ++p) {
      EXPECT_EQ(cpu_rest->params[p], whole->params[p]) << "GPU -> CPU, param " << p << " " << what;
      EXPECT_EQ(gpu_rest->params[p], whole->params[p]) << "CPU -> GPU, param " << p << " " << what;
    }
  }
  std::system(("rm -rf '" + dir + "'").c_str());
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
