// OffloadPhase (zeroshard/offload.h): one rank's OffloadOptimizer over its
// buffers, built as EngineImpl::Allocate builds it, for benchmarks.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/offload/swap_files.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/runtime/offload_optimizer.h"
#include "engine/src/runtime/shard_buffers.h"
#include "engine/src/runtime/shard_optimizer.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/offload.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

// A small value in [-0.5, 0.5) for (key, index): SplitMix64's finaliser.
float ValueAt(uint64_t key, int64_t index) {
  uint64_t z = key * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(index) + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 - 0.5);
}

class OffloadPhaseImpl final : public OffloadPhase {
 public:
  absl::Status Build(const ModelSpec& model, const TrainSpec& train);

  absl::Status Run(const OffloadPhaseParts& parts) override {
    internal::OffloadApplyParts p;
    p.copies = parts.copies;
    p.update = parts.update;
    p.io = parts.io;
    return offload_->Apply(*optimizer_, /*grad_scale=*/1.0, /*lr=*/1e-4, p);
  }
  const BufferPlan& plan() const override { return plan_; }
  int64_t state_numel() const override { return state_numel_; }
  std::string Describe() const override { return offload_->Describe(); }
  Bytes last_bytes() const override {
    const internal::OffloadStepStats& s = offload_->last_stats();
    return {s.bytes_to_host, s.bytes_to_device, s.bytes_read, s.bytes_written};
  }

  ~OffloadPhaseImpl() override {
    // The update's streams first: they use the buffers.
    offload_.reset();
  }

 private:
  absl::Status FillDevice(Stream& stream, void* dst, int64_t numel, DType dtype, uint64_t key,
                          float scale);
  absl::Status FillState();

  ModelSpec model_;
  TrainSpec train_;
  std::optional<internal::FlatLayout> layout_;
  BufferPlan plan_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Device> host_;
  std::unique_ptr<internal::ShardBuffers> buffers_;
  std::unique_ptr<internal::ShardOptimizer> optimizer_;
  std::unique_ptr<internal::OffloadOptimizer> offload_;
  int64_t state_numel_ = 0;
};

absl::Status OffloadPhaseImpl::FillDevice(Stream& stream, void* dst, int64_t numel, DType dtype,
                                          uint64_t key, float scale) {
  constexpr int64_t kPiece = int64_t{1} << 20;
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  std::vector<char> host(static_cast<size_t>(kPiece * elem));
  for (int64_t at = 0; at < numel; at += kPiece) {
    const int64_t n = std::min(kPiece, numel - at);
    for (int64_t i = 0; i < n; ++i) {
      const float x = scale * ValueAt(key, at + i);
      if (dtype == DType::kFloat32) {
        std::memcpy(host.data() + i * 4, &x, 4);
      } else {
        const uint16_t h = dtype == DType::kBFloat16 ? Fp32ToBf16(x) : Fp32ToFp16(x);
        std::memcpy(host.data() + i * 2, &h, 2);
      }
    }
    ZS_RETURN_IF_ERROR(
        device_->CopyAsync(static_cast<char*>(dst) + at * elem, host.data(), n * elem, stream));
    ZS_RETURN_IF_ERROR(stream.Synchronize());
  }
  return absl::OkStatus();
}

absl::Status OffloadPhaseImpl::FillState() {
  // Through the tier, as Load writes it.
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<float> host(static_cast<size_t>(kPiece));
  using internal::StateTensor;
  const bool mixed = train_.precision != Precision::kFp32;
  for (StateTensor t : {StateTensor::kMaster, StateTensor::kAdamM, StateTensor::kAdamV}) {
    if (t == StateTensor::kMaster && !mixed) continue;
    const uint64_t key = 7 + static_cast<uint64_t>(t);
    for (int64_t at = 0; at < state_numel_; at += kPiece) {
      const int64_t n = std::min(kPiece, state_numel_ - at);
      for (int64_t i = 0; i < n; ++i) {
        const float r = ValueAt(key, at + i);
        host[i] = t == StateTensor::kMaster  ? 0.05f * r
                  : t == StateTensor::kAdamM ? 1e-4f * r
                                             : 1e-8f * (r * r + 0.01f);
      }
      ZS_RETURN_IF_ERROR(offload_->Write(t, at, n, host.data()));
    }
  }
  return absl::OkStatus();
}

