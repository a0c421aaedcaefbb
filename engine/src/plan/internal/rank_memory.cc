#include "engine/src/plan/internal/rank_memory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/activations.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/plan/byte_units.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {

UnitSpec SliceUnit(const UnitSpec& unit, const std::vector<int>* split_dims, int tp) {
  if (tp == 1 || split_dims == nullptr) return unit;
  UnitSpec out = unit;
  for (size_t p = 0; p < out.params.size(); ++p) {
    const int d = (*split_dims)[p];
    if (d < 0) continue;
    int64_t& extent = out.params[p].shape[d];
    extent = (extent + tp - 1) / tp;
  }
  return out;
}

// Range of layer units that pipeline stage `i` of `pp` owns.
std::pair<int, int> StageLayers(int num_layers, int pp, int i) {
  return {static_cast<int>(static_cast<int64_t>(num_layers) * i / pp),
          static_cast<int>(static_cast<int64_t>(num_layers) * (i + 1) / pp)};
}

// Activation bytes one rank of pipeline stage `i` keeps at its peak. With
// the 1F1B schedule stage i has min(pp - i, m) micro-batches in flight
// (Narayanan et al. 2021; Korthikanti et al. 2022, Section 4.3).
int64_t StageActivationBytes(const ModelDescription& model, const PlanOptions& options,
                             const Candidate& c, int i, int64_t layers) {
  const int64_t in_flight = std::min<int64_t>(c.pp - i, c.micro_batches);
  if (!model.transformer.has_value()) {
    // Custom specs have no layer units and so run with pp = 1: every unit's
    // activations are on the one stage.
    int64_t per_sample = 0;
    for (int64_t bytes : model.activation_bytes_per_sample) per_sample += bytes;
    return per_sample * options.micro_batch * in_flight;
  }
  const TransformerShape& t = *model.transformer;
  ActivationShape shape;
  shape.seq = options.seq;
  shape.micro_batch = options.micro_batch;
  shape.tp = c.tp;
  shape.sequence_parallel = options.sequence_parallel && c.tp > 1;
  shape.recompute = options.recompute;
  shape.activation_bytes = options.precision == PlanPrecision::kFp32 ? 4 : 2;
  int64_t bytes = layers * LayerActivationBytes(t, shape) * in_flight;
  if (layers > 0) bytes += RecomputeWorkingBytes(t, shape);
  if (i == 0) bytes += EmbeddingActivationBytes(t, shape) * in_flight;
  if (i == c.pp - 1) bytes += OutputActivationBytes(t, shape);
  return bytes;
}

void AddTo(MemoryBreakdown& m, MemoryCategory category, int64_t bytes) {
  switch (category) {
    case MemoryCategory::kParams:
      m.params += bytes;
      break;
    case MemoryCategory::kGradients:
      m.grads += bytes;
      break;
    case MemoryCategory::kMasterParams:
      m.master += bytes;
      break;
    case MemoryCategory::kOptimizerState:
      m.optimizer += bytes;
      break;
    case MemoryCategory::kCommBuffers:
      m.buffers += bytes;
      break;
    case MemoryCategory::kActivations:
      m.activations += bytes;
      break;
    case MemoryCategory::kWorkspace:
    case MemoryCategory::kCount:
      m.workspace += bytes;
      break;
  }
}

// The buffers of one rank: PlanBuffers (exactly what the engine allocates),
// then the analytic changes for offload.
absl::StatusOr<std::vector<PlacedBuffer>> RankBuffers(const FlatLayout& layout,
                                                      const PlanOptions& options,
                                                      const Candidate& c) {
  const TrainSpec train = Planner::EngineTrainSpec(options, c.stage, c.micro_batches);
  ZS_ASSIGN_OR_RETURN(BufferPlan engine_plan, PlanBuffers(layout, train));
  std::vector<PlacedBuffer> out;
  for (PlannedBuffer& b : engine_plan.buffers) out.push_back({std::move(b), Placement::kDevice});
  if (c.offload != Offload::kNone) {
    // ZeRO-Offload: the fp32 states and the optimizer step move to the host;
    // a sharded gradient is copied there for the CPU Adam.
    const int64_t shard = c.stage == 0 ? layout.total_numel() : layout.shard_numel();
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
  }
  return out;
}

}  // namespace

