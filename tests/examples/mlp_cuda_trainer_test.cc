// The MLP trainer on one GPU (CudaMlpTrainer; 1 and 2 thread ranks sharing
// the GPU through a local group on its memory) against MlpTrainer on the CPU,
// same seeds, 50 steps: fp32 and bf16 mixed precision. The matrix products
// sum in another order on the GPU (cuBLASLt) than on the CPU (BLAS), so the
// runs agree within a tolerance, not bit for bit:
//   fp32: every step's loss within 1e-4 relative, final weights within 1e-3
//         relative L2;
//   bf16: every loss within 1e-2 relative, weights within 2e-2 relative L2
//         (the params are rounded to bf16 each step, which amplifies the
//         products' differences).
// Labelled gpu; without a CUDA device it skips visibly.
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "examples/mlp/cuda/cuda_mlp_trainer.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

struct Trajectory {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // every param, fp32, after the run
};

MlpConfig Config() {
  MlpConfig cfg;
  cfg.hidden = 128;
  cfg.blocks = 3;
  cfg.micro_batch = 16;
  return cfg;
}

TrainSpec Train(Precision precision) {
  TrainSpec t;
  t.zero_stage = 2;
  t.precision = precision;
  t.optimizer.lr = 3e-3;
  t.optimizer.weight_decay = 0.01;
  t.max_grad_norm = 2.0;
  return t;
}

absl::StatusOr<Trajectory> Train(bool gpu, int world, Precision precision, int steps) {
  const MlpConfig cfg = Config();
  const ModelSpec spec = BuildModelSpec(cfg);
  std::unique_ptr<Device> group_device;
  CommOptions options;
  options.timeout = absl::Seconds(120);
  if (gpu) {
    ZS_ASSIGN_OR_RETURN(group_device, CreateCudaDevice(0));
    options.device = group_device.get();
  }
  Trajectory out;
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
        ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, Train(precision), *device, comm));
        ZS_RETURN_IF_ERROR(InitEngineParams(*engine, cfg));
        ZS_RETURN_IF_ERROR(engine->Start(TrainerSettings(cfg)));
        std::vector<double> losses;
        if (gpu) {
          ZS_ASSIGN_OR_RETURN(auto trainer,
                              gpu::CudaMlpTrainer::Create(cfg, *engine, comm, *device));
          for (int s = 0; s < steps; ++s) {
            ZS_ASSIGN_OR_RETURN(double loss, trainer->TrainStep());
            losses.push_back(loss);
          }
        } else {
          MlpTrainer trainer(cfg, *engine, comm);
          for (int s = 0; s < steps; ++s) {
            ZS_ASSIGN_OR_RETURN(double loss, trainer.TrainStep());
            losses.push_back(loss);
          }
        }
        std::vector<std::vector<float>> params;
        for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
          for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
            ZS_ASSIGN_OR_RETURN(auto v, engine->GetParam(u, p));
            params.push_back(std::move(v));
          }
        }
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(mu);
          out.losses = std::move(losses);
          out.params = std::move(params);
        }
        return absl::OkStatus();
      },
      options));
  return out;
}

double RelativeL2(const Trajectory& a, const Trajectory& b) {
  double diff = 0.0, norm = 0.0;
  for (size_t p = 0; p < a.params.size(); ++p) {
    for (size_t i = 0; i < a.params[p].size(); ++i) {
      const double d = static_cast<double>(a.params[p][i]) - b.params[p][i];
      diff += d * d;
      norm += static_cast<double>(b.params[p][i]) * b.params[p][i];
    }
  }
  return std::sqrt(diff / norm);
}

TEST(MlpCudaTrainerTest, FiftyStepsOnOneGpuFollowTheCpuRun) {
  if (!CreateCudaDevice(0).ok()) {
    GTEST_SKIP() << "no CUDA device: " << CreateCudaDevice(0).status();
  }
  constexpr int kSteps = 50;
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    const double loss_tol = precision == Precision::kFp32 ? 1e-4 : 1e-2;
    const double weight_tol = precision == Precision::kFp32 ? 1e-3 : 2e-2;
    for (int world : {1, 2}) {
      const std::string what =
          absl::StrFormat("%s, %d rank(s), stage 2", PrecisionName(precision), world);
      auto cpu = Train(false, world, precision, kSteps);
      ASSERT_TRUE(cpu.ok()) << cpu.status() << " " << what;
      auto gpu = Train(true, world, precision, kSteps);
      ASSERT_TRUE(gpu.ok()) << gpu.status() << " " << what;
      double worst = 0.0;
      for (int s = 0; s < kSteps; ++s) {
        const double rel = std::fabs(gpu->losses[s] - cpu->losses[s]) / cpu->losses[s];
        worst = std::max(worst, rel);
        EXPECT_LE(rel, loss_tol) << "step " << s + 1 << ": gpu " << gpu->losses[s] << ", cpu "
                                 << cpu->losses[s] << "; " << what;
      }
      const double l2 = RelativeL2(*gpu, *cpu);
      EXPECT_LE(l2, weight_tol) << what;
      std::printf(
          "%s: loss %.6f -> %.6f (cpu) / %.6f (gpu); worst loss difference %.3g, "
          "weights relative L2 %.3g\n",
          what.c_str(), cpu->losses.front(), cpu->losses.back(), gpu->losses.back(), worst, l2);
    }
  }
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard
