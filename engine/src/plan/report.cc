#include "zeroshard/estimate/report.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "nlohmann/json.hpp"
#include "zeroshard/estimate/byte_units.h"

namespace zeroshard {
namespace {

using nlohmann::json;

std::string WithCommas(int64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  const int len = static_cast<int>(digits.size());
  for (int i = 0; i < len; ++i) {
    out.push_back(digits[i]);
    if (digits[i] != '-' && (len - 1 - i) % 3 == 0 && i != len - 1) out.push_back(',');
  }
  return out;
}

// A non-negative rate with thousands separators; in e-notation past 2^63
// (converting such a double to an integer would be undefined).
std::string WithCommas(double x) {
  const std::optional<int64_t> n = RoundToInt64(x);
  return n.has_value() ? WithCommas(*n) : absl::StrFormat("%.3e", x);
}

std::string Billions(int64_t n) { return absl::StrFormat("%.2f B", static_cast<double>(n) / 1e9); }

// Billions, or millions below 10^9 (LoRA adapters are millions).
std::string ShortCount(int64_t n) {
  return n >= 1000000000 ? Billions(n) : absl::StrFormat("%.2f M", static_cast<double>(n) / 1e6);
}

const char* PrecisionText(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32 (params are the master copy)";
    case Precision::kBf16Mixed:
      return "bf16 mixed (fp32 master and moments)";
    case Precision::kFp16Mixed:
      return "fp16 mixed (fp32 master and moments)";
  }
  return "?";
}

bool HasCosts(const Plan& plan) {
  return plan.options.price_per_gpu_hour > 0 || plan.options.dataset_tokens > 0;
}

json Breakdown(const MemoryBreakdown& m) {
  return json{
      {"params", m.params},       {"grads", m.grads},     {"master", m.master},
      {"optimizer", m.optimizer}, {"buffers", m.buffers}, {"activations", m.activations},
      {"workspace", m.workspace}, {"reserve", m.reserve}, {"model_states", m.model_states()},
      {"total", m.total()}};
}

}  // namespace

std::vector<int> ShownCandidates(const Plan& plan, bool all) {
  std::vector<int> shown;
  const int n = static_cast<int>(plan.candidates.size());
  if (all) {
    for (int i = 0; i < n; ++i) shown.push_back(i);
    return shown;
  }
  const int chosen_tier = plan.chosen >= 0 ? plan.candidates[plan.chosen].Tier() : 4;
  std::vector<int> splits;
  for (int i = 0; i < n; ++i) {
    const int tier = plan.candidates[i].Tier();
    if (tier == 1 || (tier == 2 && chosen_tier >= 2)) shown.push_back(i);
    if (tier == 3 && chosen_tier >= 3) splits.push_back(i);
  }
  const bool any_split_fits =
      std::any_of(splits.begin(), splits.end(), [&](int i) { return plan.candidates[i].fits; });
  if (any_split_fits) {
    splits.erase(std::remove_if(splits.begin(), splits.end(),
                                [&](int i) { return !plan.candidates[i].fits; }),
                 splits.end());
    std::stable_sort(splits.begin(), splits.end(), [&](int a, int b) {
      return plan.candidates[a].time.total < plan.candidates[b].time.total;
    });
    if (splits.size() > 8) splits.resize(8);
  } else {
    std::stable_sort(splits.begin(), splits.end(), [&](int a, int b) {
      return plan.candidates[a].per_gpu.total() < plan.candidates[b].per_gpu.total();
    });
    if (splits.size() > 5) splits.resize(5);
  }
  shown.insert(shown.end(), splits.begin(), splits.end());
  return shown;
}

