#include "examples/mlp/demo_report.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {
namespace mlp {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
const char* const kParamNames[kNumBlockParams] = {"w1", "b1", "w2", "b2"};

std::string ParamName(const RunResult& run, int index) {
  if (index >= 0 && index < static_cast<int>(run.param_names.size())) {
    return run.param_names[static_cast<size_t>(index)];
  }
  return absl::StrFormat("block.%d %s", index / kNumBlockParams,
                         kParamNames[index % kNumBlockParams]);
}

std::string WithCommas(int64_t n) {
  std::string digits = absl::StrFormat("%d", n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

// Steps (1-based) at which the loss table has a row.
std::vector<int64_t> LossTableSteps(int64_t steps) {
  std::vector<int64_t> rows = {1, steps / 10, steps / 4, steps / 2, 3 * steps / 4, steps};
  rows.erase(std::remove_if(rows.begin(), rows.end(), [&](int64_t s) { return s < 1; }),
             rows.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

void PrintLoss(const DemoOptions& opts, const DemoResults& r, std::FILE* out) {
  std::fprintf(
      out, "\nloss (%s, mean over the global batch)\n",
      opts.model.lm() ? "cross-entropy to the teacher LM's next token" : "MSE to the teacher");
  std::fprintf(out, "  %6s  %12s  %12s  %10s\n", "step", "distributed", "baseline", "|diff|");
  const int64_t first = r.distributed.first_step;
  const size_t n = std::min(first + r.distributed.losses.size(), r.baseline.losses.size());
  for (int64_t s : LossTableSteps(static_cast<int64_t>(n))) {
    const double b = r.baseline.losses[s - 1];
    if (s <= first) {
      // Trained before the resumed checkpoint, by another process.
      std::fprintf(out, "  %6d  %12s  %12.6f  %10s\n", static_cast<int>(s), "(resumed)", b, "");
      continue;
    }
    const double d = r.distributed.losses[s - first - 1];
    std::fprintf(out, "  %6d  %12.6f  %12.6f  %10.3g\n", static_cast<int>(s), d, b,
                 std::fabs(d - b));
  }
}

void PrintWeights(const DemoOptions& opts, const DemoResults& r, std::FILE* out) {
  const WeightComparison c = CompareWeights(r.distributed.params, r.baseline.params);
  std::fprintf(out, "\nfinal weights vs baseline (fp32 master, %zu params, %s values)\n",
               r.baseline.params.size(), WithCommas(c.values).c_str());
  std::fprintf(out,
               "  max |diff| %.3g (%s); max relative diff %.3g (max|diff| / max|w| per param)\n",
               c.max_abs, ParamName(r.baseline, c.max_abs_param).c_str(), c.max_rel);
  const int64_t resumed_total = r.distributed.resumed_accum_total;
  if (r.distributed.first_step > 0 && !r.distributed.resumed_changes.empty()) {
    std::fprintf(out,
                 "  (resumed with changed settings: %s; the distributed run is not the "
                 "baseline's from step %lld on)\n",
                 r.distributed.resumed_changes.c_str(),
                 static_cast<long long>(r.distributed.first_step));
    return;
  }
  if (r.distributed.first_step > 0 && resumed_total != r.world * opts.accum) {
    std::fprintf(out,
                 "  (resumed from a checkpoint written by %d rank(s) with %d micro-batches per "
                 "step; the baseline used %d throughout, so the runs saw other global batches "
                 "before step %lld: compare with a run resumed at the same global batch)\n",
                 r.distributed.resumed_world, static_cast<int>(resumed_total), r.world * opts.accum,
                 static_cast<long long>(r.distributed.first_step));
    return;
  }
  if (opts.device_cuda) {
    std::fprintf(out,
                 "  bitwise identical: %s (not expected: the GPU's matrix products (cuBLASLt) sum "
                 "in another order than the CPU baseline's BLAS; the engine's own arithmetic is "
                 "bitwise, see engine_cuda_test)\n",
                 c.bitwise_identical ? "yes" : "no");
    return;
  }
  if (opts.zeropp.quantized_weights || opts.zeropp.quantized_grad_bits != 0) {
    // qwZ and qgZ change the numerics: compare the loss curves instead.
    const std::vector<double>& d = r.distributed.losses;
    const std::vector<double>& b = r.baseline.losses;
    const size_t n = std::min(d.size(), b.size());
    double worst = 0;
    size_t worst_step = 0;
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
      finite = finite && std::isfinite(d[i]);
      const double rel = std::fabs(d[i] - b[i]) / std::max(std::fabs(b[i]), 1e-300);
      if (rel > worst) {
        worst = rel;
        worst_step = i + 1;
      }
    }
    if (n > 0) {
      std::fprintf(out,
                   "  loss vs baseline: max relative difference %.3g (step %zu of %zu)%s; final "
                   "%.6g vs %.6g\n",
                   worst, worst_step, n, finite ? "" : ", NON-FINITE losses", d[n - 1], b[n - 1]);
    }
    std::fprintf(out, "  bitwise identical: %s (not expected: ZeRO++ %s)\n",
                 c.bitwise_identical ? "yes" : "no",
                 opts.zeropp.quantized_weights && opts.zeropp.quantized_grad_bits != 0
                     ? "qwZ and qgZ train on int8-quantized params and quantized gradients"
                 : opts.zeropp.quantized_weights ? "qwZ trains on int8-quantized params"
                                                 : "qgZ steps on quantized gradients");
    return;
  }
  // One micro-batch per dp rank accumulates like the baseline; so does a
  // pipeline on one dp rank (its micro-batches summed in order). A tp split
  // reorders the row-parallel sums.
  const int per_dp_rank = opts.accum * r.grid.tp * r.grid.pp;
  const bool expect_bitwise =
      opts.precision == Precision::kFp32 && r.grid.tp == 1 && (per_dp_rank == 1 || r.grid.dp == 1);
  const char* why_not =
      r.grid.tp > 1 ? " (not expected: tensor parallelism sums the row-parallel products in "
                      "another order; see docs/parallelism.md for the tolerance)"
                    : " (not expected: with accumulation over several dp ranks, bf16 or fp16 "
                      "the summation order or rounding differs)";
  std::fprintf(out, "  bitwise identical: %s%s\n", c.bitwise_identical ? "yes" : "no",
               expect_bitwise ? (c.bitwise_identical
                                     ? " (as expected: fp32, the baseline's accumulation order)"
                                     : "  <-- UNEXPECTED: fp32 in the baseline's accumulation "
                                       "order must match bit for bit")
                              : why_not);
}

void PrintMemory(const DemoResults& r, std::FILE* out) {
  // Columns: every category that holds bytes in either run.
  std::vector<int> cats;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    bool used = false;
    for (const RunResult* run : {&r.distributed, &r.stage0}) {
      for (const LedgerRow& row : run->ledger) used = used || row[c] != 0;
    }
    if (used) cats.push_back(c);
  }
  std::fprintf(out, "\nmemory per rank (device ledger, current MiB = 2^20 bytes)\n  %-10s", "");
  for (int c : cats) std::fprintf(out, " %10s", MemoryCategoryName(static_cast<MemoryCategory>(c)));
  std::fprintf(out, " %13s %11s\n", "model states", "vs stage 0");
  auto print_row = [&](const std::string& label, const LedgerRow& row, const LedgerRow* ref) {
    std::fprintf(out, "  %-10s", label.c_str());
    for (int c : cats) std::fprintf(out, " %10.3f", row[c] / kMiB);
    const int64_t states = row[kNumMemoryCategories];
    std::fprintf(out, " %13.3f", states / kMiB);
    if (ref != nullptr && (*ref)[kNumMemoryCategories] > 0) {
      std::fprintf(out, " %10.3fx", static_cast<double>(states) / (*ref)[kNumMemoryCategories]);
    }
    std::fprintf(out, "\n");
  };
  for (size_t i = 0; i < r.distributed.ledger.size(); ++i) {
    const LedgerRow* ref = i < r.stage0.ledger.size() ? &r.stage0.ledger[i] : nullptr;
    print_row(absl::StrFormat("rank %d", i), r.distributed.ledger[i], ref);
  }
  for (size_t i = 0; i < r.stage0.ledger.size(); ++i) {
    print_row(absl::StrFormat("stage0 r%d", i), r.stage0.ledger[i], nullptr);
  }
  if (r.grid.tp * r.grid.pp == 1 && !r.distributed.ledger.empty()) {
    // Exact bytes, to set against the estimator's per-GPU figures for the
    // same model (mlp_demo --print-spec; docs/estimator.md).
    int64_t states = 0, total = 0;
    for (const LedgerRow& row : r.distributed.ledger) {
      int64_t sum = 0;
      for (int c = 0; c < kNumMemoryCategories; ++c) sum += row[c];
      states = std::max(states, row[kNumMemoryCategories]);
      total = std::max(total, sum);
    }
    std::fprintf(out,
                 "  largest rank, bytes: model states %lld, engine total %lld (zeroshard estimate "
                 "--spec of --print-spec's file, same --gpus/--stage/--precision/--grad-accum, "
                 "--reserve 0 --workspace 0: model_states and total)\n",
                 static_cast<long long>(states), static_cast<long long>(total));
  }
  if (r.planned_bytes > 0) {
    // The planner sized the run with the engine's own buffer plan, so the
    // largest rank's ledger must show exactly its figure.
    int64_t largest = 0;
    for (const LedgerRow& row : r.distributed.ledger) {
      int64_t total = 0;
      for (int c = 0; c < kNumMemoryCategories; ++c) total += row[c];
      largest = std::max(largest, total);
    }
    std::fprintf(out,
                 "  planner's figure for this grid: %s (%lld bytes) per rank; ledger, largest "
                 "rank: %s (%lld bytes)%s\n",
                 FormatSize(r.planned_bytes).c_str(), static_cast<long long>(r.planned_bytes),
                 FormatSize(largest).c_str(), static_cast<long long>(largest),
                 largest == r.planned_bytes ? " (equal)" : "  <-- UNEXPECTED: plan != ledger");
  }
}

void PrintTimes(const DemoOptions& opts, const DemoResults& r, std::FILE* out) {
  std::fprintf(out,
               "\ntime per step (ms; Engine::Stats().totals / steps; the first six add up to "
               "total; hidden comm: the collectives' run time not waited for, outside the "
               "split)\n");
  if (!UsesGrid(opts)) {
    const std::string data = opts.sync_data
                                 ? std::string(
                                       "made on the trainer's thread (--sync-data): all of it is "
                                       "input wait")
                                 : absl::StrFormat(
                                       "a data loader thread, %d micro-batches ahead; input "
                                       "wait is the time the trainer blocked on it",
                                       MakeDataLoaderOptions(opts).depth);
    std::fprintf(out, "  data: %s\n", data.c_str());
  }
  std::fprintf(out, "  %-10s %9s %13s %10s %11s %12s %9s %9s %12s\n", "", "compute", "exposed comm",
               "optimizer", "input wait", "engine other", "bubble", "total", "hidden comm");
  auto print_row = [&](const std::string& label, const std::vector<double>& ms) {
    if (ms.size() < kNumTimeColumns) return;
    std::fprintf(out, "  %-10s %9.2f %13.2f %10.2f %11.2f %12.2f %9.2f %9.2f %12.2f\n",
                 label.c_str(), ms[kComputeMs], ms[kExposedCommMs], ms[kOptimizerMs],
                 ms[kInputWaitMs], ms[kEngineOtherMs], ms[kPipelineBubbleMs], ms[kTotalMs],
                 ms[kHiddenCommMs]);
  };
  double bubble = 0.0, total = 0.0;
  for (size_t i = 0; i < r.distributed.step_ms.size(); ++i) {
    print_row(absl::StrFormat("rank %d", i), r.distributed.step_ms[i]);
    bubble += r.distributed.step_ms[i][kPipelineBubbleMs];
    total += r.distributed.step_ms[i][kTotalMs];
  }
  if (!r.baseline.step_ms.empty()) print_row("baseline", r.baseline.step_ms[0]);
  // The slowest rank's medians (perf/peers sets the second against PyTorch's
  // median step, whose data are made outside its timed step).
  double median_total = 0.0, median_less_input = 0.0;
  for (const std::vector<double>& ms : r.distributed.step_ms) {
    if (ms.size() < kNumTimeColumns) continue;
    median_total = std::max(median_total, ms[kMedianTotalMs]);
    median_less_input = std::max(median_less_input, ms[kMedianLessInputMs]);
  }
  std::fprintf(
      out,
      "  distributed run, median step after %d warm-up steps, slowest rank: total %.2f ms, "
      "less input wait %.2f ms\n",
      kTimingWarmupSteps, median_total, median_less_input);
  if (r.grid.pp > 1 && total > 0) {
    // 1F1B with equal stages idles (p - 1) / (m + p - 1) of a step.
    const int m = r.grid.tp * r.grid.pp * opts.accum;
    std::fprintf(out,
                 "  pipeline bubble: %.1f%% of the ranks' step time (1F1B ideal with %d stages "
                 "and %d micro-batches: (p-1)/(m+p-1) = %.1f%%)\n",
                 100.0 * bubble / total, r.grid.pp, m,
                 100.0 * (r.grid.pp - 1) / (m + r.grid.pp - 1));
  }
}

}  // namespace

std::string FormatSize(int64_t bytes) {
  const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%d B", bytes)
                   : absl::StrFormat("%.1f %s", value, units[unit]);
}

namespace {

// With optimizer tiers or step times: one row per candidate, its bytes per
// tier, its predicted step and why it was or was not chosen.
void PrintGridCandidates(const GridPlan& plan, std::FILE* out) {
  std::fprintf(out,
               "mlp_demo: planner (PlanGrid), cap %s per device rank on %d ranks; %s\n"
               "          (bytes per rank of the largest pipeline stage, by tier; < chosen)\n",
               FormatSize(plan.per_rank_cap_bytes).c_str(), plan.world,
               plan.by_time ? "the fastest that fits by the calibrated step model (--machine)"
                            : "the first that fits in preference order");
  std::fprintf(out, "    %-12s %5s %-9s %11s %11s %11s %11s  %s\n", "tp x pp x dp", "stage",
               "optimizer", "device", "host", "nvme", "step (s)", "why");
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const GridCandidate& c = plan.candidates[i];
    const std::string step =
        plan.by_time ? absl::StrFormat("%.4f", c.step_seconds) : std::string("-");
    std::fprintf(out, "    %-12s %5d %-9s %11s %11s %11s %11s%s %s\n",
                 absl::StrFormat("%d x %d x %d", c.tp, c.pp, c.dp).c_str(), c.stage,
                 MemoryTierName(c.optimizer_tier), FormatSize(c.per_rank_bytes).c_str(),
                 FormatSize(c.host_bytes).c_str(), FormatSize(c.nvme_bytes).c_str(), step.c_str(),
                 static_cast<int>(i) == plan.chosen ? "<" : " ", c.reason.c_str());
  }
}

}  // namespace

void PrintGridPlan(const GridPlan& plan, int micro_batches, std::FILE* out) {
  const bool tiers =
      std::any_of(plan.candidates.begin(), plan.candidates.end(),
                  [](const GridCandidate& c) { return c.optimizer_tier != MemoryTier::kDevice; });
  if (tiers || plan.by_time) {
    PrintGridCandidates(plan, out);
    const GridCandidate& chosen = plan.chosen_candidate();
    std::fprintf(out, "mlp_demo: chosen: %s\n", plan.description.c_str());
    std::fprintf(out,
                 "mlp_demo: grid dp %d x tp %d x pp %d, ZeRO stage %d over dp, optimizer on "
                 "the %s tier, %d micro-batches per dp rank\n",
                 chosen.dp, chosen.tp, chosen.pp, chosen.stage,
                 MemoryTierName(chosen.optimizer_tier), micro_batches);
    return;
  }
  std::fprintf(out,
               "mlp_demo: planner (PlanGrid), cap %s per rank on %d ranks; per-rank bytes of "
               "each candidate\n"
               "          (model states and engine buffers of its largest pipeline stage; "
               "* fits the cap, < chosen)\n",
               FormatSize(plan.per_rank_cap_bytes).c_str(), plan.world);
  std::fprintf(out, "    %-14s %12s %12s %12s %12s\n", "tp x pp x dp", "stage 0", "stage 1",
               "stage 2", "stage 3");
  // Candidates come in preference order, the four stages of a split together.
  for (size_t i = 0; i + 3 < plan.candidates.size(); i += 4) {
    const GridCandidate& c = plan.candidates[i];
    std::fprintf(out, "    %-14s", absl::StrFormat("%d x %d x %d", c.tp, c.pp, c.dp).c_str());
    for (size_t s = i; s < i + 4; ++s) {
      const GridCandidate& at = plan.candidates[s];
      const char* mark = static_cast<int>(s) == plan.chosen ? "<" : at.fits ? "*" : " ";
      std::fprintf(out, " %11s%s", FormatSize(at.per_rank_bytes).c_str(), mark);
    }
    std::fprintf(out, "\n");
  }
  const GridCandidate& chosen = plan.chosen_candidate();
  std::fprintf(out, "mlp_demo: chosen: %s\n", plan.description.c_str());
  std::fprintf(out,
               "mlp_demo: grid dp %d x tp %d x pp %d, ZeRO stage %d over dp, %d micro-batches per "
               "dp rank\n",
               chosen.dp, chosen.tp, chosen.pp, chosen.stage, micro_batches);
}

WeightComparison CompareWeights(const std::vector<std::vector<float>>& a,
                                const std::vector<std::vector<float>>& b) {
  WeightComparison c;
  if (a.size() != b.size()) c.bitwise_identical = false;
  for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) {
    if (a[t].size() != b[t].size()) {
      c.bitwise_identical = false;
      continue;
    }
    double param_max_abs = 0.0, param_scale = 0.0;
    for (size_t i = 0; i < a[t].size(); ++i) {
      const double diff = std::fabs(static_cast<double>(a[t][i]) - b[t][i]);
      param_max_abs = std::max(param_max_abs, diff);
      param_scale = std::max(param_scale, std::fabs(static_cast<double>(b[t][i])));
    }
    if (param_max_abs > c.max_abs) {
      c.max_abs = param_max_abs;
      c.max_abs_param = static_cast<int>(t);
    }
    if (param_scale > 0) c.max_rel = std::max(c.max_rel, param_max_abs / param_scale);
    c.values += static_cast<int64_t>(a[t].size());
    // memcmp, not ==: -0.0 vs 0.0 and NaN payloads count as differences.
    if (std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)) != 0) {
      c.bitwise_identical = false;
    }
  }
  return c;
}

