#include "zeroshard/estimate/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/plan/gpt_example_tensors.h"
#include "engine/src/plan/internal/plan_inputs.h"
#include "engine/src/plan/internal/rank_memory.h"
#include "engine/src/plan/internal/step_time.h"
#include "zeroshard/estimate/byte_units.h"
#include "zeroshard/estimate/fine_tuning.h"
#include "zeroshard/status.h"

namespace zeroshard {

const char* PlacementName(Placement p) {
  switch (p) {
    case Placement::kDevice:
      return "device";
    case Placement::kHost:
      return "host";
    case Placement::kNvme:
      return "nvme";
  }
  return "?";
}

std::string OffloadName(const Offload& o) {
  std::vector<std::string> parts;
  const std::pair<const char*, MemoryTier> states[] = {
      {"optimizer", o.optimizer}, {"grads", o.grads}, {"params", o.params}};
  for (const auto& [state, tier] : states) {
    if (tier != MemoryTier::kDevice)
      parts.push_back(absl::StrCat(state, "=", MemoryTierName(tier)));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ",");
}

absl::StatusOr<Offload> ParseOffload(absl::string_view text) {
  if (text == "none") return Offload::kNone;
  if (text == "optimizer") return Offload::kOptimizer;
  if (text == "optimizer+params") return Offload::kOptimizerAndParams;
  constexpr char kAllowed[] =
      "give none, optimizer, optimizer+params, or state=tier pairs separated by commas: "
      "optimizer=device|host|nvme, grads=device|host, params=device|host (e.g. "
      "optimizer=nvme,params=host)";
  Offload out;
  bool seen[3] = {false, false, false};
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const size_t eq = part.find('=');
    const absl::string_view key = part.substr(0, eq);
    const absl::string_view value = eq == absl::string_view::npos ? "" : part.substr(eq + 1);
    int k = -1;
    if (key == "optimizer") k = 0;
    if (key == "grads") k = 1;
    if (key == "params") k = 2;
    if (k < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--offload %s: unknown state '%s'; %s", text, key, kAllowed));
    }
    if (seen[k]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--offload %s: '%s' is given twice; %s", text, key, kAllowed));
    }
    seen[k] = true;
    MemoryTier tier;
    if (value == "device") {
      tier = MemoryTier::kDevice;
    } else if (value == "host") {
      tier = MemoryTier::kHost;
    } else if (value == "nvme" && k == 0) {
      tier = MemoryTier::kNvme;
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("--offload %s: '%s' is not a tier %s may take (%s); %s", text, value, key,
                          k == 0 ? "device, host, nvme" : "device, host", kAllowed));
    }
    (k == 0 ? out.optimizer : k == 1 ? out.grads : out.params) = tier;
  }
  return out;
}

std::optional<int64_t> MemoryBreakdown::CheckedTotal() const {
  CheckedInt64 sum = 0;
  for (int64_t field :
       {params, grads, master, optimizer, buffers, activations, workspace, reserve}) {
    if (field < 0) return std::nullopt;
    sum += field;
  }
  return sum.value();
}

std::string Candidate::Label() const {
  std::string s = absl::StrCat("stage ", stage);
  if (offload.enabled()) absl::StrAppend(&s, " + offload ", OffloadName(offload));
  if (tp > 1 || pp > 1) s = absl::StrCat("tp ", tp, " x pp ", pp, ", ", s);
  return s;
}

int Candidate::Tier() const {
  if (tp > 1 || pp > 1) return 3;
  return offload.enabled() ? 2 : 1;
}

TrainSpec Planner::EngineTrainSpec(const PlanOptions& options, int stage, int micro_batches,
                                   const Offload& offload) {
  TrainSpec train;
  train.offload.optimizer = offload.optimizer;
  train.offload.grads = offload.grads;
  train.offload.params = offload.params;
  train.zero_stage = stage;
  train.precision = options.precision;
  // prefetch_depth counts gather buffers: the unit in use plus those ahead.
  train.prefetch_units = options.prefetch_depth - 1;
  train.grad_accum_steps = micro_batches;
  train.num_grad_buffers = options.num_grad_buffers;
  return train;
}