std::string FormatTable(const Plan& plan, bool all) {
  const ClusterSpec& cl = plan.cluster;
  const PlanOptions& o = plan.options;
  std::string out;
  absl::StrAppendFormat(&out, "model     %s: %s params (%s), %d units\n", plan.model_name,
                        WithCommas(plan.params), Billions(plan.params), plan.num_units);
  if (plan.frozen_params > 0) {
    // Only the trainable part has gradients, an fp32 master and moments.
    absl::StrAppendFormat(
        &out,
        "          trainable %s (%s), frozen %s (%s): grads, master and optimizer "
        "state for the trainable params only\n",
        WithCommas(plan.trainable_params), ShortCount(plan.trainable_params),
        WithCommas(plan.frozen_params), ShortCount(plan.frozen_params));
  }
  absl::StrAppendFormat(&out, "cluster   %d GPUs (%d per node) x %s GiB, host %s GiB per node\n",
                        cl.gpus, cl.gpus_per_node, FormatGiB(cl.gpu_mem_bytes),
                        FormatGiB(cl.host_mem_bytes));
  absl::StrAppendFormat(&out,
                        "training  %s, AdamW; seq %d, micro-batch %d, grad accum %d, recompute "
                        "%s%s; global batch %d sequences\n",
                        PrecisionText(o.precision), o.seq, o.micro_batch, o.grad_accum_steps,
                        RecomputeName(o.recompute),
                        o.activations == ActivationModel::kKorthikanti
                            ? ""
                            : absl::StrCat(", activations ", ActivationModelName(o.activations)),
                        plan.global_batch);
  absl::StrAppend(&out,
                  "memory    GiB (2^30 bytes) per GPU; other = workspace + per-process reserve; "
                  "host = host memory per node\n\n");
  const bool costs = HasCosts(plan);
  const std::vector<int> shown = ShownCandidates(plan, all);
  // The candidate column fits the longest label shown (offload policies of
  // three states run past the usual 38).
  size_t label_width = 38;
  for (int i : shown) label_width = std::max(label_width, plan.candidates[i].Label().size());
  std::string header = absl::StrFormat(
      "  %-*s %3s %3s %4s %7s %7s %7s %7s %7s %7s %6s %8s %8s %4s %8s",
      static_cast<int>(label_width), "candidate", "tp", "pp", "dp", "params", "grads", "master",
      "optim", "buffers", "activ", "other", "GPU", "host", "fits", "step s");
  if (costs) absl::StrAppendFormat(&header, " %9s %10s %6s", "epoch h", "epoch $", "eff");
  absl::StrAppend(&out, header, "\n");
  for (int i : shown) {
    const Candidate& c = plan.candidates[i];
    const MemoryBreakdown& m = c.per_gpu;
    std::string row = absl::StrFormat(
        "%s %-*s %3d %3d %4d %7s %7s %7s %7s %7s %7s %6s %8s %8s %4s %8.3f",
        i == plan.chosen ? "*" : " ", static_cast<int>(label_width), c.Label(), c.tp, c.pp, c.dp,
        FormatGiB(m.params), FormatGiB(m.grads), FormatGiB(m.master), FormatGiB(m.optimizer),
        FormatGiB(m.buffers), FormatGiB(m.activations), FormatGiB(m.workspace + m.reserve),
        FormatGiB(m.total()), FormatGiB(c.per_node_host_bytes), c.fits ? "yes" : "no",
        c.time.total);
    if (costs) {
      absl::StrAppendFormat(&row, " %9.1f %10.0f %6.2f", c.epoch_s / 3600.0, c.epoch_cost,
                            c.scaling_efficiency);
    }
    absl::StrAppend(&out, row, "\n");
  }
  const int hidden = static_cast<int>(plan.candidates.size() - shown.size());
  if (hidden > 0) {
    absl::StrAppendFormat(&out, "  (%d more candidates not shown; --all lists every one)\n",
                          hidden);
  }
  absl::StrAppend(&out, "\n", plan.chosen >= 0 ? "chosen:   " : "no fit:   ", plan.why, "\n");
  for (const std::string& r : plan.rejected) absl::StrAppend(&out, "rejected: ", r, "\n");
  if (plan.chosen >= 0) {
    const Candidate& c = plan.candidates[plan.chosen];
    absl::StrAppendFormat(&out,
                          "step:     %.3f s = compute %.3f + bubble %.3f + data-parallel %.3f + "
                          "tensor-parallel %.3f + pipeline %.3f + offload %.3f; %s tokens/s\n",
                          c.time.total, c.time.compute, c.time.bubble, c.time.dp_comm,
                          c.time.tp_comm, c.time.pp_comm, c.time.offload,
                          WithCommas(c.tokens_per_s));
    absl::StrAppendFormat(
        &out,
        "tiers:    per rank: device %s GiB (%s bytes), host %s GiB (%s bytes, pinned), NVMe %s GiB "
        "(%s bytes); host %s GiB per node\n",
        FormatGiB(c.per_gpu.total()), WithCommas(c.per_gpu.total()),
        FormatGiB(c.per_rank_host.total()), WithCommas(c.per_rank_host.total()),
        FormatGiB(c.per_rank_nvme.total()), WithCommas(c.per_rank_nvme.total()),
        FormatGiB(c.per_node_host_bytes));
    if (!c.engine_supported) {
      absl::StrAppend(
          &out,
          "note:     today's engine runs stages 0-3 (fp32, bf16, fp16) with every offload "
          "tier, without tp/pp; this plan's buffers are computed analytically\n");
    }
  }
  if (!plan.trainer_tensors.empty()) {
    // The trainer's tensors and each shown candidate in bytes: what its
    // ledger prints, category by category (the GiB columns round small
    // models to 0.0).
    absl::StrAppend(&out,
                    "\ntrainer:  the GPT example's own tensors (--activations gpt-example), "
                    "bytes per rank, the same at every stage:\n");
    for (const TrainerTensor& t : plan.trainer_tensors) {
      absl::StrAppendFormat(&out, "  %-20s %-12s %14s\n", t.name, MemoryCategoryName(t.category),
                            WithCommas(t.bytes));
    }
    absl::StrAppend(&out, "bytes per rank:\n");
    absl::StrAppendFormat(&out, "  %-38s %14s %14s %14s %14s %14s %14s %14s %14s %14s\n",
                          "candidate", "params", "grads", "master", "optimizer", "buffers",
                          "activations", "workspace", "reserve", "total");
    for (int i : shown) {
      const Candidate& c = plan.candidates[i];
      const MemoryBreakdown& m = c.per_gpu;
      std::string row = absl::StrFormat("%s %-38s", i == plan.chosen ? "*" : " ", c.Label());
      for (int64_t bytes : {m.params, m.grads, m.master, m.optimizer, m.buffers, m.activations,
                            m.workspace, m.reserve, m.total()}) {
        absl::StrAppendFormat(&row, " %14s", WithCommas(bytes));
      }
      absl::StrAppend(&out, row, "\n");
    }
  }
  if (costs) {
    absl::StrAppendFormat(&out,
                          "\ncost:     %s tokens per epoch at $%.2f per GPU-hour; efficiency = "
                          "tokens/s per GPU relative to the smallest GPU count that fits (%d)\n",
                          WithCommas(static_cast<int64_t>(o.dataset_tokens)), o.price_per_gpu_hour,
                          plan.min_fitting_gpus);
    absl::StrAppendFormat(&out, "  %5s  %-38s %8s %12s %9s %10s %6s\n", "gpus", "automatic plan",
                          "step s", "tokens/s", "epoch h", "epoch $", "eff");
    for (const ScalePoint& p : plan.scaling) {
      if (!p.fits) {
        absl::StrAppendFormat(&out, "  %5d  %-38s\n", p.gpus, "(nothing fits)");
        continue;
      }
      absl::StrAppendFormat(&out, "  %5d  %-38s %8.3f %12s %9.1f %10.0f %6.2f\n", p.gpus, p.label,
                            p.step_s, WithCommas(p.tokens_per_s), p.epoch_s / 3600.0, p.epoch_cost,
                            p.scaling_efficiency);
    }
  }
  return out;
}

