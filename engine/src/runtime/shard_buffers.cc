#include "engine/src/runtime/shard_buffers.h"

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

// `bytes` into `buffer`, or null for a buffer without memory (one the plan
// puts on the NVMe tier, or an empty one): no arithmetic on a null pointer.
char* At(const DeviceBuffer& buffer, int64_t bytes) {
  return buffer.data() == nullptr ? nullptr : buffer.as<char>() + bytes;
}

}  // namespace

ShardBuffers::ShardBuffers(const FlatLayout& layout, const BufferPlan& plan, int rank,
                           DType param_dtype, DType grad_dtype)
    : layout_(layout),
      plan_(plan),
      rank_(rank),
      param_dtype_(param_dtype),
      grad_dtype_(grad_dtype) {
  // Where each unit's params live in the params buffer: its full segment,
  // or (stage 3) this rank's shard of it.
  // With OffloadSpec::params host the sharded units' shards are a buffer of
  // their own, on the host.
  const PlannedBuffer* shards = plan_.Find(kOffloadParamShardBuffer);
  params_on_host_ = shards != nullptr && shards->tier == MemoryTier::kHost;
  params_on_nvme_ = shards != nullptr && shards->tier == MemoryTier::kNvme;
  int64_t offset = 0;
  int64_t host_offset = 0;
  int64_t tied = 0;
  for (int u = 0; u < layout_.num_units(); ++u) {
    if ((params_on_host_ || params_on_nvme_) && !plan_.unit_resident[u]) {
      param_offset_.push_back(host_offset);
      host_offset += layout_.unit(u).shard_numel;
    } else {
      param_offset_.push_back(offset);
      offset += plan_.unit_resident[u] ? layout_.unit(u).padded_numel : layout_.unit(u).shard_numel;
    }
    tied_offset_.push_back(tied);
    if (layout_.UsersOf(u).size() > 1) tied += layout_.unit(u).padded_numel;
  }
}

absl::Status ShardBuffers::Allocate(Device& device, Device* host) {
  for (const PlannedBuffer& b : plan_.buffers) {
    if (b.tier == MemoryTier::kNvme) continue;  // swap files
    if (b.tier == MemoryTier::kHost && host == nullptr) {
      return absl::InternalError(
          absl::StrFormat("engine: buffer '%s' is planned on the host tier without one", b.name));
    }
    Device& where = b.tier == MemoryTier::kHost ? *host : device;
    ZS_ASSIGN_OR_RETURN(DeviceBuffer buffer, where.Allocate(b.bytes(), b.category, b.name));
    if (b.name == kParamsBuffer) {
      params = std::move(buffer);
    } else if (b.name == kGradsBuffer) {
      grads = std::move(buffer);
    } else if (b.name == kMasterBuffer) {
      master = std::move(buffer);
    } else if (b.name == kAdamMBuffer) {
      adam_m = std::move(buffer);
    } else if (b.name == kAdamVBuffer) {
      adam_v = std::move(buffer);
    } else if (b.name == kGradStagingBuffer) {
      staging = std::move(buffer);
    } else if (b.name == kNormBlocksBuffer) {
      norm_blocks = std::move(buffer);
    } else if (b.name == kParamGatherBuffer) {
      gather_pool = std::move(buffer);
    } else if (b.name == kTiedGradBuffer) {
      tied_accum = std::move(buffer);
    } else if (b.name == kOffloadGradsBuffer) {
      offload_grads = std::move(buffer);
    } else if (b.name == kOffloadParamsBuffer) {
      offload_params = std::move(buffer);
    } else if (b.name == kOffloadStateBuffer) {
      offload_state = std::move(buffer);
    } else if (b.name == kOffloadGradShardBuffer) {
      offload_grad_shard = std::move(buffer);
    } else if (b.name == kOffloadParamShardBuffer) {
      offload_param_shard = std::move(buffer);
    } else if (b.name == kParamStageBuffer) {
      param_stage = std::move(buffer);
    } else if (b.name == kParamGatherInt8Buffer) {
      param_gather_int8 = std::move(buffer);
    } else if (b.name == kParamSecondaryBuffer) {
      param_secondary = std::move(buffer);
    } else if (b.name == kGradQuantBuffer) {
      grad_quant = std::move(buffer);
    } else {
      return absl::InternalError(absl::StrFormat(
          "engine: the plan lists buffer '%s' that the engine does not use", b.name));
    }
  }
  return absl::OkStatus();
}

