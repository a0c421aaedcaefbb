// BufferPlan: the exact list of buffers one rank of an Engine allocates.
//
// Pure (sizes only, nothing allocated). Engine::Create allocates exactly
// these buffers and nothing else, through the same function, so a trainer
// (or the estimator) that asks PlanEngineBuffers before Create gets the
// ledger's bytes to the byte. Thread-safe: plain values and free functions.
#ifndef ZEROSHARD_BUFFER_PLAN_H_
#define ZEROSHARD_BUFFER_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "zeroshard/dtype.h"
#include "zeroshard/memory_category.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {

// What a ZeRO stage decides, named once: the planner and the engine ask
// these instead of comparing stage numbers.
struct StageDecisions {
  // Stages 1-3: the fp32 master and Adam moments hold only this rank's
  // shard, so the reduced gradient is needed only there (reduce-scatter, not
  // all-reduce) and the updated params are all-gathered after each step.
  bool optimizer_sharded = false;
  // Stages 2-3: the gradient buffer holds only the shard, so every
  // micro-batch's gradient is reduce-scattered as soon as it is written
  // (stages 0-1 sum a rank's micro-batches first and reduce once per step).
  bool grads_sharded = false;
  // Stage 3: params hold only the shard (but for persistent units); the
  // trainer's Gather all-gathers a unit into the gather pool.
  bool params_sharded = false;
};
// The decisions of ZeRO stage `zero_stage` (0-3).
StageDecisions DecideStage(int zero_stage);

// One allocation: its name (one of the k...Buffer names below), what it
// holds, its element type and count.
struct PlannedBuffer {
  std::string name;
  MemoryCategory category = MemoryCategory::kWorkspace;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
  // Where it lives (TrainSpec::offload): the device's ledger records the
  // kDevice buffers, the engine's host and NVMe ledgers the others
  // (Engine::tier_ledger).
  MemoryTier tier = MemoryTier::kDevice;

  int64_t bytes() const { return numel * static_cast<int64_t>(DTypeSize(dtype)); }
};

// Buffer names, shared by the planner and the engine.
inline constexpr char kParamsBuffer[] = "params";
inline constexpr char kGradsBuffer[] = "grads";
inline constexpr char kMasterBuffer[] = "master";
inline constexpr char kAdamMBuffer[] = "adam_m";
inline constexpr char kAdamVBuffer[] = "adam_v";
inline constexpr char kGradStagingBuffer[] = "grad_staging";
inline constexpr char kNormBlocksBuffer[] = "norm_blocks";
// Tied params' micro-batch gradients, the sum of their uses (stage 2, or
// with gradient accumulation): one padded segment per trainable tied param.
inline constexpr char kTiedGradBuffer[] = "tied_grad_accum";
// Stage 3 only: the pool units are all-gathered into, gather_slots buffers
// of the largest sharded unit.
inline constexpr char kParamGatherBuffer[] = "param_gather";
// Optimizer offload (host or NVMe tier), host memory: two chunks
// (OffloadSpec::chunk_numel, fewer elements when the rank's optimizer state
// is smaller) of the reduced gradient streamed from the device, and two of
// the params streamed back (the updated fp32 params themselves with fp32).
inline constexpr char kOffloadGradsBuffer[] = "offload_grads";
inline constexpr char kOffloadParamsBuffer[] = "offload_params";
// OffloadSpec::grads host: the host copy of the rank's reduced gradient
// shard (the optimizer state's elements, in the gradient dtype), in place of
// kOffloadGradsBuffer's two chunks.
inline constexpr char kOffloadGradShardBuffer[] = "offload_grad_shard";
// OffloadSpec::params host (stage 3): the rank's shards of the sharded
// units' params in host memory (kParamsBuffer then holds the persistent
// units only), and on the device one shard-sized staging buffer per gather
// slot that Gather copies a shard into before the all-gather.
// With OffloadSpec::params nvme the shards are a swap file laid out like
// the optimizer state (ShardBuffers::OptimizerIndex), in the param dtype.
inline constexpr char kOffloadParamShardBuffer[] = "offload_param_shard";
inline constexpr char kParamStageBuffer[] = "param_stage";
// Stage 3 with ZeRO++'s qwZ (TrainSpec::zeropp.quantized_weights): per
// gather slot, every rank's int8 pack of a shard of the largest sharded
// segment (kernels::QuantPackedBytes: int8 values and fp32 block scales),
// gathered there and dequantized into the slot.
inline constexpr char kParamGatherInt8Buffer[] = "param_gather_int8";
// Stage 3 with ZeRO++'s hpZ (TrainSpec::zeropp.secondary_partition_size
// S): per sharded segment, 1/S of its padded params (the piece of this
// rank's position in its group of S), in the param dtype.
inline constexpr char kParamSecondaryBuffer[] = "param_secondary";
// Stages 2-3 with ZeRO++'s qgZ (TrainSpec::zeropp.quantized_grad_bits):
// grad_quant_slots slots of grad_quant_slot_bytes, one per gradient
// reduce-scatter in flight: two regions of world_size packs
// (QgzPackBytes) of a shard of the largest segment, the packs a rank sends
// and those it receives.
inline constexpr char kGradQuantBuffer[] = "grad_quant";
// qwZ's pack of n elements (the planner's copy of the kernels' format,
// kernels/common/quant_int8.h, which the runtime checks it equals): n int8
// values padded to 8 bytes, then one fp32 scale per kQwzBlockElements,
// padded to 8 bytes.
inline constexpr int64_t kQwzBlockElements = 256;
constexpr int64_t QwzPackBytes(int64_t n) {
  return (n + 7) / 8 * 8 + ((n + kQwzBlockElements - 1) / kQwzBlockElements * 4 + 7) / 8 * 8;
}
// qgZ's pack of n elements with `bits` 8 or 4 (kernels/common/quant_int8.h,
// checked by the runtime): the values (one byte each, or two per byte)
// padded to 8 bytes, then the fp32 block scales padded to 8 bytes.
constexpr int64_t QgzPackBytes(int64_t n, int bits) {
  return ((bits == 4 ? (n + 1) / 2 : n) + 7) / 8 * 8 +
         ((n + kQwzBlockElements - 1) / kQwzBlockElements * 4 + 7) / 8 * 8;
}
// NVMe tier only, host memory: kOffloadStateSlots chunks of each swapped
// tensor (master with mixed precision, m, v, the params with OffloadSpec::
// params nvme): the one being updated, the next two being read and the
// previous one being written.
inline constexpr char kOffloadStateBuffer[] = "offload_state";
inline constexpr int kOffloadStateSlots = 4;

