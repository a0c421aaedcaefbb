// ShardBuffers: the engine's device buffers, exactly those BufferPlan lists,
// and where each unit's elements live in them.
//
//   params   param dtype: each unit's full segment (stages 0-2, stage 3's
//            persistent units) or this rank's shard of it (stage 3)
//   grads    stages 0-1: full flat buffer; stage 2: this rank's shard
//   master   mixed precision only: stage 0 full, stages 1-2 shard (fp32)
//   adam_m/v stage 0 full, stages 1-2 shard (fp32)
//   grad_staging  slots of max-unit size for micro-batch gradients
//   norm_blocks   the block sums of squares of the gradient norm
//   param_gather  stage 3: slots units are all-gathered into
//
// The "units" here are the layout's storage segments (flat_layout.h): the
// gradient, master and moment buffers hold the trainable ones only (their
// addressing functions must not be called for a frozen segment).
// "Segment coordinates" index a unit's padded segment; the optimizer of a
// rank covers its "owned range" of each unit: the whole segment in stage 0,
// its shard in stages 1-2. The addressing functions take segment
// coordinates and return element pointers (byte arithmetic on the typed
// buffers); they do no bounds checks.
#ifndef ZEROSHARD_RUNTIME_SHARD_BUFFERS_H_
#define ZEROSHARD_RUNTIME_SHARD_BUFFERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "zeroshard/device.h"

namespace zeroshard::internal {

class ShardBuffers {
 public:
  // `layout` and `plan` must outlive this object.
  ShardBuffers(const FlatLayout& layout, const BufferPlan& plan, int rank, DType param_dtype,
               DType grad_dtype);

  // Allocates exactly the plan's buffers, nothing else: the device tier's
  // on `device`, the host tier's on `host` (may be null without offload).
  // The NVMe tier's are swap files (offload_optimizer.h): not allocated
  // here. InternalError for a buffer the engine does not use.
  absl::Status Allocate(Device& device, Device* host = nullptr);

  // The part of unit `unit` this rank's optimizer updates (see above).
  ElementRange OwnedRange(int unit) const;
  // The params this rank holds of `unit`: its segment, or its shard (stage 3).
  ElementRange ParamsHeld(int unit) const;

  void* ParamsAt(int unit, int64_t seg_index) const;
  // seg_index in the part of the gradient this rank holds.
  void* GradsAt(int unit, int64_t seg_index) const;
  // seg_index in the owned range.
  float* MasterAt(int unit, int64_t seg_index) const {
    return OptimizerAt(master, unit, seg_index);
  }
  float* AdamMAt(int unit, int64_t seg_index) const { return OptimizerAt(adam_m, unit, seg_index); }
  float* AdamVAt(int unit, int64_t seg_index) const { return OptimizerAt(adam_v, unit, seg_index); }
  // Where segment element `seg_index` of the owned range of `unit` sits in
  // the optimizer's flat buffers (master, m, v): their element index.
  int64_t OptimizerIndex(int unit, int64_t seg_index) const;
  void* StagingSlotData(int slot) const;
  // A tied segment's micro-batch accumulator (kTiedGradBuffer).
  void* TiedAccumData(int unit) const;
  void* GatherSlotData(int slot) const;

  DeviceBuffer params, grads, master, adam_m, adam_v, staging, norm_blocks, gather_pool, tied_accum;
  // Optimizer offload: the host tier's streaming chunks.
  DeviceBuffer offload_grads, offload_params, offload_state, offload_grad_shard;
  // OffloadSpec::params host: the sharded units' shards, and the device
  // staging buffer (one shard per gather slot).
  DeviceBuffer offload_param_shard, param_stage;
  DeviceBuffer param_gather_int8;  // qwZ (kParamGatherInt8Buffer)
  DeviceBuffer param_secondary;    // hpZ (kParamSecondaryBuffer)
  DeviceBuffer grad_quant;         // qgZ (kGradQuantBuffer)
  // Whether `unit`'s params live on the host tier (a sharded unit with
  // OffloadSpec::params host): ParamsAt then points to host memory.
  bool ParamsOnHost(int unit) const { return params_on_host_ && !plan_.unit_resident[unit]; }
  // Whether `unit`'s params live in the NVMe tier's swap file (OffloadSpec::
  // params nvme): no memory holds them; read and write them through the
  // OffloadOptimizer (StateTensor::kParams, at OptimizerIndex).
  bool ParamsOnNvme(int unit) const { return params_on_nvme_ && !plan_.unit_resident[unit]; }
  bool ParamsOffDevice(int unit) const { return ParamsOnHost(unit) || ParamsOnNvme(unit); }
  // Stage slot `slot` of kParamStageBuffer.
  void* ParamStageData(int slot) const;
  // qwZ: slot `slot` of kParamGatherInt8Buffer (every rank's int8 pack).
  void* GatherInt8SlotData(int slot) const;
  // hpZ: sharded segment `unit`'s piece in kParamSecondaryBuffer.
  void* SecondaryData(int unit) const;
  // qgZ: scratch slot `slot` of kGradQuantBuffer.
  char* GradQuantSlotData(int slot) const;

 private:
  float* OptimizerAt(const DeviceBuffer& buf, int unit, int64_t seg_index) const;

  const FlatLayout& layout_;
  const BufferPlan& plan_;
  int rank_;
  DType param_dtype_;
  DType grad_dtype_;
  bool params_on_host_ = false;
  bool params_on_nvme_ = false;
  std::vector<int64_t> param_offset_;  // per unit: first element in params (or the host shard)
  std::vector<int64_t> tied_offset_;   // per unit: first element in tied_accum (tied ones)
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_SHARD_BUFFERS_H_
