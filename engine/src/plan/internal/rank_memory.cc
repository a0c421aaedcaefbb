#include "engine/src/plan/internal/rank_memory.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/common/tp_split.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/activations.h"
#include "engine/src/plan/buffer_plan.h"
#include "zeroshard/estimate/byte_units.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {

// The unit as one of tp ranks holds it: each param's tp_split_dim divided
// by tp, rounded up (TpShardUnit, as ShardModelSpec splits, but padding
// where ShardModelSpec needs tp to divide the dimension).
UnitSpec SliceUnit(const UnitSpec& unit, int tp) {
  // Cannot fail: kRoundUp never refuses.
  return TpShardUnit(unit, tp, TpRemainder::kRoundUp).value_or(unit);
}

// The elements of the first `count` params of `unit` sliced as SliceUnit
// slices them, without copying the unit: the stored ones (a tied param is
// its owner's storage), or with `trainable_only` only the trainable ones.
// Each is at most the unsliced count, which the validated spec bounds.
std::vector<int64_t> SlicedNumels(const UnitSpec& unit, int tp, size_t count, bool trainable_only) {
  std::vector<int64_t> numels;
  numels.reserve(count);
  for (size_t p = 0; p < count; ++p) {
    const ParamSpec& param = unit.params[p];
    if (param.tied_to.has_value() || (trainable_only && !param.trainable)) continue;
    int64_t n = 1;
    if (tp == 1 || param.tp_split_dim < 0) {
      for (int64_t d : param.shape) n *= d;
    } else {
      for (int64_t d :
           TpShardShape(param, tp, TpRemainder::kRoundUp, unit.name).value_or(param.shape)) {
        n *= d;
      }
    }
    numels.push_back(n);
  }
  return numels;
}

// Range of layer units that pipeline stage `i` of `pp` owns.
std::pair<int, int> StageLayers(int num_layers, int pp, int i) {
  return {static_cast<int>(static_cast<int64_t>(num_layers) * i / pp),
          static_cast<int>(static_cast<int64_t>(num_layers) * (i + 1) / pp)};
}

absl::Status ActivationOverflow(int stage, const PlanOptions& options) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "activations of pipeline stage %d pass 2^63 bytes (--seq %d, --micro-batch %d); lower "
      "--seq or --micro-batch",
      stage, options.seq, options.micro_batch));
}

// Activation bytes one rank of pipeline stage `i` keeps at its peak. With
// the 1F1B schedule stage i has min(pp - i, m) micro-batches in flight
// (Narayanan et al. 2021; Korthikanti et al. 2022, Section 4.3).
absl::StatusOr<int64_t> StageActivationBytes(const ModelDescription& model,
                                             const PlanOptions& options, const Candidate& c, int i,
                                             int64_t layers) {
  const int64_t in_flight = std::min<int64_t>(c.pp - i, c.micro_batches);
  if (!model.transformer.has_value()) {
    // Custom specs have no layer units and so run with pp = 1: every unit's
    // activations are on the one stage.
    CheckedInt64 per_sample = 0;
    for (int64_t bytes : model.activation_bytes_per_sample) per_sample += bytes;
    const std::optional<int64_t> bytes = (per_sample * options.micro_batch * in_flight).value();
    if (!bytes.has_value()) return ActivationOverflow(i, options);
    return *bytes;
  }
  const TransformerShape& t = *model.transformer;
  ActivationShape shape;
  shape.seq = options.seq;
  shape.micro_batch = options.micro_batch;
  shape.tp = c.tp;
  shape.sequence_parallel = options.sequence_parallel && c.tp > 1;
  shape.recompute = options.recompute;
  shape.activation_bytes = options.precision == Precision::kFp32 ? 4 : 2;
  ZS_ASSIGN_OR_RETURN(const int64_t per_layer, LayerActivationBytes(t, shape));
  CheckedInt64 bytes = CheckedInt64(layers) * per_layer * in_flight;
  if (layers > 0) {
    ZS_ASSIGN_OR_RETURN(const int64_t working, RecomputeWorkingBytes(t, shape));
    bytes += working;
  }
  if (i == 0) {
    ZS_ASSIGN_OR_RETURN(const int64_t embedding, EmbeddingActivationBytes(t, shape));
    bytes += CheckedInt64(embedding) * in_flight;
  }
  if (i == c.pp - 1) {
    ZS_ASSIGN_OR_RETURN(const int64_t output, OutputActivationBytes(t, shape));
    bytes += output;
  }
  if (!bytes.ok()) return ActivationOverflow(i, options);
  return *bytes.value();
}

