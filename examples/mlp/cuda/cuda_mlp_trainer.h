// CudaMlpTrainer: MlpTrainer's loop (examples/mlp/mlp.h) with the math on a
// CUDA device: the engine runs on a CUDA Device (views in device memory) and
// a communicator that moves GPU memory (nccl, or a local group on one GPU).
// The data comes from the same DistributedSampler on the host and is copied
// in, so a GPU run trains on the CPU run's samples.
#ifndef ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_MLP_TRAINER_H_
#define ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_MLP_TRAINER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/mlp/cuda/cuda_mlp_math.h"
#include "examples/mlp/mlp.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"

namespace zeroshard {
namespace mlp {
namespace gpu {

class CudaMlpTrainer {
 public:
  // `device` is the engine's (a CUDA device); engine, comm and device must
  // outlive the trainer. `inputs` chooses fp32 or bf16 matrix products.
  static absl::StatusOr<std::unique_ptr<CudaMlpTrainer>> Create(
      const MlpConfig& cfg, Engine& engine, Communicator& comm, Device& device,
      MatmulInputs inputs = MatmulInputs::kFp32);

  // As MlpTrainer::TrainStep: accum micro-batches, then engine.Step(); the
  // mean loss over every rank's micro-batches (collective).
  absl::StatusOr<double> TrainStep();
  const StepResult& last_step() const { return last_step_; }

 private:
  CudaMlpTrainer(const MlpConfig& cfg, Engine& engine, Communicator& comm, Device& device);
  absl::StatusOr<double> MicroBatch(int micro, float loss_scale);
  cudaStream_t stream() const { return static_cast<cudaStream_t>(stream_->native_handle()); }
  // Makes the engine's GPU the calling thread's current device: the math's
  // memory, cuBLASLt handle and launches must be on the stream's GPU.
  absl::Status UseDevice() const;

  MlpConfig cfg_;
  Engine& engine_;
  Communicator& comm_;
  Device& device_;
  int ordinal_ = 0;  // of device_ ("cuda:N")
  DistributedSampler sampler_;
  StepResult last_step_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<CudaMlpMath> math_;
  std::vector<float> x_, target_;  // host: one micro-batch from the sampler
  DeviceBuffer loss_exchange_;     // two doubles on the device (the loss all-reduce)
};

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_MLP_TRAINER_H_