struct BufferPlan {
  int zero_stage = 0;
  StageDecisions stage;  // DecideStage(zero_stage)
  int world_size = 1;
  // Number of staging slots inside kGradStagingBuffer, each max_unit_numel long.
  int grad_staging_slots = 0;
  // Stage 3: buffers in kParamGatherBuffer, each gather_slot_numel
  // elements: held_slots for the units the trainer holds at once
  // (TrainSpec::max_gathered_units times the most sharded segments one unit
  // reads: its own and tied ones), plus the prefetch depth, never more than
  // the sharded segments, fewer under max_live_gather_bytes (which must
  // leave held_slots). The engine prefetches into gather_slots - held_slots.
  int gather_slots = 0;
  int held_slots = 0;
  int max_gathered_units = 1;  // TrainSpec::max_gathered_units
  int64_t gather_slot_numel = 0;
  // qwZ: the gathers carry int8 packs (kParamGatherInt8Buffer), each slot
  // gather_int8_slot_bytes of them.
  bool quantized_weights = false;
  int64_t gather_int8_slot_bytes = 0;
  // hpZ: the group size (0: off) and each sharded segment's offset into
  // kParamSecondaryBuffer, in elements (-1 for a resident segment).
  int secondary_partition_size = 0;
  std::vector<int64_t> secondary_offset;
  // qgZ: the bits (0: off) and the scratch slots of kGradQuantBuffer.
  int quantized_grad_bits = 0;
  int grad_quant_slots = 0;
  int64_t grad_quant_slot_bytes = 0;
  // Optimizer offload: elements per streamed chunk (0 without offload), and
  // the state tensors swapped to NVMe per chunk (0, 2 or 3).
  int64_t offload_chunk_numel = 0;
  int offload_state_tensors = 0;
  // Per storage segment (a unit's trainable params, its frozen ones, a tied
  // param; one per unit for a model without frozen or tied params): its
  // params are fully resident (stages 0-2 always; stage 3 only segments of
  // at most persistent_unit_numel elements). Non-resident segments keep
  // only this rank's shard.
  std::vector<bool> unit_resident;
  std::vector<PlannedBuffer> buffers;

  // nullptr when the plan has no buffer of that name.
  const PlannedBuffer* Find(const std::string& name) const;
  // Sums over the buffers of one tier (the device by default: what the
  // device's ledger records).
  int64_t BytesIn(MemoryCategory category, MemoryTier tier = MemoryTier::kDevice) const;
  int64_t model_state_bytes(MemoryTier tier = MemoryTier::kDevice) const;
  int64_t total_bytes(MemoryTier tier = MemoryTier::kDevice) const;
};

// What each rank of `world_size` ranks allocates when Engine::Create runs
// with `model` and `train` (every rank allocates the same sizes). Frozen
// params (ParamSpec::trainable false) have params only; a tied param is
// stored once. Stage 0: all full. Stage 1: fp32 master and Adam moments sharded. Stage 2:
// gradients sharded too. Stage 3: params sharded too (but for persistent
// units), plus the gather pool: 1 + prefetch_units buffers of the largest
// sharded unit, at most one per sharded unit. Every count is checked.
// InvalidArgument for an invalid ModelSpec or TrainSpec (naming the field),
// a world size outside [1, 2^20], a gather cap below one unit, or a size
// past 2^63 bytes.
absl::StatusOr<BufferPlan> PlanEngineBuffers(const ModelSpec& model, const TrainSpec& train,
                                             int world_size);

}  // namespace zeroshard

#endif  // ZEROSHARD_BUFFER_PLAN_H_