int64_t& FieldOf(MemoryBreakdown& m, MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParams:
      return m.params;
    case MemoryCategory::kGradients:
      return m.grads;
    case MemoryCategory::kMasterParams:
      return m.master;
    case MemoryCategory::kOptimizerState:
      return m.optimizer;
    case MemoryCategory::kCommBuffers:
      return m.buffers;
    case MemoryCategory::kActivations:
      return m.activations;
    case MemoryCategory::kWorkspace:
    case MemoryCategory::kCount:
      break;
  }
  return m.workspace;
}

// Adds `bytes` to the field of `category`; false on overflow.
bool AddTo(MemoryBreakdown& m, MemoryCategory category, int64_t bytes) {
  int64_t& field = FieldOf(m, category);
  const std::optional<int64_t> sum = CheckedAdd(field, bytes);
  if (!sum.has_value()) return false;
  field = *sum;
  return true;
}

// The buffers of one rank: PlanBuffers (exactly what the engine allocates),
// with the gradient-side buffers (gradient, staging, norm blocks, fp32
// master, Adam moments) taken from PlanBuffers over the trainable segments
// alone (a frozen param has none of them), then the analytic changes for
// offload. With nothing frozen the two layouts are the same.
absl::StatusOr<std::vector<PlacedBuffer>> RankBuffers(const SplitLayout::Stage& stage,
                                                      const PlanOptions& options,
                                                      const Candidate& c) {
  const FlatLayout& layout = stage.layout;
  const TrainSpec train = Planner::EngineTrainSpec(options, c.stage, c.micro_batches);
  ZS_ASSIGN_OR_RETURN(BufferPlan engine_plan, PlanBuffers(layout, train));
  std::optional<BufferPlan> trainable_plan;
  if (stage.trainable.has_value()) {
    ZS_ASSIGN_OR_RETURN(trainable_plan, PlanBuffers(*stage.trainable, train));
  }
  std::vector<PlacedBuffer> out;
  for (PlannedBuffer& b : engine_plan.buffers) {
    // Every buffer of the gradient side: the gradient, its staging slots,
    // the norm's blocks over the gradient shard, and the optimizer state.
    if (b.name == kGradsBuffer || b.name == kGradStagingBuffer || b.name == kNormBlocksBuffer ||
        b.name == kMasterBuffer || b.name == kAdamMBuffer || b.name == kAdamVBuffer) {
      const PlannedBuffer* trainable_b =
          trainable_plan.has_value() ? trainable_plan->Find(b.name) : nullptr;
      b.numel = trainable_b != nullptr ? trainable_b->numel : 0;
    }
    out.push_back({std::move(b), Placement::kDevice});
  }
  if (c.offload != Offload::kNone) {
    // ZeRO-Offload: the fp32 states and the optimizer step move to the host;
    // a sharded gradient is copied there for the CPU Adam. Below 2^57
    // elements (a layout's limit), so the byte counts fit.
    const FlatLayout* trainable = stage.trainable.has_value() ? &*stage.trainable : nullptr;
    const int64_t shard = trainable == nullptr ? 0
                          : c.stage == 0       ? trainable->total_numel()
                                               : trainable->shard_numel();
    bool has_master = false;
    for (PlacedBuffer& p : out) {
      const std::string& n = p.buffer.name;
      if (n == kMasterBuffer || n == kAdamMBuffer || n == kAdamVBuffer || n == kNormBlocksBuffer ||
          (n == kGradsBuffer && c.stage >= 2)) {
        p.placement = Placement::kHost;
      }
      if (n == kParamsBuffer && c.offload == Offload::kOptimizerAndParams) {
        p.placement = Placement::kHost;
      }
      has_master = has_master || n == kMasterBuffer;
    }
    if (!has_master) {
      // fp32: the device params are the working copy; the host Adam needs
      // its own fp32 copy of the shard.
      out.push_back({{kMasterBuffer, MemoryCategory::kMasterParams, DType::kFloat32, shard},
                     Placement::kHost});
    }
    if (c.stage < 2) {
      // The device gradient is whole (stage 1); the CPU Adam reads the
      // rank's reduced shard from a host buffer of its own.
      out.push_back(
          {{kHostGradShardBuffer, MemoryCategory::kGradients, train.effective_grad_dtype(), shard},
           Placement::kHost});
    }
  }
  return out;
}

}  // namespace

