#include "engine/src/plan/buffer_plan.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

absl::Status TooLarge(const char* buffer, const char* field, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrFormat("train spec: buffer '%s' with %s %d has more than 2^63 elements; lower %s",
                      buffer, field, value, field));
}

}  // namespace

StageDecisions DecideStage(int zero_stage) {
  StageDecisions d;
  d.optimizer_sharded = zero_stage >= 1;
  d.grads_sharded = zero_stage >= 2;
  d.params_sharded = zero_stage >= 3;
  return d;
}

const PlannedBuffer* BufferPlan::Find(const std::string& name) const {
  for (const PlannedBuffer& b : buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

int64_t BufferPlan::BytesIn(MemoryCategory category, MemoryTier tier) const {
  int64_t total = 0;
  for (const PlannedBuffer& b : buffers) {
    if (b.category == category && b.tier == tier) total += b.bytes();
  }
  return total;
}

int64_t BufferPlan::model_state_bytes(MemoryTier tier) const {
  int64_t total = 0;
  for (const PlannedBuffer& b : buffers) {
    if (IsModelState(b.category) && b.tier == tier) total += b.bytes();
  }
  return total;
}

int64_t BufferPlan::total_bytes(MemoryTier tier) const {
  int64_t total = 0;
  for (const PlannedBuffer& b : buffers) {
    if (b.tier == tier) total += b.bytes();
  }
  return total;
}

namespace internal {

absl::StatusOr<BufferPlan> PlanBuffers(const FlatLayout& layout, const TrainSpec& train) {
  ZS_RETURN_IF_ERROR(train.Validate());
  BufferPlan plan;
  plan.zero_stage = train.zero_stage;
  plan.stage = DecideStage(train.zero_stage);
  const StageDecisions& stage = plan.stage;
  plan.world_size = layout.world_size();
  plan.max_gathered_units = train.max_gathered_units;
  // Gradients, master and moments exist for the trainable segments only.
  const int64_t full = layout.train_total_numel();
  const int64_t shard = layout.train_shard_numel();
  const bool mixed = train.precision != Precision::kFp32;
  const DType grad_dtype = train.effective_grad_dtype();
  // Stage 0 keeps optimizer state for every element; stages 1-3 only for the
  // rank's own shard.
  const int64_t optimizer_numel = stage.optimizer_sharded ? shard : full;

  // Params: every segment full, except stage 3's sharded ones. At most the
  // full flat buffer, so the sum cannot overflow.
  int64_t params_numel = 0;
  int64_t sharded_numel = 0;  // the sharded segments' shards (in params_numel)
  int64_t sharded_units = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitSegment& seg = layout.unit(u);
    const bool resident = !stage.params_sharded || seg.used_numel <= train.persistent_unit_numel;
    plan.unit_resident.push_back(resident);
    params_numel += resident ? seg.padded_numel : seg.shard_numel;
    if (!resident) {
      sharded_numel += seg.shard_numel;
      ++sharded_units;
      plan.gather_slot_numel = std::max(plan.gather_slot_numel, seg.padded_numel);
    }
  }
  // The most sharded segments one spec unit reads (its own and tied ones).
  int64_t segments_per_unit = 1;
  for (int u = 0; u < layout.num_spec_units(); ++u) {
    int64_t sharded = 0;
    for (int s : layout.SegmentsOf(u)) sharded += plan.unit_resident[s] ? 0 : 1;
    segments_per_unit = std::max(segments_per_unit, sharded);
  }
  // OffloadSpec::params host: the sharded segments' shards on the host;
  // nvme: in a swap file (listed after the optimizer state below).
  const bool params_on_host = train.offload.params == MemoryTier::kHost;
  const bool params_on_nvme = train.offload.params == MemoryTier::kNvme;
  if (params_on_nvme && full != layout.total_numel()) {
    return absl::InvalidArgumentError(
        "train spec: offload.params nvme keeps the trainable params' shards in the optimizer "
        "state's swap files; this model has frozen params: use offload.params host");
  }
  plan.buffers.push_back(
      {kParamsBuffer, MemoryCategory::kParams, train.param_dtype(),
       params_on_host || params_on_nvme ? params_numel - sharded_numel : params_numel});
  if (params_on_host) {
    plan.buffers.push_back({kOffloadParamShardBuffer, MemoryCategory::kParams, train.param_dtype(),
                            sharded_numel, MemoryTier::kHost});
  }
  plan.buffers.push_back(
      {kGradsBuffer, MemoryCategory::kGradients, grad_dtype, stage.grads_sharded ? shard : full});
  // The optimizer state lives on its tier (TrainSpec::offload).
  const MemoryTier state_tier = train.offload.optimizer;
  if (mixed) {
    plan.buffers.push_back({kMasterBuffer, MemoryCategory::kMasterParams, DType::kFloat32,
                            optimizer_numel, state_tier});
  }
  plan.buffers.push_back({kAdamMBuffer, MemoryCategory::kOptimizerState, DType::kFloat32,
                          optimizer_numel, state_tier});
  plan.buffers.push_back({kAdamVBuffer, MemoryCategory::kOptimizerState, DType::kFloat32,
                          optimizer_numel, state_tier});
  if (params_on_nvme) {
    // The shards in the state's layout (every unit sharded: the trainable
    // shard is the optimizer's).
    plan.buffers.push_back({kOffloadParamShardBuffer, MemoryCategory::kParams, train.param_dtype(),
                            optimizer_numel, MemoryTier::kNvme});
  }
  if (train.offload.enabled() && optimizer_numel > 0) {
    // Streamed in chunks of at most chunk_numel (a multiple of 1024, the
    // 4 KiB direct-I/O alignment of fp32; of 2048 with 16-bit params in a
    // swap file), fewer for a small shard.
    const int64_t quantum = params_on_nvme && DTypeSize(train.param_dtype()) == 2 ? 2048 : 1024;
    const int64_t rounded = (optimizer_numel + quantum - 1) / quantum * quantum;
    plan.offload_chunk_numel =
        std::min((train.offload.chunk_numel + quantum - 1) / quantum * quantum, rounded);
    const int64_t two = 2 * plan.offload_chunk_numel;  // below 2^31
    if (train.offload.grads == MemoryTier::kHost) {
      plan.buffers.push_back({kOffloadGradShardBuffer, MemoryCategory::kGradients, grad_dtype,
                              optimizer_numel, MemoryTier::kHost});
    } else {
      plan.buffers.push_back(
          {kOffloadGradsBuffer, MemoryCategory::kCommBuffers, grad_dtype, two, MemoryTier::kHost});
    }
    if (!params_on_nvme) {  // else the params stream with the state
      plan.buffers.push_back({kOffloadParamsBuffer, MemoryCategory::kCommBuffers,
                              train.param_dtype(), two, MemoryTier::kHost});
    }
    if (state_tier == MemoryTier::kNvme) {
      plan.offload_state_tensors = (mixed ? 3 : 2) + (params_on_nvme ? 1 : 0);
      plan.buffers.push_back(
          {kOffloadStateBuffer, MemoryCategory::kCommBuffers, DType::kFloat32,
           int64_t{kOffloadStateSlots} * plan.offload_state_tensors * plan.offload_chunk_numel,
           MemoryTier::kHost});
    }
  }

  // Stages 0-1 write the first micro-batch's gradient straight into the full
  // gradient buffer, so they stage only when accumulating. Stage 2 stages
  // every unit: its gradient buffer holds only the shard.
  // A tied param's later uses are staged too, and added to the first's.
  int64_t tied_numel = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    if (layout.UsersOf(u).size() > 1) tied_numel += layout.unit(u).padded_numel;
  }
  if (stage.grads_sharded || train.grad_accum_steps > 1 || tied_numel > 0) {
    plan.grad_staging_slots = train.num_grad_buffers;
    const std::optional<int64_t> staging =
        CheckedMul(plan.grad_staging_slots, layout.max_unit_numel());
    if (!staging.has_value()) {
      return TooLarge(kGradStagingBuffer, "num_grad_buffers", train.num_grad_buffers);
    }
    plan.buffers.push_back(
        {kGradStagingBuffer, MemoryCategory::kCommBuffers, grad_dtype, *staging});
  }
  // Stages 0-1 sum a tied param's first micro-batch in the gradient buffer
  // itself; later ones, and every one at stage 2, in its accumulator.
  if (tied_numel > 0 && (stage.grads_sharded || train.grad_accum_steps > 1)) {
    plan.buffers.push_back({kTiedGradBuffer, MemoryCategory::kCommBuffers, grad_dtype, tied_numel});
  }
  if (plan.gather_slot_numel > 0) {
    // Below 2^60: a layout's padded unit is below 2^57 elements.
    const int64_t slot_bytes =
        plan.gather_slot_numel * static_cast<int64_t>(DTypeSize(train.param_dtype()));
    // The segments of the units the trainer may hold at once, plus the
    // prefetched ones, but never more buffers than there are segments to
    // gather: a segment sits in at most one buffer.
    plan.held_slots = static_cast<int>(
        std::min<int64_t>(int64_t{train.max_gathered_units} * segments_per_unit, sharded_units));
    int64_t slots =
        std::min<int64_t>(int64_t{plan.held_slots} + train.prefetch_units, sharded_units);
    if (train.max_live_gather_bytes > 0) {
      if (train.max_live_gather_bytes < slot_bytes * plan.held_slots) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "train spec: max_live_gather_bytes %d is below the gather buffers of the units held "
            "at once (%d buffers of %d bytes: max_gathered_units %d, up to %d sharded segments "
            "each, the largest sharded segment); raise it, lower max_gathered_units or make "
            "units persistent",
            train.max_live_gather_bytes, plan.held_slots, slot_bytes, train.max_gathered_units,
            segments_per_unit));
      }
      slots = std::min(slots, train.max_live_gather_bytes / slot_bytes);
    }
    plan.gather_slots = static_cast<int>(slots);
    const std::optional<int64_t> pool = CheckedMul(slots, plan.gather_slot_numel);
    if (!pool.has_value())
      return TooLarge(kParamGatherBuffer, "prefetch_units", train.prefetch_units);
    plan.buffers.push_back(
        {kParamGatherBuffer, MemoryCategory::kCommBuffers, train.param_dtype(), *pool});
    if (const int size = train.zeropp.secondary_partition_size; size > 0) {
      if (layout.world_size() % size != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "train spec: zeropp.secondary_partition_size %d does not divide the world size %d; "
            "give the ranks per node (hpZ's groups are whole nodes)",
            size, layout.world_size()));
      }
      plan.secondary_partition_size = size;
      plan.secondary_offset.assign(layout.num_units(), -1);
      int64_t secondary = 0;
      for (int u = 0; u < layout.num_units(); ++u) {
        if (plan.unit_resident[u]) continue;
        plan.secondary_offset[u] = secondary;
        secondary += layout.unit(u).padded_numel / size;
      }
      plan.buffers.push_back(
          {kParamSecondaryBuffer, MemoryCategory::kParams, train.param_dtype(), secondary});
    }
    if (train.zeropp.quantized_weights) {
      // Every rank's pack of a shard of the largest sharded segment, per
      // slot: below 2 bytes per element, so below the pool's own bytes.
      plan.quantized_weights = true;
      plan.gather_int8_slot_bytes =
          layout.world_size() * QwzPackBytes(plan.gather_slot_numel / layout.world_size());
      plan.buffers.push_back({kParamGatherInt8Buffer, MemoryCategory::kCommBuffers, DType::kUInt8,
                              slots * plan.gather_int8_slot_bytes});
    }
    if (params_on_host || params_on_nvme) {
      // One shard of the largest sharded segment per gather slot: at most
      // the pool's size.
      plan.buffers.push_back({kParamStageBuffer, MemoryCategory::kCommBuffers, train.param_dtype(),
                              slots * (plan.gather_slot_numel / layout.world_size())});
    }
  }
  if (const int bits = train.zeropp.quantized_grad_bits; bits != 0) {
    // qgZ: one scratch slot per gradient reduce-scatter in flight, as many
    // as staging slots (the reducer retires the oldest when all are busy).
    // Validate() allowed it at stages 2-3 only, which always stage.
    plan.quantized_grad_bits = bits;
    plan.grad_quant_slots = std::max(1, plan.grad_staging_slots);
    const int64_t shard_numel = layout.max_unit_numel() / layout.world_size();
    plan.grad_quant_slot_bytes = 2 * int64_t{layout.world_size()} * QgzPackBytes(shard_numel, bits);
    plan.buffers.push_back({kGradQuantBuffer, MemoryCategory::kCommBuffers, DType::kUInt8,
                            plan.grad_quant_slots * plan.grad_quant_slot_bytes});
  }
  // One double per norm block of the rank's shard. The gradient norm sums
  // blocks of kNormBlockElements (the runtime checks that the kernels use
  // the same size); a shard is a whole number of blocks.
  const int64_t norm_blocks =
      shard / kNormBlockElements + (shard % kNormBlockElements != 0 ? 1 : 0);
  plan.buffers.push_back(
      {kNormBlocksBuffer, MemoryCategory::kWorkspace, DType::kFloat64, norm_blocks});
  // Every buffer's bytes and their sum fit in int64_t, so bytes(), BytesIn()
  // and total_bytes() need no checks of their own.
  CheckedInt64 total_bytes = 0;
  for (const PlannedBuffer& b : plan.buffers) {
    total_bytes += CheckedInt64(b.numel) * static_cast<int64_t>(DTypeSize(b.dtype));
    if (!total_bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "buffer plan: the bytes of buffer '%s' (%d elements of %s) bring the rank's total past "
          "2^63; make the model smaller or shard it over more ranks",
          b.name, b.numel, DTypeName(b.dtype)));
    }
  }
  return plan;
}

}  // namespace internal

absl::StatusOr<BufferPlan> PlanEngineBuffers(const ModelSpec& model, const TrainSpec& train,
                                             int world_size) {
  ZS_ASSIGN_OR_RETURN(internal::FlatLayout layout, internal::FlatLayout::Create(model, world_size));
  return internal::PlanBuffers(layout, train);
}

}  // namespace zeroshard
