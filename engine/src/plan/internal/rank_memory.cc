#include "engine/src/plan/internal/rank_memory.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/common/tp_split.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/activations.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/plan/gpt_example_tensors.h"
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

// The elements of `param` of `unit` sliced as SliceUnit slices it, without
// copying the unit. At most the unsliced count, which the validated spec
// bounds.
int64_t SlicedNumel(const UnitSpec& unit, const ParamSpec& param, int tp) {
  int64_t n = 1;
  if (tp == 1 || param.tp_split_dim < 0) {
    for (int64_t d : param.shape) n *= d;
  } else {
    for (int64_t d :
         TpShardShape(param, tp, TpRemainder::kRoundUp, unit.name).value_or(param.shape)) {
      n *= d;
    }
  }
  return n;
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

Placement PlacementOf(MemoryTier tier) {
  switch (tier) {
    case MemoryTier::kHost:
      return Placement::kHost;
    case MemoryTier::kNvme:
      return Placement::kNvme;
    default:
      return Placement::kDevice;
  }
}

// The buffers of one rank: PlanBuffers over the split's storage segments
// with the candidate's offload (exactly what the engine allocates for the
// slice, each buffer on the tier the engine's ledgers record: gradients,
// master and moments over the trainable segments alone).
absl::StatusOr<std::vector<PlacedBuffer>> RankBuffers(const SplitLayout::Stage& stage,
                                                      const PlanOptions& options,
                                                      const Candidate& c) {
  const TrainSpec train = Planner::EngineTrainSpec(options, c.stage, c.micro_batches, c.offload);
  ZS_ASSIGN_OR_RETURN(BufferPlan engine_plan, PlanBuffers(stage.layout, train));
  std::vector<PlacedBuffer> out;
  for (PlannedBuffer& b : engine_plan.buffers) {
    const Placement placement = PlacementOf(b.tier);
    out.push_back({std::move(b), placement});
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
    // The last stage keeps its own copy of the tied token embedding for the
    // LM head (Megatron's word-embedding copy). The copy takes the place of
    // the head unit that aliases the embedding (tied_to a unit of the first
    // stage, which a stage cannot read).
    out.tied_embedding_copy =
        model.transformer.has_value() && model.transformer->tied_embeddings && first > 0;
    for (int u = end_layers; u < num_units; ++u) {
      const std::vector<ParamSpec>& params = model.spec.units[u].params;
      const bool aliases_only = std::all_of(
          params.begin(), params.end(), [](const ParamSpec& p) { return p.tied_to.has_value(); });
      if (out.tied_embedding_copy && aliases_only) continue;
      out.units.push_back(u);
    }
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
  const std::vector<UnitSpec>& units = model.spec.units;
  const int num_units = static_cast<int>(units.size());
  SliceSizes sizes;
  // The engine's storage segments (FlatLayout::Create's), each sized as
  // its params' tp slices.
  ZS_ASSIGN_OR_RETURN(const StorageMap map, MapStorage(model.spec));
  sizes.unit_segments.reserve(num_units + 1);
  sizes.unit_segments.push_back(0);
  std::vector<int64_t> numels;
  for (int u = 0; u < num_units; ++u) {
    for (int s : map.unit_segments[u]) {
      const StorageSegment& seg = map.segments[s];
      if (seg.spec_unit != u) {
        sizes.alias_reads.push_back({u, s});  // a tied param of another unit
        continue;
      }
      numels.clear();
      for (int p : seg.params) numels.push_back(SlicedNumel(units[u], units[u].params[p], tp));
      ZS_ASSIGN_OR_RETURN(const int64_t used, FlatLayout::UsedNumel(numels));
      sizes.segment_used.push_back(used);
      sizes.segment_trainable.push_back(seg.trainable);
    }
    sizes.unit_segments.push_back(static_cast<int>(sizes.segment_used.size()));
    if (sizes.unit_segments[u + 1] - sizes.unit_segments[u] != 1) {
      sizes.one_segment_per_unit = false;
    }
  }
  if (!sizes.alias_reads.empty()) sizes.one_segment_per_unit = false;
  if (!units.empty() && !units[0].params.empty()) {
    // The tied copy holds the embedding's first param alone.
    const ParamSpec& first = units[0].params[0];
    ZS_ASSIGN_OR_RETURN(sizes.tied_copy_used,
                        FlatLayout::UsedNumel({SlicedNumel(units[0], first, tp)}));
    sizes.tied_copy_trainable = first.trainable;
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
  std::vector<int64_t> used;
  std::vector<bool> trainable;
  std::vector<std::vector<int>> groups;  // per stage unit: the segments it reads
  std::vector<int> first_local;          // per stage unit: its first segment on the stage
  for (int i : stages) {
    const StageUnits units = UnitsOfStage(model, pp, i);
    used.clear();
    trainable.clear();
    groups.clear();
    first_local.clear();
    const bool grouped = !sizes.one_segment_per_unit || units.tied_embedding_copy;
    for (int u : units.units) {
      first_local.push_back(static_cast<int>(used.size()));
      for (int s = sizes.unit_segments[u]; s < sizes.unit_segments[u + 1]; ++s) {
        used.push_back(sizes.segment_used[s]);
        trainable.push_back(sizes.segment_trainable[s]);
      }
      if (grouped) {
        std::vector<int>& group = groups.emplace_back();
        for (int s = first_local.back(); s < static_cast<int>(used.size()); ++s) {
          group.push_back(s);
        }
      }
    }
    // An alias reads its owner's segment, when the owner is on the stage
    // (a tie never crosses stages: ShardModelSpec refuses it).
    for (const auto& [u, seg] : sizes.alias_reads) {
      const auto at = std::lower_bound(units.units.begin(), units.units.end(), u);
      const int owner = static_cast<int>(std::upper_bound(sizes.unit_segments.begin(),
                                                          sizes.unit_segments.end(), seg) -
                                         sizes.unit_segments.begin()) -
                        1;
      const auto owner_at = std::lower_bound(units.units.begin(), units.units.end(), owner);
      if (at == units.units.end() || *at != u || owner_at == units.units.end() ||
          *owner_at != owner) {
        continue;
      }
      groups[at - units.units.begin()].push_back(first_local[owner_at - units.units.begin()] + seg -
                                                 sizes.unit_segments[owner]);
    }
    if (units.tied_embedding_copy) {
      groups.push_back({static_cast<int>(used.size())});
      used.push_back(sizes.tied_copy_used);
      trainable.push_back(sizes.tied_copy_trainable);
    }
    SplitLayout::Stage stage;
    stage.index = i;
    stage.layers = units.layers;
    ZS_ASSIGN_OR_RETURN(stage.layout, FlatLayout::FromUsedNumels(used, dp, trainable, groups));
    split.stages.push_back(std::move(stage));
  }
  return split;
}

absl::Status FillRankMemory(const ModelDescription& model, const ClusterSpec& cluster,
                            const PlanOptions& options, const SplitLayout& split, Candidate& c,
                            RankSizes* sizes) {
  c.engine_supported = c.tp == 1 && c.pp == 1;
  int64_t worst_total = -1;
  *sizes = RankSizes{};
  for (const SplitLayout::Stage& stage : split.stages) {
    const FlatLayout& layout = stage.layout;
    ZS_ASSIGN_OR_RETURN(std::vector<PlacedBuffer> buffers, RankBuffers(stage, options, c));
    MemoryBreakdown gpu, host, nvme;
    // PlanBuffers checked that all its buffers together fit; the
    // activations and workspace are extra, so every addition is checked.
    bool ok = true;
    for (const PlacedBuffer& p : buffers) {
      MemoryBreakdown& to = p.placement == Placement::kDevice ? gpu
                            : p.placement == Placement::kHost ? host
                                                              : nvme;
      ok = ok && AddTo(to, p.buffer.category, p.buffer.bytes());
    }
    if (options.activations == ActivationModel::kGptExample) {
      // The trainer's own tensors, each in the category its ledger records.
      ZS_ASSIGN_OR_RETURN(const std::vector<TrainerTensor> tensors,
                          GptExampleTensors(model, options));
      for (const TrainerTensor& t : tensors) ok = ok && AddTo(gpu, t.category, t.bytes);
    } else {
      ZS_ASSIGN_OR_RETURN(gpu.activations,
                          StageActivationBytes(model, options, c, stage.index, stage.layers));
    }
    ok = ok && AddTo(gpu, MemoryCategory::kWorkspace, cluster.workspace_bytes);
    gpu.reserve = cluster.reserve_bytes;
    const std::optional<int64_t> gpu_total = gpu.CheckedTotal();
    if (!ok || !gpu_total.has_value() || !host.CheckedTotal().has_value() ||
        !nvme.CheckedTotal().has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pipeline stage %d: the per-GPU bytes (model states, buffers, activations, workspace "
          "and reserve) pass 2^63; the model does not fit",
          stage.index));
    }
    if (layout.total_numel() > sizes->full_numel) {
      sizes->full_numel = layout.total_numel();
      sizes->shard_numel = layout.shard_numel();
    }
    if (layout.train_total_numel() > sizes->trainable_full_numel) {
      sizes->trainable_full_numel = layout.train_total_numel();
      sizes->trainable_shard_numel = layout.train_shard_numel();
    }
    sizes->layers = std::max(sizes->layers, stage.layers);
    if (*gpu_total > worst_total) {
      worst_total = *gpu_total;
      c.worst_pp_stage = stage.index;
      c.buffers = std::move(buffers);
      c.per_gpu = gpu;
      c.per_rank_host = host;
      c.per_rank_nvme = nvme;
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