// --offload: rank 0's bytes per tier, the plan's and the ledgers', and what
// the device holds less than it would without offload.
void PrintOffload(const DemoOptions& opts, const DemoResults& r, std::FILE* out) {
  const RunResult& d = r.distributed;
  const OffloadSpec& o = opts.offload;
  const std::string swap =
      o.optimizer == MemoryTier::kNvme ? absl::StrFormat("; swap files in %s", o.dir) : "";
  if (opts.mem_cap > 0) {
    std::fprintf(out, "\noptimizer state on the %s tier (the planner's choice for --mem-cap%s)\n",
                 MemoryTierName(o.optimizer), swap.c_str());
  } else {
    std::fprintf(out,
                 "\noptimizer state on the %s tier (--offload optimizer=%s,grads=%s,params=%s%s)\n",
                 MemoryTierName(o.optimizer), MemoryTierName(o.optimizer), MemoryTierName(o.grads),
                 MemoryTierName(o.params), swap.c_str());
  }
  examples::PrintTierBytes(d.tiers, "rank 0, the engine's buffers", out);
  const int64_t device = d.tiers.plan[static_cast<int>(MemoryTier::kDevice)];
  std::fprintf(
      out,
      "  device bytes: %lld, without offload %lld (the plan): %lld less (%.1f%%); "
      "ledger %s plan on every tier\n",
      static_cast<long long>(device), static_cast<long long>(d.device_plan_without_offload),
      static_cast<long long>(d.device_plan_without_offload - device),
      d.device_plan_without_offload > 0
          ? 100.0 * (d.device_plan_without_offload - device) / d.device_plan_without_offload
          : 0.0,
      d.tiers.ledger_equals_plan() ? "==" : "!=");
}