ElementRange ShardBuffers::OwnedRange(int unit) const {
  if (!plan_.stage.optimizer_sharded) return {0, layout_.unit(unit).padded_numel};
  return layout_.ShardRange(unit, rank_);
}

ElementRange ShardBuffers::ParamsHeld(int unit) const {
  if (plan_.unit_resident[unit]) return {0, layout_.unit(unit).padded_numel};
  return layout_.ShardRange(unit, rank_);
}

void* ShardBuffers::ParamsAt(int unit, int64_t seg_index) const {
  // A sharded unit's params hold only this rank's shard.
  const int64_t element = plan_.unit_resident[unit] ? param_offset_[unit] + seg_index
                                                    : param_offset_[unit] + seg_index -
                                                          layout_.ShardRange(unit, rank_).begin;
  const DeviceBuffer& buffer = ParamsOnHost(unit) ? offload_param_shard : params;
  return At(buffer, element * static_cast<int64_t>(DTypeSize(param_dtype_)));
}

void* ShardBuffers::ParamStageData(int slot) const {
  return At(param_stage, slot * (plan_.gather_slot_numel / layout_.world_size()) *
                             static_cast<int64_t>(DTypeSize(param_dtype_)));
}

void* ShardBuffers::GatherInt8SlotData(int slot) const {
  return At(param_gather_int8, slot * plan_.gather_int8_slot_bytes);
}

void* ShardBuffers::SecondaryData(int unit) const {
  return At(param_secondary,
            plan_.secondary_offset[unit] * static_cast<int64_t>(DTypeSize(param_dtype_)));
}

char* ShardBuffers::GradQuantSlotData(int slot) const {
  return static_cast<char*>(At(grad_quant, slot * plan_.grad_quant_slot_bytes));
}

void* ShardBuffers::GradsAt(int unit, int64_t seg_index) const {
  // Trainable segments only: the gradient buffer holds no frozen one.
  const UnitSegment& seg = layout_.unit(unit);
  const int64_t element = plan_.stage.grads_sharded
                              ? seg.train_shard_offset + (seg_index - rank_ * seg.shard_numel)
                              : seg.train_offset + seg_index;
  return At(grads, element * static_cast<int64_t>(DTypeSize(grad_dtype_)));
}

int64_t ShardBuffers::OptimizerIndex(int unit, int64_t seg_index) const {
  const UnitSegment& seg = layout_.unit(unit);
  return !plan_.stage.optimizer_sharded
             ? seg.train_offset + seg_index
             : seg.train_shard_offset + (seg_index - rank_ * seg.shard_numel);
}

float* ShardBuffers::OptimizerAt(const DeviceBuffer& buf, int unit, int64_t seg_index) const {
  return reinterpret_cast<float*>(
      At(buf, OptimizerIndex(unit, seg_index) * static_cast<int64_t>(sizeof(float))));
}

void* ShardBuffers::StagingSlotData(int slot) const {
  return At(staging,
            slot * layout_.max_unit_numel() * static_cast<int64_t>(DTypeSize(grad_dtype_)));
}

void* ShardBuffers::TiedAccumData(int unit) const {
  return At(tied_accum, tied_offset_[unit] * static_cast<int64_t>(DTypeSize(grad_dtype_)));
}

void* ShardBuffers::GatherSlotData(int slot) const {
  return At(gather_pool,
            slot * plan_.gather_slot_numel * static_cast<int64_t>(DTypeSize(param_dtype_)));
}

}  // namespace zeroshard::internal