namespace {

absl::Status InvalidArgument(const std::string& message) {
  return absl::InvalidArgumentError(message);
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
        // With a forced --offload, that policy alone; automatic: none, the
        // optimizer on the host and on NVMe, and ZeRO-Infinity to the host
        // (optimizer, grads and params; stage 3).
        std::vector<Offload> policies = {Offload::kNone, Offload::kOptimizer,
                                         Offload::kOptimizerNvme, Offload::kOptimizerAndParams};
        if (o.offload.has_value()) policies = {*o.offload};
        for (const Offload& off : policies) {
          if (!offload_allowed(off)) continue;
          if (off.params != MemoryTier::kDevice && s != 3) continue;
          // Automatic offload is tried at stages 2-3 without splits only.
          const bool forced = o.offload.has_value() || o.stage >= 0;
          if (off.enabled() && !forced && (split || s < 2)) continue;
          const Shape shape{s, off, tp, pp};
          if (split) {
            tier3.push_back(shape);
          } else if (!off.enabled()) {
            tier1.push_back(shape);
          } else {
            tier2.push_back(shape);
          }
        }
      }
    }
  }
  std::vector<Shape> all = tier1;
  // Offload rows in order of increasing traffic: the optimizer on the host,
  // then on NVMe, then params too; stage 2 then 3 within each.
  auto rank = [](const Offload& off) {
    return std::make_tuple(off.params != MemoryTier::kDevice, off.grads != MemoryTier::kDevice,
                           static_cast<int>(off.optimizer));
  };
  std::stable_sort(tier2.begin(), tier2.end(), [&](const Shape& a, const Shape& b) {
    return rank(a.offload) < rank(b.offload);
  });
  all.insert(all.end(), tier2.begin(), tier2.end());
  std::stable_sort(tier3.begin(), tier3.end(), [](const Shape& a, const Shape& b) {
    return std::make_tuple(a.tp * a.pp, a.pp, a.stage) <
           std::make_tuple(b.tp * b.pp, b.pp, b.stage);
  });
  all.insert(all.end(), tier3.begin(), tier3.end());
  return all;
}

// Every time of a candidate is finite and >= 0, and its throughput positive.
bool TimesAreFinite(const Candidate& c) {
  const StepTime& t = c.time;
  for (double v : {t.compute, t.bubble, t.dp_comm, t.tp_comm, t.pp_comm, t.offload, t.total}) {
    if (!std::isfinite(v) || v < 0) return false;
  }
  return t.total > 0 && std::isfinite(c.tokens_per_s) && c.tokens_per_s > 0;
}

// A candidate that could not be sized, and why.
struct Unsized {
  std::string label;
  int tier = 0;
  std::string why;
};

// Every candidate with memory and time, and the choice; no cost report.
// The sliced unit sizes per tensor-parallel degree, shared by every
// evaluation of one plan (the cost sweep evaluates it at other GPU counts).
using SliceCache = std::map<int, absl::StatusOr<internal::SliceSizes>>;