StageUnits UnitsOfStage(const ModelDescription& model, int pp, int pp_stage) {
  StageUnits out;
  const int num_units = static_cast<int>(model.spec.units.size());
  const int first = model.first_layer_unit;
  const int end_layers = first + model.num_layer_units;
  if (pp <= 1 || model.num_layer_units == 0) {
    for (int u = 0; u < num_units; ++u) out.units.push_back(u);
    out.layers = model.num_layer_units;
    return out;
  }
  const auto [lo, hi] = StageLayers(model.num_layer_units, pp, pp_stage);
  if (pp_stage == 0) {
    for (int u = 0; u < first; ++u) out.units.push_back(u);
  }
  for (int u = first + lo; u < first + hi; ++u) out.units.push_back(u);
  if (pp_stage == pp - 1) {
    for (int u = end_layers; u < num_units; ++u) out.units.push_back(u);
    // The last stage keeps its own copy of the tied token embedding for the
    // LM head (Megatron's word-embedding copy).
    out.tied_embedding_copy =
        model.transformer.has_value() && model.transformer->tied_embeddings && first > 0;
  }
  out.layers = hi - lo;
  return out;
}

ModelSpec RankSlice(const ModelDescription& model, int tp, int pp, int pp_stage, int64_t* layers) {
  const StageUnits stage = UnitsOfStage(model, pp, pp_stage);
  ModelSpec out;
  for (int u : stage.units) out.units.push_back(SliceUnit(model.spec.units[u], tp));
  if (stage.tied_embedding_copy) {
    UnitSpec head = SliceUnit(model.spec.units[0], tp);
    head.name = kTiedEmbeddingCopyUnit;
    head.params.resize(1);
    out.units.push_back(std::move(head));
  }
  *layers = stage.layers;
  return out;
}

absl::StatusOr<SliceSizes> SizeSlices(const ModelDescription& model, int tp) {
  SliceSizes sizes;
  sizes.unit_used.reserve(model.spec.units.size());
  sizes.unit_trainable_used.reserve(model.spec.units.size());
  for (size_t u = 0; u < model.spec.units.size(); ++u) {
    const UnitSpec& unit = model.spec.units[u];
    for (bool trainable_only : {false, true}) {
      ZS_ASSIGN_OR_RETURN(const int64_t used, FlatLayout::UsedNumel(SlicedNumels(
                                                  unit, tp, unit.params.size(), trainable_only)));
      (trainable_only ? sizes.unit_trainable_used : sizes.unit_used).push_back(used);
    }
  }
  if (!model.spec.units.empty()) {
    // The tied copy holds the embedding's first param alone.
    ZS_ASSIGN_OR_RETURN(sizes.tied_copy_used,
                        FlatLayout::UsedNumel(SlicedNumels(model.spec.units[0], tp, 1, false)));
    ZS_ASSIGN_OR_RETURN(sizes.tied_copy_trainable_used,
                        FlatLayout::UsedNumel(SlicedNumels(model.spec.units[0], tp, 1, true)));
  }
  return sizes;
}

absl::StatusOr<SplitLayout> LayOutSplit(const ModelDescription& model, const SliceSizes& sizes,
                                        int pp, int dp) {
  std::vector<int> stages;
  if (model.transformer.has_value() && pp > 3) {
    stages = {0, 1, pp - 1};
  } else {
    for (int i = 0; i < pp; ++i) stages.push_back(i);
  }
  SplitLayout split;
  split.stages.reserve(stages.size());
  std::vector<int64_t> used, trainable_used;
  // A unit of tied params only (used 0) stores nothing: no segment.
  auto add = [](std::vector<int64_t>& to, int64_t numel) {
    if (numel > 0) to.push_back(numel);
  };
  for (int i : stages) {
    const StageUnits units = UnitsOfStage(model, pp, i);
    used.clear();
    trainable_used.clear();
    for (int u : units.units) {
      add(used, sizes.unit_used[u]);
      add(trainable_used, sizes.unit_trainable_used[u]);
    }
    if (units.tied_embedding_copy) {
      add(used, sizes.tied_copy_used);
      add(trainable_used, sizes.tied_copy_trainable_used);
    }
    SplitLayout::Stage stage;
    stage.index = i;
    stage.layers = units.layers;
    ZS_ASSIGN_OR_RETURN(stage.layout, FlatLayout::FromUsedNumels(used, dp));
    if (!trainable_used.empty()) {
      ZS_ASSIGN_OR_RETURN(stage.trainable, FlatLayout::FromUsedNumels(trainable_used, dp));
    }
    split.stages.push_back(std::move(stage));
  }
  return split;
}

