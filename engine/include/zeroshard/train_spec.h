// TrainSpec: how the model is trained (precision, optimizer, schedule,
// accumulation, ZeRO stage). Every rank must pass the same TrainSpec; the
// engine checks that at Start().
#ifndef ZEROSHARD_TRAIN_SPEC_H_
#define ZEROSHARD_TRAIN_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/dtype.h"
#include "zeroshard/memory_category.h"

namespace zeroshard {

enum class Precision {
  kFp32,       // fp32 params, grads and optimizer state; the params are the master copy
  kBf16Mixed,  // bf16 params (and grads by default), fp32 master weights and moments
  kFp16Mixed,  // fp16 params (and grads by default), fp32 master and moments, dynamic
               // loss scaling
};
const char* PrecisionName(Precision precision);  // "fp32", "bf16", "fp16"
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);

enum class OptimizerKind {
  kAdamW,   // decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr*wd
  kAdamL2,  // classic Adam with L2: g += wd*p before the moments
};

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;  // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // not applied to params marked no_decay
};

struct LrSchedule {
  enum class Kind { kConstant, kWarmupCosine };
  Kind kind = Kind::kConstant;
  // kWarmupCosine: linear from 0 to lr over warmup_steps, then cosine decay
  // to min_lr_ratio*lr at total_steps, flat afterwards.
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr_ratio = 0.0;

  // Learning rate for 1-based optimizer step `step`.
  double LrAt(int64_t step, double peak_lr) const;
};

// Dynamic loss scaling (fp16 only). The trainer multiplies its loss by
// Engine::loss_scale(); the engine unscales. A step whose gradients hold an
// inf or NaN on any rank is skipped on every rank; then, once `hysteresis`
// such steps have accumulated since the last change, the scale is multiplied
// by backoff_factor (never below min_scale). After growth_interval clean
// steps in a row the scale is multiplied by growth_factor.
struct LossScaleSpec {
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;
  int hysteresis = 2;
  double min_scale = 1.0;
  // Step() fails after this many skipped steps in a row at min_scale: the
  // gradients are non-finite whatever the scale (diverged model, bad data).
  int max_skips_at_min_scale = 20;
};

// Where the optimizer state lives (docs/offload.md). kDevice: beside the
// params, updated by the device's fused AdamW. kHost (ZeRO-Offload): the fp32
// master and the Adam moments in host memory, updated by the SIMD CPU AdamW;
// at each Step the reduced gradient shard is streamed to the host and the
// updated params back, chunk by chunk, the copies of one chunk overlapping
// the update of the next. kNvme (ZeRO-Infinity): the same, with the master
// and the moments in swap files under `dir`, read and written in aligned
// chunks while the host updates the chunk before. The results are the same
// bits in every tier.
struct OffloadSpec {
  MemoryTier optimizer = MemoryTier::kDevice;
  // kHost (with the optimizer state off the device): each unit's reduced
  // gradient shard is copied to a host copy of the rank's gradient shard as
  // soon as it is final, during the backward, on a side stream; the update
  // reads it there. The device keeps its gradient buffer (the reductions'
  // target); the host holds the shard in the gradient dtype instead of two
  // streaming chunks. kDevice: the gradients stream with the update.
  MemoryTier grads = MemoryTier::kDevice;
  // Stage 3, with the optimizer state off the device: kHost keeps the
  // rank's shard of every sharded unit's params in host memory (ZeRO-Infinity
  // to CPU). Gather copies the shard to a device staging buffer and
  // all-gathers from there; the update writes the host shard. Persistent
  // units stay on the device. kNvme (with the optimizer state on NVMe,
  // persistent_unit_numel 0 and no frozen params): the shards in a swap file
  // beside the state, read on each Gather and streamed with the update.
  // kDevice: the shards on the device.
  MemoryTier params = MemoryTier::kDevice;
  // The swap directory of MemoryTier::kNvme (one set of files per rank,
  // created at Engine::Create and removed when the engine is destroyed).
  std::string dir;
  // Elements per streamed chunk: a multiple of 1024 (4 KiB of fp32, the
  // direct-I/O alignment) in [1024, 2^30]. The host holds two chunks of
  // gradients and params (and, on NVMe, four of each state tensor).
  int64_t chunk_numel = int64_t{1} << 20;

  bool enabled() const { return optimizer != MemoryTier::kDevice; }
};

