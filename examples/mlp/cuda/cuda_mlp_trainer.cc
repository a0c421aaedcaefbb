#include "examples/mlp/cuda/cuda_mlp_trainer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "examples/mlp/internal/unit_loop.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace gpu {

CudaMlpTrainer::CudaMlpTrainer(const MlpConfig& cfg, Engine& engine, Communicator& comm,
                               Device& device)
    : cfg_(cfg),
      engine_(engine),
      comm_(comm),
      device_(device),
      sampler_(cfg, comm.size(), comm.rank(), engine.train().grad_accum_steps) {}

absl::StatusOr<std::unique_ptr<CudaMlpTrainer>> CudaMlpTrainer::Create(
    const MlpConfig& cfg, Engine& engine, Communicator& comm, Device& device, MatmulInputs inputs) {
  ZS_RETURN_IF_ERROR(cfg.Validate());
  ZS_RETURN_IF_ERROR(CheckRegressionModelOnly(cfg, "CudaMlpTrainer"));
  if (device.kind() != DeviceKind::kCuda || comm.memory_kind() != DeviceKind::kCuda) {
    return absl::InvalidArgumentError(
        "CudaMlpTrainer: the engine's device and the communicator must hold GPU memory (a CUDA "
        "device; nccl or a local group with CommOptions::device); use MlpTrainer on the CPU");
  }
  std::unique_ptr<CudaMlpTrainer> t(new CudaMlpTrainer(cfg, engine, comm, device));
  ZS_ASSIGN_OR_RETURN(t->ordinal_, CudaOrdinal(device));
  ZS_RETURN_IF_ERROR(t->UseDevice());
  ZS_ASSIGN_OR_RETURN(t->stream_, device.CreateStream());
  CudaMlpMathConfig math;
  math.blocks = cfg.blocks;
  math.batch = cfg.micro_batch;
  math.hidden = cfg.hidden;
  math.inputs = inputs;
  ZS_ASSIGN_OR_RETURN(t->math_, CudaMlpMath::Create(math));
  const size_t io = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  t->x_.resize(io);
  t->target_.resize(io);
  ZS_ASSIGN_OR_RETURN(
      t->loss_exchange_,
      device.Allocate(2 * sizeof(double), MemoryCategory::kWorkspace, "mlp_loss_exchange"));
  return t;
}

absl::StatusOr<double> CudaMlpTrainer::MicroBatch(int micro, float loss_scale) {
  const int64_t bytes = cfg_.micro_batch * cfg_.hidden * static_cast<int64_t>(sizeof(float));
  const absl::Time input_start = absl::Now();
  sampler_.Fill(engine_.steps(), micro, x_.data(), target_.data());
  ZS_RETURN_IF_ERROR(device_.CopyAsync(math_->input(0), x_.data(), bytes, *stream_));
  ZS_RETURN_IF_ERROR(device_.CopyAsync(math_->target(), target_.data(), bytes, *stream_));
  // The host buffers are refilled next micro-batch: the copies must be done.
  ZS_RETURN_IF_ERROR(stream_->Synchronize());
  engine_.RecordInputWait(absl::Now() - input_start);

  // Forward: the views are ready when returned (docs/gpu.md, rule 1); the
  // stream must be done with a unit's weights before Release (rule 3).
  ZS_RETURN_IF_ERROR(mlp::internal::ForwardUnits(
      engine_, cfg_.blocks, [&](int u, const UnitView& view) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(const DeviceBlockWeights w, math_->WeightsFromView(view, stream()));
        ZS_RETURN_IF_ERROR(math_->Forward(u, w, stream()));
        return stream_->Synchronize();
      }));
  ZS_RETURN_IF_ERROR(math_->Loss(loss_scale, stream()));
  ZS_RETURN_IF_ERROR(mlp::internal::BackwardUnits(
      engine_, cfg_.blocks,
      [&](int u, const UnitView& view) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(const DeviceBlockWeights w, math_->WeightsFromView(view, stream()));
        return math_->Backward(u, w, stream());
      },
      [&](int, const UnitView& grad_view) -> absl::Status {
        ZS_RETURN_IF_ERROR(math_->WriteGrads(grad_view, stream()));
        // The engine reads the gradient (rule 2) and may reuse the gathered
        // weights' buffer after Release (rule 3).
        return stream_->Synchronize();
      }));
  return math_->ReadLoss(stream());
}

absl::Status CudaMlpTrainer::UseDevice() const {
  const cudaError_t rc = cudaSetDevice(ordinal_);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // not a sticky error: leave no trace for the next launch check
    return absl::InternalError(
        absl::StrFormat("CudaMlpTrainer: cudaSetDevice(%d): %s", ordinal_, cudaGetErrorString(rc)));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CudaMlpTrainer::TrainStep() {
  ZS_RETURN_IF_ERROR(UseDevice());
  const int accum = engine_.train().grad_accum_steps;
  ZS_ASSIGN_OR_RETURN(
      const double local_loss_sum,
      mlp::internal::AccumulateAndStep(
          engine_, [&](int m, float loss_scale) { return MicroBatch(m, loss_scale); },
          &last_step_));
  // The communicator moves GPU memory: the loss travels through the device.
  double* exchange = loss_exchange_.as<double>();
  ZS_RETURN_IF_ERROR(device_.CopyAsync(exchange, &local_loss_sum, sizeof(double), *stream_));
  ZS_RETURN_IF_ERROR(stream_->Synchronize());
  ZS_RETURN_IF_ERROR(comm_.AllReduceSync(exchange, exchange + 1, 1, DType::kFloat64));
  double global_loss_sum = 0.0;
  ZS_RETURN_IF_ERROR(device_.CopyAsync(&global_loss_sum, exchange + 1, sizeof(double), *stream_));
  ZS_RETURN_IF_ERROR(stream_->Synchronize());
  return global_loss_sum / (static_cast<double>(comm_.size()) * accum);
}

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