absl::Status FillRankMemory(const ModelDescription& model, const ClusterSpec& cluster,
                            const PlanOptions& options, const SplitLayout& split, Candidate& c,
                            RankSizes* sizes) {
  c.engine_supported = c.offload == Offload::kNone && c.tp == 1 && c.pp == 1;
  int64_t worst_total = -1;
  *sizes = RankSizes{};
  for (const SplitLayout::Stage& stage : split.stages) {
    const FlatLayout& layout = stage.layout;
    ZS_ASSIGN_OR_RETURN(std::vector<PlacedBuffer> buffers, RankBuffers(stage, options, c));
    MemoryBreakdown gpu, host;
    // PlanBuffers checked that all its buffers together fit; the offload
    // copies are extra, so every addition is checked here.
    bool ok = true;
    for (const PlacedBuffer& p : buffers) {
      ok = ok && AddTo(p.placement == Placement::kDevice ? gpu : host, p.buffer.category,
                       p.buffer.bytes());
    }
    ZS_ASSIGN_OR_RETURN(gpu.activations,
                        StageActivationBytes(model, options, c, stage.index, stage.layers));
    ok = ok && AddTo(gpu, MemoryCategory::kWorkspace, cluster.workspace_bytes);
    gpu.reserve = cluster.reserve_bytes;
    const std::optional<int64_t> gpu_total = gpu.CheckedTotal();
    if (!ok || !gpu_total.has_value() || !host.CheckedTotal().has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pipeline stage %d: the per-GPU bytes (model states, buffers, activations, workspace "
          "and reserve) pass 2^63; the model does not fit",
          stage.index));
    }
    if (layout.total_numel() > sizes->full_numel) {
      sizes->full_numel = layout.total_numel();
      sizes->shard_numel = layout.shard_numel();
    }
    if (stage.trainable.has_value() &&
        stage.trainable->total_numel() > sizes->trainable_full_numel) {
      sizes->trainable_full_numel = stage.trainable->total_numel();
      sizes->trainable_shard_numel = stage.trainable->shard_numel();
    }
    sizes->layers = std::max(sizes->layers, stage.layers);
    if (*gpu_total > worst_total) {
      worst_total = *gpu_total;
      c.worst_pp_stage = stage.index;
      c.buffers = std::move(buffers);
      c.per_gpu = gpu;
      c.per_rank_host = host;
    }
  }
  const int ranks_per_node = std::min(cluster.gpus_per_node, cluster.gpus);
  const std::optional<int64_t> per_node = CheckedMul(c.per_rank_host.total(), ranks_per_node);
  if (!per_node.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the host bytes of %d ranks per node pass 2^63; the offload does not fit", ranks_per_node));
  }
  c.per_node_host_bytes = *per_node;
  const bool gpu_ok = c.per_gpu.total() <= cluster.gpu_mem_bytes;
  const bool host_ok = c.per_node_host_bytes <= cluster.host_mem_bytes;
  c.fits = gpu_ok && host_ok;
  if (c.fits) {
    c.verdict = "fits";
  } else if (!gpu_ok) {
    c.verdict = absl::StrFormat("%s GiB per GPU > %s GiB", FormatGiB(c.per_gpu.total()),
                                FormatGiB(cluster.gpu_mem_bytes));
  } else {
    c.verdict = absl::StrFormat("host %s GiB per node > %s GiB", FormatGiB(c.per_node_host_bytes),
                                FormatGiB(cluster.host_mem_bytes));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zeroshard