// ZeRO++ (Wang et al. 2023, arXiv 2306.10209): fewer bytes across nodes for
// the same training, at some cost in numerics; docs/multinode.md, "ZeRO++".
// Off by default: the exact path stays the default and stays bitwise.
struct ZeroPlusPlusSpec {
  // qwZ, stage 3 only: each unit's all-gather carries int8 values with one
  // fp32 scale per block of 256 (kernels/common/quant_int8.h) instead of
  // the param dtype, dequantized on receipt. The forward and backward then
  // compute with the dequantized params (error at most half a block's
  // scale, largest magnitude / 254); the fp32 master, the optimizer and the
  // checkpoints are untouched.
  bool quantized_weights = false;
  // hpZ, stage 3 only: 0 (off), or the ranks that share a secondary copy of
  // the params, normally the ranks of one node. Each rank keeps, besides
  // its shard, 1/size of every sharded unit as the unit's first gather of a
  // step delivered it; the step's later gathers of that unit (the backward,
  // a recompute) all-gather those pieces within the group of `size`
  // consecutive ranks instead of across the world. It must divide the world
  // size (PlanEngineBuffers and Engine::Create check), and each group must
  // lie on one node (Engine::Start checks it against node_layout). Bitwise
  // the same training; costs the secondary copy's memory (param_secondary).
  int secondary_partition_size = 0;
  // qgZ, stages 2-3: 0 (off), 8 or 4. Each gradient reduce-scatter moves
  // blockwise int8 or int4 packs (one fp32 scale per block of 256, largest
  // magnitude / 127 or / 7) through a hierarchical all-to-all: within the
  // node first, then one pack per other node across nodes; every sum is
  // taken in fp32 after dequantization and the result rounded once to the
  // grad dtype (engine/src/runtime/quantized_reduce_scatter.h). The
  // optimizer steps on that gradient: a rank's contribution to an element
  // errs by up to half its block's scale at each of the two levels. Needs a
  // communicator with Send and Recv in host memory (local or mpi); costs
  // the scratch kGradQuantBuffer.
  int quantized_grad_bits = 0;

  bool any() const {
    return quantized_weights || secondary_partition_size > 0 || quantized_grad_bits != 0;
  }
};

struct TrainSpec {
  // 0: everything replicated, grads all-reduced.
  // 1: fp32 master and optimizer state sharded, updated params all-gathered.
  // 2: gradients sharded too (reduce-scattered per unit as they are ready).
  // 3: params sharded too; Gather(u) all-gathers a unit into a buffer of a
  //    fixed pool, Release(u) returns it.
  int zero_stage = 0;
  Precision precision = Precision::kFp32;
  // Dtype of gradients and their reduction. Defaults to the param dtype;
  // with 16-bit mixed precision it may be set to kFloat32 (fp32 reduction
  // and accumulation, twice the gradient bytes).
  std::optional<DType> grad_dtype;
  OptimizerSpec optimizer;
  LrSchedule schedule;
  // Global-norm clipping threshold; 0 disables clipping. The norm is that of
  // the averaged gradient, measured before clipping.
  double max_grad_norm = 0.0;
  // Micro-batches per rank per optimizer step.
  int grad_accum_steps = 1;
  // Gradient staging buffers (each the size of the largest unit) that let
  // reductions of one unit overlap the trainer's backward of the next.
  int num_grad_buffers = 2;

  // Stage 3. Units the trainer may hold gathered at once (between Gather
  // and Release). The gather pool holds the storage segments of that many
  // units (a unit with a tied param reads two: its own and the tied one's,
  // so 1 serves a tied embedding and head) plus the prefetched ones (which
  // serve a recompute pass: its repeated gathers are prefetched like any
  // other). Raise it for a trainer that keeps units gathered together
  // (e.g. the embedding through the whole forward).
  int max_gathered_units = 1;
  // Stage 3. Units gathered ahead of use, in the order recorded on the first
  // step (0 = on demand only). Later steps must gather in that order (a
  // recompute pass's repeated gathers included); one that does not fails
  // with an error naming the gather.
  int prefetch_units = 1;
  // Cap on the gather pool (bytes); 0 = no cap: (1 + prefetch_units) units.
  // A cap below (1 + prefetch_units) units lowers the prefetch depth; one
  // below a single unit is an error.
  int64_t max_live_gather_bytes = 0;
  // Units of at most this many elements stay replicated in stage 3 (like
  // norms and biases): gathering them would cost more than keeping them.
  int64_t persistent_unit_numel = 0;

  LossScaleSpec loss_scale;

  // Where the optimizer state lives (OffloadSpec). Stages 0-3, every
  // precision; a checkpoint moves between tiers.
  OffloadSpec offload;

  // ZeRO++ options (off by default).
  ZeroPlusPlusSpec zeropp;

  // Compare a hash of every rank's collectives at each Step() and fail with
  // an error naming the ranks that diverged (it rides on the norm's
  // all-gather; perf/runtime/sequence_check_bench measures its cost).
  bool check_collective_sequence = true;

  DType param_dtype() const;
  DType effective_grad_dtype() const;
  // Range checks with the field named in the error.
  absl::Status Validate() const;
};

}  // namespace zeroshard

#endif  // ZEROSHARD_TRAIN_SPEC_H_
