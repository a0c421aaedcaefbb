#include "engine/src/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/plan/byte_units.h"
#include "engine/src/plan/internal/rank_memory.h"
#include "engine/src/plan/internal/step_time.h"
#include "zeroshard/status.h"

namespace zeroshard {

const char* PlanPrecisionName(PlanPrecision p) {
  switch (p) {
    case PlanPrecision::kFp32:
      return "fp32";
    case PlanPrecision::kBf16:
      return "bf16";
    case PlanPrecision::kFp16:
      return "fp16";
  }
  return "?";
}

absl::StatusOr<PlanPrecision> ParsePlanPrecision(absl::string_view name) {
  if (name == "fp32") return PlanPrecision::kFp32;
  if (name == "bf16") return PlanPrecision::kBf16;
  if (name == "fp16") return PlanPrecision::kFp16;
  return absl::InvalidArgumentError(
      absl::StrFormat("--precision: '%s' is not one of fp32, bf16, fp16", name));
}

const char* OffloadName(Offload o) {
  switch (o) {
    case Offload::kNone:
      return "none";
    case Offload::kOptimizer:
      return "optimizer";
    case Offload::kOptimizerAndParams:
      return "optimizer+params";
  }
  return "?";
}

absl::StatusOr<Offload> ParseOffload(absl::string_view name) {
  if (name == "none") return Offload::kNone;
  if (name == "optimizer") return Offload::kOptimizer;
  if (name == "optimizer+params") return Offload::kOptimizerAndParams;
  return absl::InvalidArgumentError(
      absl::StrFormat("--offload: '%s' is not one of none, optimizer, optimizer+params", name));
}

std::string Candidate::Label() const {
  std::string s = absl::StrCat("stage ", stage);
  if (offload != Offload::kNone) absl::StrAppend(&s, " + offload ", OffloadName(offload));
  if (tp > 1 || pp > 1) s = absl::StrCat("tp ", tp, " x pp ", pp, ", ", s);
  return s;
}

int Candidate::Tier() const {
  if (tp > 1 || pp > 1) return 3;
  return offload == Offload::kNone ? 1 : 2;
}

TrainSpec Planner::EngineTrainSpec(const PlanOptions& options, int stage, int micro_batches) {
  TrainSpec train;
  train.zero_stage = stage;
  train.precision = options.precision == PlanPrecision::kFp32   ? Precision::kFp32
                    : options.precision == PlanPrecision::kFp16 ? Precision::kFp16Mixed
                                                                : Precision::kBf16Mixed;
  // prefetch_depth counts gather buffers: the unit in use plus those ahead.
  train.prefetch_units = options.prefetch_depth - 1;
  train.grad_accum_steps = micro_batches;
  train.num_grad_buffers = options.num_grad_buffers;
  return train;
}

namespace {

constexpr int64_t kDefaultSeq = 2048;
constexpr int64_t kDefaultMaxSeq = 4096;

absl::Status InvalidArgument(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

absl::Status ValidateCluster(const ClusterSpec& c) {
  if (c.gpus < 1) return InvalidArgument(absl::StrFormat("--gpus %d must be >= 1", c.gpus));
  if (c.gpus_per_node < 1) {
    return InvalidArgument(absl::StrFormat("--gpus-per-node %d must be >= 1", c.gpus_per_node));
  }
  if (c.gpus > c.gpus_per_node && c.gpus % c.gpus_per_node != 0) {
    return InvalidArgument(
        absl::StrFormat("--gpus %d is not a whole number of nodes of %d GPUs; use a multiple of %d",
                        c.gpus, c.gpus_per_node, c.gpus_per_node));
  }
  if (c.gpu_mem_bytes <= 0) return InvalidArgument("--gpu-mem must be positive");
  if (c.host_mem_bytes <= 0) return InvalidArgument("--host-mem must be positive");
  const std::pair<const char*, double> positive[] = {{"--intra-node-bw", c.intra_node_gbps},
                                                     {"--inter-node-bw", c.inter_node_gbps},
                                                     {"--pcie-bw", c.pcie_gbps},
                                                     {"--peak-tflops", c.peak_tflops},
                                                     {"--peak-tflops-fp32", c.peak_tflops_fp32},
                                                     {"--cpu-adam-rate", c.cpu_adam_gparams_per_s}};
  for (const auto& [name, value] : positive) {
    if (!(value > 0) || !std::isfinite(value)) {
      return InvalidArgument(absl::StrFormat("%s %g must be a positive number", name, value));
    }
  }
  if (!(c.mfu > 0 && c.mfu <= 1)) {
    return InvalidArgument(absl::StrFormat("--mfu %g must be in (0, 1]", c.mfu));
  }
  if (!(c.comm_overlap >= 0 && c.comm_overlap <= 1)) {
    return InvalidArgument(absl::StrFormat("comm overlap %g must be in [0, 1]", c.comm_overlap));
  }
  if (c.intra_node_latency_us < 0 || c.inter_node_latency_us < 0) {
    return InvalidArgument("link latencies must be >= 0");
  }
  if (c.reserve_bytes < 0 || c.workspace_bytes < 0) {
    return InvalidArgument("reserve and workspace must be >= 0");
  }
  return absl::OkStatus();
}

// Resolves seq and checks the options against the model and the cluster.
absl::StatusOr<PlanOptions> ResolveOptions(const ModelDescription& model,
                                           const ClusterSpec& cluster, PlanOptions o) {
  const bool transformer = model.transformer.has_value();
  if (o.seq == 0) {
    // Long-context models train most of their steps far below their
    // maximum context; 4096 is a common pre-training length.
    o.seq = transformer && model.transformer->max_positions > 0
                ? std::min<int64_t>(model.transformer->max_positions, kDefaultMaxSeq)
                : kDefaultSeq;
  }
  if (o.seq < 1) return InvalidArgument(absl::StrFormat("--seq %d must be >= 1", o.seq));
  if (transformer && model.transformer->learned_positions &&
      o.seq > model.transformer->max_positions) {
    return InvalidArgument(absl::StrFormat("--seq %d exceeds the model's %d learned positions",
                                           o.seq, model.transformer->max_positions));
  }
  if (o.micro_batch < 1) {
    return InvalidArgument(absl::StrFormat("--micro-batch %d must be >= 1", o.micro_batch));
  }
  if (o.grad_accum_steps < 1) {
    return InvalidArgument(absl::StrFormat("--grad-accum %d must be >= 1", o.grad_accum_steps));
  }
  if (o.num_grad_buffers < 1 || o.prefetch_depth < 1) {
    return InvalidArgument("gradient buffers and prefetch depth must be >= 1");
  }
  if (o.stage < -1 || o.stage > 3) {
    return InvalidArgument(absl::StrFormat("--stage %d is not auto, 0, 1, 2 or 3", o.stage));
  }
  if (o.offload.has_value() && o.stage >= 0) {
    if (*o.offload != Offload::kNone && o.stage == 0) {
      return InvalidArgument("--offload needs ZeRO stage 1, 2 or 3 (stage 0 keeps no shard)");
    }
    if (*o.offload == Offload::kOptimizerAndParams && o.stage != 3) {
      return InvalidArgument("--offload optimizer+params needs --stage 3 (params are sharded)");
    }
  }
  if (o.tp < 0 || o.pp < 0) return InvalidArgument("--tp and --pp must be >= 1");
  if (o.tp > 1) {
    if (!transformer) {
      return InvalidArgument(
          "--tp > 1 needs a transformer (--preset or --hf-config): a custom spec does not say "
          "how its params split");
    }
    const TransformerShape& t = *model.transformer;
    if (t.heads % o.tp != 0 || t.kv_heads % o.tp != 0) {
      return InvalidArgument(
          absl::StrFormat("--tp %d must divide the %d attention heads and %d key/value heads", o.tp,
                          t.heads, t.kv_heads));
    }
    if (o.tp > cluster.gpus_per_node) {
      return InvalidArgument(absl::StrFormat(
          "--tp %d exceeds the %d GPUs of a node; tensor parallelism stays within a node", o.tp,
          cluster.gpus_per_node));
    }
  }
  if (o.pp > 1) {
    if (model.num_layer_units == 0) {
      return InvalidArgument("--pp > 1 needs a model with layers (--preset or --hf-config)");
    }
    if (model.num_layer_units % o.pp != 0) {
      return InvalidArgument(
          absl::StrFormat("--pp %d must divide the %d layers", o.pp, model.num_layer_units));
    }
  }
  const int split = std::max(o.tp, 1) * std::max(o.pp, 1);
  if (cluster.gpus % split != 0) {
    return InvalidArgument(
        absl::StrFormat("--gpus %d is not divisible by tp x pp = %d", cluster.gpus, split));
  }
  return o;
}

std::vector<int> TensorDegrees(const ModelDescription& model, const ClusterSpec& cluster,
                               const PlanOptions& o) {
  if (o.tp > 0) return {o.tp};
  std::vector<int> out = {1};
  if (!model.transformer.has_value()) return out;
  const TransformerShape& t = *model.transformer;
  for (int d = 2; d <= std::min(cluster.gpus_per_node, cluster.gpus); ++d) {
    if (cluster.gpus % d == 0 && t.heads % d == 0 && t.kv_heads % d == 0) out.push_back(d);
  }
  return out;
}

std::vector<int> PipelineDegrees(const ModelDescription& model, const ClusterSpec& cluster,
                                 const PlanOptions& o, int tp) {
  if (o.pp > 0) return {o.pp};
  std::vector<int> out = {1};
  for (int d = 2; d <= model.num_layer_units; ++d) {
    if (model.num_layer_units % d == 0 && (cluster.gpus / tp) % d == 0) out.push_back(d);
  }
  return out;
}

struct Shape {
  int stage;
  Offload offload;
  int tp;
  int pp;
};

// Candidates in preference order: sharding only, offload, then splits.
std::vector<Shape> Enumerate(const ModelDescription& model, const ClusterSpec& cluster,
                             const PlanOptions& o) {
  std::vector<Shape> tier1, tier2, tier3;
  auto stage_allowed = [&](int s) { return o.stage < 0 || o.stage == s; };
  auto offload_allowed = [&](Offload off) {
    return o.offload.has_value() ? *o.offload == off : true;
  };
  for (int tp : TensorDegrees(model, cluster, o)) {
    for (int pp : PipelineDegrees(model, cluster, o, tp)) {
      const bool split = tp > 1 || pp > 1;
      for (int s = 0; s <= 3; ++s) {
        if (!stage_allowed(s)) continue;
        // Pipelines run with ZeRO 0-1 in automatic mode (DeepSpeed and
        // Megatron refuse to shard gradients across pipelined micro-batches).
        if (pp > 1 && o.stage < 0 && s > 1) continue;
        for (Offload off : {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerAndParams}) {
          if (!offload_allowed(off)) continue;
          if (off != Offload::kNone && s == 0) continue;
          if (off == Offload::kOptimizerAndParams && s != 3) continue;
          // Automatic offload is tried at stages 2-3 without splits only.
          const bool forced = o.offload.has_value() || o.stage >= 0;
          if (off != Offload::kNone && !forced && (split || s < 2)) continue;
          const Shape shape{s, off, tp, pp};
          if (split) {
            tier3.push_back(shape);
          } else if (off == Offload::kNone) {
            tier1.push_back(shape);
          } else {
            tier2.push_back(shape);
          }
        }
      }
    }
  }
  std::vector<Shape> all = tier1;
  // Offload rows in order of increasing host traffic: stage 2 then 3.
  std::stable_sort(tier2.begin(), tier2.end(), [](const Shape& a, const Shape& b) {
    return static_cast<int>(a.offload) < static_cast<int>(b.offload);
  });
  all.insert(all.end(), tier2.begin(), tier2.end());
  std::stable_sort(tier3.begin(), tier3.end(), [](const Shape& a, const Shape& b) {
    return std::make_tuple(a.tp * a.pp, a.pp, a.stage) <
           std::make_tuple(b.tp * b.pp, b.pp, b.stage);
  });
  all.insert(all.end(), tier3.begin(), tier3.end());
  return all;
}

int64_t GlobalBatch(const ClusterSpec& cluster, const PlanOptions& o) {
  return static_cast<int64_t>(cluster.gpus) * o.micro_batch * o.grad_accum_steps;
}

// Every candidate with memory and time, and the choice; no cost report.
absl::StatusOr<zeroshard::Plan> Evaluate(const ModelDescription& model, const ClusterSpec& cluster,
                                         const PlanOptions& options) {
  ZS_RETURN_IF_ERROR(ValidateCluster(cluster));
  ZS_ASSIGN_OR_RETURN(PlanOptions o, ResolveOptions(model, cluster, options));
  zeroshard::Plan plan;
  plan.model_name = model.name;
  plan.params = model.spec.NumParams();
  plan.num_units = static_cast<int>(model.spec.units.size());
  plan.cluster = cluster;
  plan.options = o;
  plan.global_batch = GlobalBatch(cluster, o);
  for (const Shape& shape : Enumerate(model, cluster, o)) {
    Candidate c;
    c.stage = shape.stage;
    c.offload = shape.offload;
    c.tp = shape.tp;
    c.pp = shape.pp;
    c.dp = cluster.gpus / (shape.tp * shape.pp);
    c.micro_batches = o.grad_accum_steps * shape.tp * shape.pp;
    internal::RankSizes sizes;
    absl::Status filled = internal::FillRankMemory(model, cluster, o, c, &sizes);
    if (!filled.ok()) {
      if (o.tp > 0 && o.pp > 0 && o.stage >= 0) return filled;  // fully forced: say why
      continue;
    }
    c.time = internal::EstimateStepTime(model, cluster, o, plan.global_batch, c, sizes);
    c.tokens_per_s =
        static_cast<double>(plan.global_batch) * static_cast<double>(o.seq) / c.time.total;
    plan.candidates.push_back(std::move(c));
  }
  if (plan.candidates.empty()) {
    return InvalidArgument("no candidate configuration could be laid out for these inputs");
  }

  // Tiers 1 and 2: the first that fits. Tier 3: the fastest that fits.
  for (int tier = 1; tier <= 3 && plan.chosen < 0; ++tier) {
    for (size_t i = 0; i < plan.candidates.size(); ++i) {
      const Candidate& c = plan.candidates[i];
      if (c.Tier() != tier || !c.fits) continue;
      if (plan.chosen < 0) {
        plan.chosen = static_cast<int>(i);
        if (tier < 3) break;
      } else if (c.time.total < plan.candidates[plan.chosen].time.total) {
        plan.chosen = static_cast<int>(i);
      }
    }
  }
  const int chosen_tier = plan.chosen >= 0 ? plan.candidates[plan.chosen].Tier() : 4;
  // Cheaper candidates that were passed over, each with its reason; splits
  // that do not fit are summarised by the one that came closest.
  const Candidate* closest_split = nullptr;
  int splits_tried = 0;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const Candidate& c = plan.candidates[i];
    if (c.Tier() == 3) {
      if (chosen_tier == 4) {
        ++splits_tried;
        if (closest_split == nullptr || c.per_gpu.total() < closest_split->per_gpu.total()) {
          closest_split = &c;
        }
      }
      continue;
    }
    if (c.Tier() < chosen_tier || (c.Tier() == chosen_tier && static_cast<int>(i) < plan.chosen)) {
      plan.rejected.push_back(absl::StrCat(c.Label(), ": ", c.verdict));
    }
  }
  if (closest_split != nullptr) {
    plan.rejected.push_back(absl::StrFormat("%d tensor/pipeline splits, none fits; closest %s: %s",
                                            splits_tried, closest_split->Label(),
                                            closest_split->verdict));
  }
  if (plan.chosen < 0) {
    plan.why = absl::StrFormat(
        "no configuration fits %d GPUs of %s GiB; add GPUs, shorten --seq, lower --micro-batch "
        "or use --recompute full",
        cluster.gpus, FormatGiB(cluster.gpu_mem_bytes));
  } else {
    const Candidate& c = plan.candidates[plan.chosen];
    const std::string uses =
        absl::StrFormat("%s of %s GiB per GPU, %.3f s per step", FormatGiB(c.per_gpu.total()),
                        FormatGiB(cluster.gpu_mem_bytes), c.time.total);
    if (chosen_tier < 3) {
      plan.why = absl::StrFormat(
          "%s is the least-communication configuration that fits (%s)%s", c.Label(), uses,
          chosen_tier == 2 ? "; sharding alone does not fit, so the optimizer moves to the host"
                           : "");
    } else {
      int fitting = 0;
      for (const Candidate& other : plan.candidates) fitting += other.Tier() == 3 && other.fits;
      plan.why = absl::StrFormat(
          "sharding and offload alone do not fit; %s is the fastest of the %d tensor/pipeline "
          "splits that fit (%s)",
          c.Label(), fitting, uses);
    }
  }
  return plan;
}

// GPU counts for the cost sweep: 1, 2, 4, ... within a node, then whole
// nodes doubling, then `gpus` itself.
std::vector<int> SweepCounts(const ClusterSpec& cluster) {
  std::vector<int> counts;
  for (int n = 1; n < std::min(cluster.gpus_per_node, cluster.gpus); n *= 2) counts.push_back(n);
  for (int n = std::min(cluster.gpus_per_node, cluster.gpus); n < cluster.gpus; n *= 2) {
    counts.push_back(n);
  }
  counts.push_back(cluster.gpus);
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  return counts;
}

void AddCosts(const PlanOptions& o, int gpus, double tokens_per_s, double base_per_gpu,
              double* epoch_s, double* epoch_cost, double* efficiency) {
  *epoch_s = o.dataset_tokens > 0 ? o.dataset_tokens / tokens_per_s : 0.0;
  *epoch_cost = o.price_per_gpu_hour > 0 && *epoch_s > 0
                    ? *epoch_s / 3600.0 * gpus * o.price_per_gpu_hour
                    : 0.0;
  *efficiency = base_per_gpu > 0 ? tokens_per_s / gpus / base_per_gpu : 0.0;
}

}  // namespace

absl::StatusOr<zeroshard::Plan> Planner::Plan(const ModelDescription& model,
                                              const ClusterSpec& cluster,
                                              const PlanOptions& options) {
  ZS_ASSIGN_OR_RETURN(zeroshard::Plan plan, Evaluate(model, cluster, options));
  if (options.price_per_gpu_hour <= 0 && options.dataset_tokens <= 0) return plan;

  // "Is N faster per dollar than fewer?": the automatic choice at smaller
  // GPU counts, with the same per-GPU micro-batch and accumulation.
  double base_per_gpu = 0;
  for (int n : SweepCounts(cluster)) {
    ClusterSpec smaller = cluster;
    smaller.gpus = n;
    ScalePoint point;
    point.gpus = n;
    absl::StatusOr<zeroshard::Plan> sub = n == cluster.gpus ? absl::StatusOr<zeroshard::Plan>(plan)
                                                            : Evaluate(model, smaller, options);
    if (sub.ok() && sub->chosen >= 0) {
      const Candidate& c = sub->candidates[sub->chosen];
      point.fits = true;
      point.label = c.Label();
      point.step_s = c.time.total;
      point.tokens_per_s = c.tokens_per_s;
      if (plan.min_fitting_gpus == 0) {
        plan.min_fitting_gpus = n;
        base_per_gpu = c.tokens_per_s / n;
      }
      AddCosts(plan.options, n, c.tokens_per_s, base_per_gpu, &point.epoch_s, &point.epoch_cost,
               &point.scaling_efficiency);
    }
    plan.scaling.push_back(point);
  }
  for (Candidate& c : plan.candidates) {
    AddCosts(plan.options, cluster.gpus, c.tokens_per_s, base_per_gpu, &c.epoch_s, &c.epoch_cost,
             &c.scaling_efficiency);
  }
  return plan;
}

}  // namespace zeroshard