absl::Status OffloadPhaseImpl::Build(const ModelSpec& model, const TrainSpec& train) {
  model_ = model;
  train_ = train;
  if (!train_.offload.enabled()) {
    return absl::InvalidArgumentError(
        "OffloadPhase: train.offload.optimizer is device; give host or nvme");
  }
  if (train_.offload.params != MemoryTier::kDevice) {
    return absl::InvalidArgumentError(
        "OffloadPhase: the phase of the optimizer state only; give offload.params device");
  }
  ZS_RETURN_IF_ERROR(train_.Validate());
  ZS_ASSIGN_OR_RETURN(internal::FlatLayout layout,
                      internal::FlatLayout::Create(model_, /*world_size=*/1));
  layout_.emplace(std::move(layout));
  ZS_ASSIGN_OR_RETURN(plan_, internal::PlanBuffers(*layout_, train_));
  const PlannedBuffer* m = plan_.Find(kAdamMBuffer);
  if (m == nullptr || m->numel == 0) {
    return absl::InvalidArgumentError("OffloadPhase: the model has no trainable params");
  }
  state_numel_ = m->numel;
  device_ = CreateCpuDevice();
  ZS_ASSIGN_OR_RETURN(host_, CreateHostTierDevice(*device_));
  const DType param_dtype = train_.param_dtype();
  const DType grad_dtype = train_.effective_grad_dtype();
  buffers_ = std::make_unique<internal::ShardBuffers>(*layout_, plan_, /*rank=*/0, param_dtype,
                                                      grad_dtype);
  ZS_RETURN_IF_ERROR(buffers_->Allocate(*device_, host_.get()));
  const internal::ShardBuffers& buffers = *buffers_;
  optimizer_ = std::make_unique<internal::ShardOptimizer>(
      train_, internal::BuildUpdateRuns(*layout_, model_,
                                        [&buffers](int u) { return buffers.OwnedRange(u); }));
  std::unique_ptr<internal::SwapFiles> swap;
  if (train_.offload.optimizer == MemoryTier::kNvme) {
    ZS_ASSIGN_OR_RETURN(
        swap, internal::OffloadOptimizer::CreateSwapFiles(plan_, train_.offload.dir, /*rank=*/0));
  }
  offload_ = std::make_unique<internal::OffloadOptimizer>(
      *layout_, plan_, *buffers_, train_.precision != Precision::kFp32, param_dtype, grad_dtype,
      *device_, *host_, std::move(swap));
  ZS_RETURN_IF_ERROR(offload_->Init());
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device_->CreateStream());
  const PlannedBuffer* params = plan_.Find(kParamsBuffer);
  const PlannedBuffer* grads = plan_.Find(kGradsBuffer);
  ZS_RETURN_IF_ERROR(
      FillDevice(*stream, buffers_->params.data(), params->numel, params->dtype, 1, 0.05f));
  ZS_RETURN_IF_ERROR(
      FillDevice(*stream, buffers_->grads.data(), grads->numel, grads->dtype, 2, 1e-3f));
  return FillState();
}

}  // namespace

absl::StatusOr<std::unique_ptr<OffloadPhase>> OffloadPhase::Create(const ModelSpec& model,
                                                                   const TrainSpec& train) {
  auto phase = std::make_unique<OffloadPhaseImpl>();
  ZS_RETURN_IF_ERROR(phase->Build(model, train));
  return std::unique_ptr<OffloadPhase>(std::move(phase));
}

}  // namespace zeroshard
