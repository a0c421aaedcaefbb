// EngineImpl's offload (TrainSpec::offload, docs/offload.md): the tiers'
// allocation and ledgers, and the optimizer state's and params' reads and
// writes on whichever tier holds them. The streamed update is
// OffloadOptimizer's (offload_optimizer.h).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/offload/swap_files.h"
#include "engine/src/runtime/engine_impl.h"
#include "zeroshard/dtype.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

absl::Status EngineImpl::AllocateOffload() {
  if (!train_.offload.enabled()) return absl::OkStatus();
  // The NVMe tier's files: the plan's NVMe buffers, each a swap file, made
  // (and the disk's room checked) before the first step.
  std::unique_ptr<SwapFiles> swap;
  if (train_.offload.optimizer == MemoryTier::kNvme) {
    if (train_.offload.dir.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Engine::Create (rank %d): offload.optimizer nvme needs offload.dir, the directory of "
          "the swap files (a local NVMe drive's file system; --offload-dir)",
          rank_));
    }
    absl::StatusOr<std::unique_ptr<SwapFiles>> created =
        OffloadOptimizer::CreateSwapFiles(plan_, train_.offload.dir, rank_);
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          absl::StrFormat("Engine::Create (rank %d): the NVMe tier's swap files "
                                          "(offload.dir %s): %s",
                                          rank_, train_.offload.dir, created.status().message()));
    }
    swap = *std::move(created);
    for (const PlannedBuffer& b : plan_.buffers) {
      if (b.tier == MemoryTier::kNvme) nvme_ledger_.Add(b.category, b.bytes());
    }
  }
  offload_ = std::make_unique<OffloadOptimizer>(layout_, plan_, buffers_, mixed_, param_dtype_,
                                                grad_dtype_, device_, *host_tier_, std::move(swap));
  ZS_RETURN_IF_ERROR(offload_->Init());
  checkpoint_->set_offload(offload_.get());
  if (train_.offload.params != MemoryTier::kDevice) {
    gatherer_->set_shard_fetch([this](int unit, void* device) -> absl::Status {
      const int64_t begin = layout_.ShardRange(unit, rank_).begin;
      const int64_t n = layout_.unit(unit).shard_numel;
      if (buffers_.ParamsOnNvme(unit)) {
        return offload_->ReadToDevice(StateTensor::kParams, buffers_.OptimizerIndex(unit, begin), n,
                                      device);
      }
      return offload_->FetchShard(device, ParamsAt(unit, begin),
                                  n * static_cast<int64_t>(DTypeSize(param_dtype_)));
    });
  }
  return absl::OkStatus();
}

const MemoryLedger& EngineImpl::tier_ledger(MemoryTier tier) const {
  switch (tier) {
    case MemoryTier::kHost:
      return host_tier_ != nullptr ? host_tier_->ledger() : host_ledger_unused_;
    case MemoryTier::kNvme:
      return nvme_ledger_;
    default:
      return device_.ledger();
  }
}

absl::Status EngineImpl::ReadState(StateTensor tensor, int unit, int64_t seg_index, int64_t n,
                                   float* host) const {
  if (offload_ != nullptr) {
    return offload_->Read(tensor, buffers_.OptimizerIndex(unit, seg_index), n, host);
  }
  const float* src = tensor == StateTensor::kMaster  ? buffers_.MasterAt(unit, seg_index)
                     : tensor == StateTensor::kAdamM ? buffers_.AdamMAt(unit, seg_index)
                                                     : buffers_.AdamVAt(unit, seg_index);
  return CopyOnCompute(host, src, n * static_cast<int64_t>(sizeof(float)));
}

absl::Status EngineImpl::WriteState(StateTensor tensor, int unit, int64_t seg_index, int64_t n,
                                    const float* host) {
  if (offload_ != nullptr) {
    return offload_->Write(tensor, buffers_.OptimizerIndex(unit, seg_index), n, host);
  }
  float* dst = tensor == StateTensor::kMaster  ? buffers_.MasterAt(unit, seg_index)
               : tensor == StateTensor::kAdamM ? buffers_.AdamMAt(unit, seg_index)
                                               : buffers_.AdamVAt(unit, seg_index);
  return CopyOnCompute(dst, host, n * static_cast<int64_t>(sizeof(float)));
}

absl::Status EngineImpl::StoreParams(int unit, int64_t seg_begin, int64_t n, const float* values,
                                     std::vector<uint16_t>& staging) {
  if (!buffers_.ParamsOnNvme(unit)) {
    return StoreConverted(values, n, param_dtype_, ParamsAt(unit, seg_begin), staging);
  }
  // A swap file: the param dtype's bytes, written now.
  const int64_t index = buffers_.OptimizerIndex(unit, seg_begin);
  if (param_dtype_ == DType::kFloat32)
    return offload_->Write(StateTensor::kParams, index, n, values);
  staging.resize(static_cast<size_t>(n));
  if (param_dtype_ == DType::kBFloat16) {
    ConvertFp32ToBf16(values, staging.data(), static_cast<size_t>(n));
  } else {
    ConvertFp32ToFp16(values, staging.data(), static_cast<size_t>(n));
  }
  return offload_->Write(StateTensor::kParams, index, n, staging.data());
}

}  // namespace zeroshard::internal