void PrintReport(const DemoOptions& opts, const DemoResults& r, std::FILE* out) {
  const MlpConfig& m = opts.model;
  // Stored params: a tied alias is its owner's tensor, counted once.
  int64_t params = 0, trainable = 0;
  for (const UnitSpec& unit : BuildModelSpec(m).units) {
    for (const ParamSpec& p : unit.params) {
      if (p.tied_to.has_value()) continue;
      params += p.NumElements();
      if (p.trainable) trainable += p.NumElements();
    }
  }
  const int64_t global_batch = static_cast<int64_t>(r.world) * opts.accum * m.micro_batch;
  std::fprintf(out,
               "mlp_demo: residual MLP, %d blocks x hidden %d (%s params), exact-erf GELU,\n"
               "          micro-batch %d, global batch %d samples per step\n",
               m.blocks, static_cast<int>(m.hidden), WithCommas(params).c_str(), m.micro_batch,
               static_cast<int>(global_batch));
  if (m.lm()) {
    std::fprintf(out,
                 "          language model: vocab %d, embedding tied to the head, cross-entropy\n",
                 static_cast<int>(m.vocab));
  }
  if (m.lora()) {
    std::fprintf(out,
                 "          LoRA rank %d, scale %g: %s trainable, base weights%s frozen; adapters "
                 "lr x %g, weight decay %g\n",
                 m.lora_rank, m.LoraScale(), WithCommas(trainable).c_str(),
                 m.lm() ? ", embedding and head" : "", m.adapter_lr_scale,
                 m.adapter_weight_decay.value_or(opts.weight_decay));
  }
  if (r.baseline.activation_bytes > 0) {
    std::fprintf(out, "          activations kept per micro-batch: %s%s\n",
                 FormatSize(r.baseline.activation_bytes).c_str(),
                 m.recompute ? " (--recompute: block inputs only)" : "");
  }
  std::string grid;
  if (!r.grid_origin.empty()) {
    grid = absl::StrFormat(" as %s (%s)", r.grid.ToString(), r.grid_origin);
  }
  std::string distributed =
      absl::StrFormat("%d ranks%s (%s), ZeRO stage %d, %s, accum %d", r.world, grid,
                      opts.backend_mpi   ? (opts.device_cuda ? "mpi, nccl on GPUs" : "mpi")
                      : opts.device_cuda ? "threads on GPU 0"
                                         : "local threads",
                      opts.stage, PrecisionName(opts.precision), opts.accum);
  if (opts.stage == 3) {
    absl::StrAppendFormat(&distributed, ", prefetch %d%s", opts.prefetch,
                          r.distributed.prefetch_active ? "" : " (inactive)");
  }
  if (opts.zeropp.any() || opts.hpz) {
    absl::StrAppend(&distributed, ", ZeRO++", opts.zeropp.quantized_weights ? " qwZ" : "",
                    opts.hpz ? " hpZ" : "");
    if (const int bits = opts.zeropp.quantized_grad_bits; bits != 0) {
      absl::StrAppend(&distributed, " qgZ(int", bits, ")");
    }
  }
  const std::string baseline =
      absl::StrFormat("1 rank, ZeRO stage 0, %s, accum %d%s", PrecisionName(opts.precision),
                      r.world * opts.accum, opts.device_cuda ? ", CPU" : "");
  std::fprintf(out, "  distributed: %-52s %6.1f s\n", distributed.c_str(),
               r.distributed.wall_seconds);
  if (!r.nodes.empty()) std::fprintf(out, "  nodes:       %s\n", r.nodes.c_str());
  if (!r.collective_path.empty()) {
    std::fprintf(out, "  collectives: %s\n", r.collective_path.c_str());
  }
  if (!r.collective_path.empty()) {
    const int64_t steps = std::max<int64_t>(1, opts.steps - r.distributed.first_step);
    std::fprintf(out,
                 "  traffic:     %.3f MB across nodes (%.3f MB per step), %.3f MB within nodes "
                 "(all ranks' messages%s, MB = 10^6 bytes)\n",
                 r.inter_node_bytes / 1e6, r.inter_node_bytes / 1e6 / steps,
                 r.intra_node_bytes / 1e6,
                 opts.hpz ? "; hpZ's gathers within a node not counted" : "");
  }
  std::fprintf(out, "  baseline:    %-52s %6.1f s\n", baseline.c_str(), r.baseline.wall_seconds);
  std::fprintf(out,
               "  AdamW lr %g (warmup + cosine to 10%%), weight decay %g, clip %g: clipped steps "
               "%d vs %d, skipped %d vs %d\n",
               opts.lr, opts.weight_decay, opts.clip, static_cast<int>(r.distributed.clipped_steps),
               static_cast<int>(r.baseline.clipped_steps),
               static_cast<int>(r.distributed.skipped_steps),
               static_cast<int>(r.baseline.skipped_steps));
  std::fprintf(out, "  BLAS (the CPU's products, 1 thread per rank): %s\n",
               BlasDescription().c_str());
  if (opts.precision == Precision::kFp16Mixed) {
    std::fprintf(out,
                 "  fp16 dynamic loss scaling: final loss scale %g vs %g, skipped steps %d vs %d "
                 "(distributed vs baseline)\n",
                 r.distributed.final_loss_scale, r.baseline.final_loss_scale,
                 static_cast<int>(r.distributed.skipped_steps),
                 static_cast<int>(r.baseline.skipped_steps));
  }
  PrintLoss(opts, r, out);
  PrintWeights(opts, r, out);
  PrintMemory(r, out);
  if (opts.offload.enabled()) PrintOffload(opts, r, out);
  PrintTimes(opts, r, out);
  std::fprintf(out, "\ntotal wall time: %.1f s\n", absl::ToDoubleSeconds(absl::Now() - r.start));
}

}  // namespace mlp
}  // namespace zeroshard