// `model.spec` must have passed Validate().
absl::StatusOr<zeroshard::Plan> Evaluate(const ModelDescription& model, const ClusterSpec& cluster,
                                         const PlanOptions& options, SliceCache& slices) {
  ZS_RETURN_IF_ERROR(internal::ValidateCluster(cluster));
  ZS_ASSIGN_OR_RETURN(PlanOptions o, internal::ResolveOptions(model, cluster, options));
  zeroshard::Plan plan;
  plan.model_name = model.name;
  const ParamCounts counts = CountParams(model.spec);
  plan.params = counts.total();
  plan.trainable_params = counts.trainable;
  plan.frozen_params = counts.frozen;
  plan.num_units = static_cast<int>(model.spec.units.size());
  if (o.activations == ActivationModel::kGptExample) {
    ZS_ASSIGN_OR_RETURN(plan.trainer_tensors, internal::GptExampleTensors(model, o));
  }
  plan.cluster = cluster;
  plan.options = o;
  ZS_ASSIGN_OR_RETURN(plan.global_batch, internal::GlobalBatch(cluster, o));
  // Every ZeRO stage and offload of one tp x pp split shares its layouts.
  std::map<std::pair<int, int>, absl::StatusOr<internal::SplitLayout>> splits;
  std::vector<Unsized> unsized;
  const bool fully_forced = o.tp > 0 && o.pp > 0 && o.stage >= 0 && o.offload.has_value();
  for (const Shape& shape : Enumerate(model, cluster, o)) {
    Candidate c;
    c.stage = shape.stage;
    c.offload = shape.offload;
    c.tp = shape.tp;
    c.pp = shape.pp;
    c.dp = cluster.gpus / (shape.tp * shape.pp);
    c.micro_batches = o.grad_accum_steps * shape.tp * shape.pp;  // an int: ResolveOptions
    auto sizes_of_tp = slices.find(shape.tp);
    if (sizes_of_tp == slices.end()) {
      sizes_of_tp = slices.emplace(shape.tp, internal::SizeSlices(model, shape.tp)).first;
    }
    auto split = splits.find({shape.tp, shape.pp});
    if (split == splits.end()) {
      absl::StatusOr<internal::SplitLayout> laid_out =
          sizes_of_tp->second.ok()
              ? internal::LayOutSplit(model, *sizes_of_tp->second, shape.pp, c.dp)
              : absl::StatusOr<internal::SplitLayout>(sizes_of_tp->second.status());
      split = splits.emplace(std::make_pair(shape.tp, shape.pp), std::move(laid_out)).first;
    }
    internal::RankSizes sizes;
    absl::Status filled =
        split->second.ok() ? internal::FillRankMemory(model, cluster, o, *split->second, c, &sizes)
                           : split->second.status();
    if (filled.ok()) {
      c.time = internal::EstimateStepTime(model, cluster, o, plan.global_batch, c, sizes);
      c.tokens_per_s =
          static_cast<double>(plan.global_batch) * static_cast<double>(o.seq) / c.time.total;
      if (!TimesAreFinite(c)) {
        filled = InvalidArgument(
            "its step time is not a finite number; check the bandwidth and TFLOPS options");
      }
    }
    if (!filled.ok()) {
      if (fully_forced) return InvalidArgument(absl::StrCat(c.Label(), ": ", filled.message()));
      unsized.push_back({c.Label(), c.Tier(), std::string(filled.message())});
      continue;
    }
    plan.candidates.push_back(std::move(c));
  }
  if (plan.candidates.empty()) {
    if (!unsized.empty()) {
      return InvalidArgument(absl::StrCat(unsized.front().label, ": ", unsized.front().why));
    }
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
  // Candidates that could not be sized (a count would pass 2^63, so they
  // cannot fit either): named, never shown with wrapped numbers.
  int unsized_splits = 0;
  const Unsized* first_unsized_split = nullptr;
  for (const Unsized& u : unsized) {
    if (u.tier > chosen_tier) continue;
    if (u.tier < 3) {
      plan.rejected.push_back(absl::StrCat(u.label, ": not sized: ", u.why));
    } else if (unsized_splits++ == 0) {
      first_unsized_split = &u;
    }
  }
  if (first_unsized_split != nullptr) {
    plan.rejected.push_back(absl::StrFormat("%d tensor/pipeline splits not sized; first, %s: %s",
                                            unsized_splits, first_unsized_split->label,
                                            first_unsized_split->why));
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
          chosen_tier != 2 ? ""
          : options.offload.has_value()
              ? absl::StrCat("; the states are off the GPU as --offload asks (",
                             OffloadName(c.offload), ")")
              : absl::StrCat("; sharding alone does not fit, so the states move off the GPU (",
                             OffloadName(c.offload), ")"));
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

// The promise of the report: every number it prints is finite and >= 0.
// The input ranges make this hold; a failure here is a bug in the model, so
// it is reported rather than printed.
absl::Status CheckReportedNumbers(const zeroshard::Plan& plan) {
  auto bad = [](const std::string& what) {
    return absl::InternalError(absl::StrCat(
        "the estimate's ", what,
        " is not a finite non-negative number; please report this with the command line"));
  };
  auto finite = [](double v) { return std::isfinite(v) && v >= 0; };
  if (plan.params < 0 || plan.global_batch < 0) return bad("parameter count or batch");
  for (const Candidate& c : plan.candidates) {
    if (!c.per_gpu.CheckedTotal().has_value() || !c.per_rank_host.CheckedTotal().has_value() ||
        c.per_node_host_bytes < 0) {
      return bad(absl::StrCat(c.Label(), " memory"));
    }
    for (const PlacedBuffer& b : c.buffers) {
      if (b.buffer.numel < 0) return bad(absl::StrCat(c.Label(), " buffer ", b.buffer.name));
    }
    if (!TimesAreFinite(c)) return bad(absl::StrCat(c.Label(), " step time"));
    if (!finite(c.epoch_s) || !finite(c.epoch_cost) || !finite(c.scaling_efficiency)) {
      return bad(absl::StrCat(c.Label(), " cost"));
    }
  }
  for (const ScalePoint& p : plan.scaling) {
    for (double v : {p.step_s, p.tokens_per_s, p.epoch_s, p.epoch_cost, p.scaling_efficiency}) {
      if (!finite(v)) return bad(absl::StrCat("cost sweep at ", p.gpus, " GPUs"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<zeroshard::Plan> Planner::Plan(const ModelDescription& model,
                                              const ClusterSpec& cluster,
                                              const PlanOptions& options) {
  // Every count relies on the ModelSpec limits (at most 2^56 params).
  absl::Status valid = model.spec.Validate();
  if (!valid.ok()) return InvalidArgument(absl::StrCat(model.name, ": ", valid.message()));
  SliceCache slices;
  ZS_ASSIGN_OR_RETURN(zeroshard::Plan plan, Evaluate(model, cluster, options, slices));
  if (options.price_per_gpu_hour <= 0 && options.dataset_tokens <= 0) {
    ZS_RETURN_IF_ERROR(CheckReportedNumbers(plan));
    return plan;
  }

  // "Is N faster per dollar than fewer?": the automatic choice at smaller
  // GPU counts, with the same per-GPU micro-batch and accumulation.
  double base_per_gpu = 0;
  for (int n : SweepCounts(cluster)) {
    ClusterSpec smaller = cluster;
    smaller.gpus = n;
    ScalePoint point;
    point.gpus = n;
    absl::StatusOr<zeroshard::Plan> sub = n == cluster.gpus
                                              ? absl::StatusOr<zeroshard::Plan>(plan)
                                              : Evaluate(model, smaller, options, slices);
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
  ZS_RETURN_IF_ERROR(CheckReportedNumbers(plan));
  return plan;
}

}  // namespace zeroshard