ModelSpec RankSlice(const ModelDescription& model, int tp, int pp, int pp_stage, int64_t* layers) {
  ModelSpec out;
  const int num_units = static_cast<int>(model.spec.units.size());
  const int first = model.first_layer_unit;
  const int end_layers = first + model.num_layer_units;
  auto split_of = [&](int u) -> const std::vector<int>* {
    return model.tp_split_dim.empty() ? nullptr : &model.tp_split_dim[u];
  };
  auto take = [&](int u) { out.units.push_back(SliceUnit(model.spec.units[u], split_of(u), tp)); };
  if (pp <= 1 || model.num_layer_units == 0) {
    for (int u = 0; u < num_units; ++u) take(u);
    *layers = model.num_layer_units;
    return out;
  }
  const auto [lo, hi] = StageLayers(model.num_layer_units, pp, pp_stage);
  if (pp_stage == 0) {
    for (int u = 0; u < first; ++u) take(u);
  }
  for (int u = first + lo; u < first + hi; ++u) take(u);
  if (pp_stage == pp - 1) {
    for (int u = end_layers; u < num_units; ++u) take(u);
    if (model.transformer.has_value() && model.transformer->tied_embeddings && first > 0) {
      // The last stage keeps its own copy of the tied token embedding for
      // the LM head (Megatron's word-embedding copy).
      UnitSpec head = SliceUnit(model.spec.units[0], split_of(0), tp);
      head.name = "lm_head_tied_copy";
      head.params.resize(1);
      out.units.push_back(std::move(head));
    }
  }
  *layers = hi - lo;
  return out;
}

absl::Status FillRankMemory(const ModelDescription& model, const ClusterSpec& cluster,
                            const PlanOptions& options, Candidate& c, RankSizes* sizes) {
  if (c.dp > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data-parallel size %d exceeds the layout's limit of %d ranks", c.dp, kMaxWorldSize));
  }
  c.engine_supported = c.offload == Offload::kNone && c.tp == 1 && c.pp == 1;
  int64_t worst_total = -1;
  *sizes = RankSizes{};
  for (int i = 0; i < c.pp; ++i) {
    int64_t layers = 0;
    const ModelSpec slice = RankSlice(model, c.tp, c.pp, i, &layers);
    ZS_ASSIGN_OR_RETURN(FlatLayout layout, FlatLayout::Create(slice, c.dp));
    ZS_ASSIGN_OR_RETURN(std::vector<PlacedBuffer> buffers, RankBuffers(layout, options, c));
    MemoryBreakdown gpu, host;
    for (const PlacedBuffer& p : buffers) {
      AddTo(p.placement == Placement::kDevice ? gpu : host, p.buffer.category, p.buffer.bytes());
    }
    gpu.activations = StageActivationBytes(model, options, c, i, layers);
    gpu.workspace += cluster.workspace_bytes;
    gpu.reserve = cluster.reserve_bytes;
    if (layout.total_numel() > sizes->full_numel) {
      sizes->full_numel = layout.total_numel();
      sizes->shard_numel = layout.shard_numel();
    }
    sizes->layers = std::max(sizes->layers, layers);
    if (gpu.total() > worst_total) {
      worst_total = gpu.total();
      c.worst_pp_stage = i;
      c.buffers = std::move(buffers);
      c.per_gpu = gpu;
      c.per_rank_host = host;
    }
  }
  const int ranks_per_node = std::min(cluster.gpus_per_node, cluster.gpus);
  c.per_node_host_bytes = c.per_rank_host.total() * ranks_per_node;
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