std::string FormatJson(const Plan& plan, bool all) {
  const ClusterSpec& cl = plan.cluster;
  const PlanOptions& o = plan.options;
  const std::vector<int> shown = ShownCandidates(plan, all);
  json doc;
  doc["schema"] = "zeroshard.estimate.v1";
  doc["units"] = {{"memory", "bytes"}, {"time", "seconds"}};
  doc["model"] = plan.model_name;
  doc["params"] = plan.params;
  doc["trainable_params"] = plan.trainable_params;
  doc["frozen_params"] = plan.frozen_params;
  doc["num_units"] = plan.num_units;
  doc["cluster"] = {
      {"gpus", cl.gpus},
      {"gpus_per_node", cl.gpus_per_node},
      {"gpu_mem_bytes", cl.gpu_mem_bytes},
      {"host_mem_bytes", cl.host_mem_bytes},
      {"intra_node_gbps", cl.intra_node_gbps},
      {"inter_node_gbps", cl.inter_node_gbps},
      {"pcie_gbps", cl.pcie_gbps},
      {"nvme_read_gbps", cl.nvme_read_gbps},
      {"nvme_write_gbps", cl.nvme_write_gbps},
      {"intra_node_latency_us", cl.intra_node_latency_us},
      {"inter_node_latency_us", cl.inter_node_latency_us},
      {"peak_tflops", o.precision == Precision::kFp32 ? cl.peak_tflops_fp32 : cl.peak_tflops},
      {"mfu", cl.mfu},
      {"reserve_bytes", cl.reserve_bytes},
      {"workspace_bytes", cl.workspace_bytes}};
  doc["training"] = {{"precision", PrecisionName(o.precision)},
                     {"seq", o.seq},
                     {"micro_batch", o.micro_batch},
                     {"grad_accum_steps", o.grad_accum_steps},
                     {"recompute", RecomputeName(o.recompute)},
                     {"activations", ActivationModelName(o.activations)},
                     {"sequence_parallel", o.sequence_parallel},
                     {"global_batch", plan.global_batch}};
  if (!plan.trainer_tensors.empty()) {
    json tensors = json::array();
    for (const TrainerTensor& t : plan.trainer_tensors) {
      tensors.push_back(
          {{"name", t.name}, {"category", MemoryCategoryName(t.category)}, {"bytes", t.bytes}});
    }
    doc["trainer_tensors"] = std::move(tensors);
  }
  doc["chosen"] = plan.chosen >= 0 ? json(plan.chosen) : json(nullptr);
  doc["why"] = plan.why;
  doc["rejected"] = plan.rejected;
  json candidates = json::array();
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const Candidate& c = plan.candidates[i];
    json buffers = json::array();
    for (const PlacedBuffer& p : c.buffers) {
      buffers.push_back({{"name", p.buffer.name},
                         {"category", MemoryCategoryName(p.buffer.category)},
                         {"dtype", DTypeName(p.buffer.dtype)},
                         {"numel", p.buffer.numel},
                         {"bytes", p.buffer.bytes()},
                         {"placement", PlacementName(p.placement)}});
    }
    json entry = {
        {"index", i},
        {"label", c.Label()},
        {"stage", c.stage},
        {"offload", OffloadName(c.offload)},
        {"tp", c.tp},
        {"pp", c.pp},
        {"dp", c.dp},
        {"micro_batches", c.micro_batches},
        {"worst_pp_stage", c.worst_pp_stage},
        {"engine_supported", c.engine_supported},
        {"fits", c.fits},
        {"verdict", c.verdict},
        {"chosen", static_cast<int>(i) == plan.chosen},
        {"shown", std::find(shown.begin(), shown.end(), static_cast<int>(i)) != shown.end()},
        {"per_gpu_bytes", Breakdown(c.per_gpu)},
        {"per_rank_host_bytes", Breakdown(c.per_rank_host)},
        {"per_rank_nvme_bytes", Breakdown(c.per_rank_nvme)},
        {"per_rank_tier_bytes",
         {{"device", c.per_gpu.total()},
          {"host", c.per_rank_host.total()},
          {"nvme", c.per_rank_nvme.total()}}},
        {"per_node_host_bytes", c.per_node_host_bytes},
        {"step_time_s",
         {{"compute", c.time.compute},
          {"bubble", c.time.bubble},
          {"dp_comm", c.time.dp_comm},
          {"tp_comm", c.time.tp_comm},
          {"pp_comm", c.time.pp_comm},
          {"offload", c.time.offload},
          {"total", c.time.total}}},
        {"tokens_per_s", c.tokens_per_s},
        {"buffers", buffers}};
    if (HasCosts(plan)) {
      entry["epoch_s"] = c.epoch_s;
      entry["epoch_cost"] = c.epoch_cost;
      entry["scaling_efficiency"] = c.scaling_efficiency;
    }
    candidates.push_back(std::move(entry));
  }
  doc["candidates"] = std::move(candidates);
  if (HasCosts(plan)) {
    doc["price_per_gpu_hour"] = o.price_per_gpu_hour;
    doc["dataset_tokens"] = o.dataset_tokens;
    doc["min_fitting_gpus"] = plan.min_fitting_gpus;
    json scaling = json::array();
    for (const ScalePoint& p : plan.scaling) {
      scaling.push_back({{"gpus", p.gpus},
                         {"fits", p.fits},
                         {"label", p.label},
                         {"step_s", p.step_s},
                         {"tokens_per_s", p.tokens_per_s},
                         {"epoch_s", p.epoch_s},
                         {"epoch_cost", p.epoch_cost},
                         {"scaling_efficiency", p.scaling_efficiency}});
    }
    doc["scaling"] = std::move(scaling);
  }
  return doc.dump(2) + "\n";
}

}  // namespace zeroshard
