// offload_bench: the optimizer phase of the host and NVMe tiers (issue 21,
// docs/offload.md) against each tier's own limits, measured side by side in
// one run, and the whole training step with and without offload.
//
//   build/perf/runtime/offload_bench                          # 64M params, fp32 and bf16
//   build/perf/runtime/offload_bench --params 256M --offload-dir /mnt/nvme/tmp --json o.json
//
// offload_phase.cc drives the engine's own OffloadOptimizer (an internal
// header: its parts switch OffloadApplyParts exists for this bench) over a
// synthetic model of --params elements in --units units, on one rank (stage
// 1, world 1: the rank owns the whole state), with the CPU device: its "device"
// memory is host memory and a device copy is a memcpy on a copy stream, so
// on this machine the copies cost what host memory bandwidth costs; on a GPU
// they would be PCIe/NVLink copies. Per repeat, interleaved, for each
// precision:
//
//  host tier (state in host memory):
//   phase    Apply with everything: gradients to the host and params back on
//            the copy stream, AdamW on the host stream, chunk by chunk;
//   adamw    Apply with the update only (no copies): the host AdamW alone;
//   copies   Apply with the copies only (no update);
//   streams  the same-traffic streams baseline (perf/kernels/
//            streams_baseline.h, as adam_bench) over the same chunks: the
//            roofline of the update's memory traffic;
//   phase / max(adamw, copies): 1.0 means the copies (or the update) hide
//            completely behind the other;
//   hidden   the copies' hidden fraction = 1 - (phase - adamw) / copies,
//            clamped to [0, 1]: the share of the copies' own time that did
//            not add to the phase (1: fully overlapped, 0: fully exposed).
//
//  NVMe tier (state in swap files under --offload-dir):
//   phase    Apply with everything (reads ahead, writes behind, copies, AdamW);
//   adamw    Apply with the update only (on the three state slots);
//   io       Apply with the I/O only;
//   disk     the disk's own time for the same bytes through the same I/O path
//            (SwapFiles, MeasureSequentialSeconds): one sequential read and
//            one sequential write of every state tensor, in chunks of the
//            phase's chunk, --in-flight transfers at a time, summed (read +
//            write: the phase reads and writes every byte once);
//   phase / max(adamw, disk) against --limit (1.25): PASS or FAIL.
//   crc32c   the swap files' checksums' cost (issue 34): the same
//            sequential passes over files without them (SwapOptions::verify
//            false), interleaved with the disk passes; per repeat
//            100 x (with / without - 1) for the read and the write path.
//  `dd` (iflag/oflag=direct, bs = the chunk's bytes) over the same bytes in
//  the same directory, once, for reference; fio where installed.
//
//  step (unless --step-repeats 0): the mlp_demo model trained by MlpTrainer
//  on one rank with the optimizer state on the device, host and NVMe tiers
//  (three engines, the same data), --step-steps steps per tier per repeat,
//  tiers interleaved; the median over repeats of the wall ms per step, the
//  engine's optimizer part, and the overhead against the device tier.
//
// Times are medians over --repeats (min and max printed); every Apply is
// warmed once first. Exit 1 when the step's tiers disagree (final losses
// not the same bits, or a ledger != its plan); --check: also when an NVMe
// ratio is over --limit (without it the timing exits 0 either way).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "examples/common/scratch_dir.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/model_flags.h"
#include "nlohmann/json.hpp"
#include "perf/bench_json.h"
#include "perf/bench_main.h"
#include "perf/runtime/mlp_bench_train_spec.h"
#include "perf/runtime/offload_phase.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {
namespace {

struct BenchOptions : perf::PhaseOptions {
  std::string dir;  // empty: a fresh directory under /tmp
  std::vector<Precision> precisions = {Precision::kFp32, Precision::kBf16Mixed};
  bool check = false;
  bool dd = true;
  int step_repeats = 11;
  int step_steps = 4;
  mlp::MlpConfig model = mlp::MlpShape(/*hidden=*/256, /*blocks=*/5, /*micro_batch=*/16);
  std::string json_path;
};

void PrintUsage() {
  const BenchOptions d;
  std::printf(
      "usage: offload_bench [flags]\n"
      "The optimizer phase of the host and NVMe tiers against the host AdamW alone, the\n"
      "copies alone, the same-traffic streams baseline and the disk's own time for the same\n"
      "bytes, measured side by side; then the training step per tier (docs/perf.md).\n\n"
      "  --params N          optimizer state elements (default %lld; K/M/G suffixes)\n"
      "  --units U           units the params are split into (default %d)\n"
      "  --chunk N           elements per streamed chunk, a multiple of 1024 (default %lld)\n"
      "  --offload-dir DIR   the swap files' directory (default: a fresh one under /tmp,\n"
      "                      removed at the end)\n"
      "  --repeats R         interleaved repeats; medians are printed (default %d)\n"
      "  --precision LIST    fp32, bf16, fp16 (default fp32,bf16)\n"
      "  --tiers LIST        host, nvme (default host,nvme)\n"
      "  --in-flight K       the disk measurement's transfers in flight (default %d)\n"
      "  --limit X           NVMe phase / max(adamw, disk) must be <= X (default %.2f)\n"
      "  --check             exit 1 when an NVMe ratio is over --limit\n"
      "  --no-dd             skip the dd reference\n"
      "  --step-repeats R    training-step repeats per tier, 0 = skip (default %d)\n"
      "  --step-steps S      steps per tier per repeat (default %d)\n"
      "  --hidden H --blocks B --micro-batch M   the step's MLP (default %lld, %d, %d)\n"
      "  --json FILE         write the results as JSON\n"
      "  --help              this text\n",
      static_cast<long long>(d.params), d.units, static_cast<long long>(d.chunk), d.repeats,
      d.in_flight, d.limit, d.step_repeats, d.step_steps, static_cast<long long>(d.model.hidden),
      d.model.blocks, d.model.micro_batch);
}

// "64M" -> 64 * 2^20 (K, M, G binary), or a plain count.
absl::StatusOr<int64_t> ParseCount(const std::string& flag, const std::string& text) {
  int64_t scale = 1;
  std::string digits = text;
  if (!digits.empty()) {
    const char last = digits.back();
    scale = last == 'K' || last == 'k'   ? int64_t{1} << 10
            : last == 'M' || last == 'm' ? int64_t{1} << 20
            : last == 'G' || last == 'g' ? int64_t{1} << 30
                                         : 1;
    if (scale != 1) digits.pop_back();
  }
  ZS_ASSIGN_OR_RETURN(int64_t n, cli::ParseIntFlag(flag, digits, 1, (int64_t{1} << 40) / scale));
  return n * scale;
}

absl::StatusOr<BenchOptions> ParseFlags(int argc, char** argv, bool* help) {
  BenchOptions opts;
  bool no_dd = false;
  cli::FlagSet flags;
  mlp::AddModelFlags(flags, &opts.model);
  flags
      .Custom("params",
              [&](const std::string& v) -> absl::Status {
                ZS_ASSIGN_OR_RETURN(opts.params, ParseCount("--params", v));
                return absl::OkStatus();
              })
      .Int("units", &opts.units, 1, 4096)
      .Custom("chunk",
              [&](const std::string& v) -> absl::Status {
                ZS_ASSIGN_OR_RETURN(opts.chunk, ParseCount("--chunk", v));
                return absl::OkStatus();
              })
      .String("offload-dir", &opts.dir)
      .Int("repeats", &opts.repeats, 1, cli::kMaxCount)
      .Custom("precision",
              [&](const std::string& v) -> absl::Status {
                opts.precisions.clear();
                for (absl::string_view word : absl::StrSplit(v, ',')) {
                  ZS_ASSIGN_OR_RETURN(Precision p, ParsePrecision(std::string(word)));
                  opts.precisions.push_back(p);
                }
                return absl::OkStatus();
              })
      .Custom(
          "tiers",
          [&](const std::string& v) -> absl::Status {
            opts.host = opts.nvme = false;
            for (absl::string_view word : absl::StrSplit(v, ',')) {
              ZS_ASSIGN_OR_RETURN(int t, cli::ParseChoiceFlag("--tiers", word, {"host", "nvme"}));
              (t == 0 ? opts.host : opts.nvme) = true;
            }
            return absl::OkStatus();
          })
      .Int("in-flight", &opts.in_flight, 1, 64)
      .Number("limit", &opts.limit, 0, 1e9, /*lo_open=*/true)
      .Switch("check", &opts.check)
      .Switch("no-dd", &no_dd)
      .Int("step-repeats", &opts.step_repeats, 0, cli::kMaxCount)
      .Int("step-steps", &opts.step_steps, 1, cli::kMaxCount)
      .String("json", &opts.json_path);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  if (*help) return opts;
  opts.dd = !no_dd;
  if (opts.chunk % 1024 != 0 || opts.chunk > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--chunk %d must be a multiple of 1024 (4 KiB of fp32, the direct-I/O alignment) and "
        "at most 2^30",
        opts.chunk));
  }
  if (opts.params < opts.units) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--params %d is fewer than --units %d: give each unit an element",
                        opts.params, opts.units));
  }
  ZS_RETURN_IF_ERROR(opts.model.Validate());
  return opts;
}

nlohmann::json SpreadJson(const perf::Spread& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

// The CPU's model name (/proc/cpuinfo), and the CPUs online.
std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return absl::StrFormat("%s (%d CPUs online)", line.substr(colon + 2),
                               static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
      }
    }
  }
  return "unknown (no model name in /proc/cpuinfo)";
}

// The training step per tier: three engines on the mlp_demo model, the
// same data, steps interleaved by tier.
struct StepTier {
  MemoryTier tier;
  perf::Spread wall_ms, optimizer_ms;
  perf::Spread overhead_pct;            // per repeat against the device tier (paired)
  int64_t plan_bytes[3] = {0, 0, 0};    // device, host, NVMe
  int64_t ledger_bytes[3] = {0, 0, 0};  // the engine's, after the steps
  double final_loss = 0;
};

struct StepComparison {
  std::vector<StepTier> tiers;
  bool losses_equal = true;
  int64_t params = 0;
};

absl::StatusOr<StepComparison> RunSteps(const BenchOptions& opts, Precision precision,
                                        const std::string& dir) {
  const MemoryTier tiers[] = {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme};
  struct Run {
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Device> device;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<mlp::MlpTrainer> trainer;
    std::vector<double> wall_ms, optimizer_ms;
    double loss = 0;
  };
  std::vector<Run> runs(3);
  StepComparison out;
  out.params = mlp::BuildModelSpec(opts.model).NumParams();
  for (int t = 0; t < 3; ++t) {
    Run& run = runs[t];
    ZS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> group, CreateLocalGroup(1));
    run.comm = std::move(group[0]);
    run.device = CreateCpuDevice();
    TrainSpec train = perf::MlpBenchTrainSpec(/*stage=*/1, precision, /*prefetch_units=*/1);
    train.offload.optimizer = tiers[t];
    train.offload.dir = tiers[t] == MemoryTier::kNvme ? dir : "";
    train.offload.chunk_numel = opts.chunk;
    ZS_ASSIGN_OR_RETURN(run.engine,
                        mlp::CreateMlpEngine(opts.model, train, *run.device, *run.comm));
    run.trainer = std::make_unique<mlp::MlpTrainer>(opts.model, *run.engine, *run.comm);
    ZS_RETURN_IF_ERROR(run.engine->Start(mlp::TrainerSettings(opts.model)));
    ZS_RETURN_IF_ERROR(run.trainer->TrainStep().status());  // warm-up
    StepTier st;
    st.tier = tiers[t];
    ZS_ASSIGN_OR_RETURN(BufferPlan plan,
                        PlanEngineBuffers(mlp::BuildModelSpec(opts.model), train, 1));
    for (int k = 0; k < 3; ++k) st.plan_bytes[k] = plan.total_bytes(static_cast<MemoryTier>(k));
    out.tiers.push_back(st);
  }
  for (int r = 0; r < opts.step_repeats; ++r) {
    for (int i = 0; i < 3; ++i) {
      Run& run = runs[(r + i) % 3];  // rotate which tier goes first
      const EngineStats before = run.engine->Stats();
      const auto start = std::chrono::steady_clock::now();
      for (int s = 0; s < opts.step_steps; ++s) {
        ZS_ASSIGN_OR_RETURN(run.loss, run.trainer->TrainStep());
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      const EngineStats after = run.engine->Stats();
      run.wall_ms.push_back(ms / opts.step_steps);
      run.optimizer_ms.push_back(
          absl::ToDoubleMilliseconds(after.totals.optimizer - before.totals.optimizer) /
          opts.step_steps);
    }
  }
  for (int t = 0; t < 3; ++t) {
    StepTier& st = out.tiers[t];
    st.wall_ms = perf::SpreadOf(runs[t].wall_ms);
    st.optimizer_ms = perf::SpreadOf(runs[t].optimizer_ms);
    st.final_loss = runs[t].loss;
    for (int k = 0; k < 3; ++k) {
      st.ledger_bytes[k] = runs[t].engine->tier_ledger(static_cast<MemoryTier>(k)).current_total();
    }
    std::vector<double> overhead;
    for (size_t r = 0; r < runs[t].wall_ms.size(); ++r) {
      overhead.push_back(100.0 * (runs[t].wall_ms[r] / runs[0].wall_ms[r] - 1.0));
    }
    st.overhead_pct = perf::SpreadOf(overhead);
    if (std::memcmp(&runs[t].loss, &runs[0].loss, sizeof(double)) != 0) out.losses_equal = false;
  }
  return out;
}

std::string Ms(const perf::Spread& s) {
  return absl::StrFormat("%8.1f [%.1f, %.1f]", s.median * 1e3, s.min * 1e3, s.max * 1e3);
}

void PrintPrecision(const BenchOptions& opts, const perf::PrecisionResult& r) {
  std::printf("\n== %s: %lld state elements (%.1f MiB per fp32 tensor), chunks of %lld ==\n",
              PrecisionName(r.precision), static_cast<long long>(r.state_numel),
              r.state_numel * 4.0 / 1048576.0, static_cast<long long>(r.chunk));
  if (r.host) {
    const perf::HostResult& h = *r.host;
    std::printf("host tier (%s)\n", h.describe.c_str());
    std::printf("  %-34s %s ms\n", "phase (copies + AdamW)", Ms(h.phase).c_str());
    std::printf("  %-34s %s ms\n", "AdamW alone", Ms(h.adamw).c_str());
    std::printf("  %-34s %s ms  (%.1f MiB moved, %.2f GB/s)\n", "copies alone",
                Ms(h.copies).c_str(), h.copy_bytes / 1048576.0,
                h.copy_bytes / h.copies.median / 1e9);
    std::printf("  %-34s %s ms  (streams / AdamW alone = %.3f)\n",
                "streams baseline (same traffic)", Ms(h.streams).c_str(), h.adamw_vs_streams);
    std::printf(
        "  phase / max(AdamW, copies) = %.3f [%.3f, %.3f];  copies' hidden fraction = %.3f [%.3f, "
        "%.3f]  (per repeat, median [min, max])\n",
        h.ratio.median, h.ratio.min, h.ratio.max, h.hidden.median, h.hidden.min, h.hidden.max);
    // Where both parts are bound by the same memory, no overlap can hide
    // one behind the other: the phase's bytes (the update's, and each
    // copied byte read and written) over its time against the streams
    // baseline's rate says whether the phase already runs at that limit.
    const double phase_gbps = (h.update_bytes + 2.0 * h.copy_bytes) / h.phase.median / 1e9;
    const double streams_gbps = h.update_bytes / h.streams.median / 1e9;
    std::printf(
        "  memory traffic: phase %.2f GB/s (update %.1f MiB + copies %.1f MiB read and written) "
        "vs streams baseline %.2f GB/s: %.2f of it\n",
        phase_gbps, h.update_bytes / 1048576.0, h.copy_bytes / 1048576.0, streams_gbps,
        phase_gbps / streams_gbps);
  }
  if (r.nvme) {
    const perf::NvmeResult& n = *r.nvme;
    std::printf("NVMe tier (%s)\n", n.describe.c_str());
    std::printf("  %-34s %s ms\n", "phase (I/O + copies + AdamW)", Ms(n.phase).c_str());
    std::printf("  %-34s %s ms\n", "AdamW alone (state slots)", Ms(n.adamw).c_str());
    std::printf("  %-34s %s ms  (%.1f MiB read + written)\n", "I/O alone (the phase's pipeline)",
                Ms(n.io).c_str(), n.io_bytes / 1048576.0);
    std::printf("  %-34s %s ms  (%.2f GB/s)\n", "disk: sequential read", Ms(n.disk_read).c_str(),
                n.io_bytes / 2 / n.disk_read.median / 1e9);
    std::printf("  %-34s %s ms  (%.2f GB/s)\n", "disk: sequential write", Ms(n.disk_write).c_str(),
                n.io_bytes / 2 / n.disk_write.median / 1e9);
    std::printf("  %-34s %s ms  (%.2f GB/s)\n", "disk: sequential read, no crc32c",
                Ms(n.disk_read_unverified).c_str(),
                n.io_bytes / 2 / n.disk_read_unverified.median / 1e9);
    std::printf("  %-34s %s ms  (%.2f GB/s)\n", "disk: sequential write, no crc32c",
                Ms(n.disk_write_unverified).c_str(),
                n.io_bytes / 2 / n.disk_write_unverified.median / 1e9);
    std::printf(
        "  crc32c checks' cost (%s): read path %+.1f%% [%+.1f, %+.1f], write path %+.1f%% "
        "[%+.1f, %+.1f]  (with / without - 1, per repeat)\n",
        n.crc_implementation.c_str(), n.crc_read_overhead_pct.median, n.crc_read_overhead_pct.min,
        n.crc_read_overhead_pct.max, n.crc_write_overhead_pct.median, n.crc_write_overhead_pct.min,
        n.crc_write_overhead_pct.max);
    std::printf(
        "  phase / max(AdamW, disk read + write %.1f ms) = %.3f [%.3f, %.3f]  (per repeat; limit "
        "%.2f): %s\n",
        n.disk.median * 1e3, n.ratio.median, n.ratio.min, n.ratio.max, opts.limit,
        n.pass ? "PASS" : "FAIL");
  }
}

void PrintSteps(const BenchOptions& opts, Precision precision, const StepComparison& s) {
  std::printf(
      "\n== training step, mlp_demo model %d blocks x hidden %lld (%lld params), micro-batch %d, "
      "%s, 1 rank, stage 1; %d repeats x %d steps per tier, interleaved ==\n",
      opts.model.blocks, static_cast<long long>(opts.model.hidden),
      static_cast<long long>(s.params), opts.model.micro_batch, PrecisionName(precision),
      opts.step_repeats, opts.step_steps);
  std::printf("  %-7s %24s %24s %24s | %12s %12s %12s (plan = ledger)\n", "tier", "step ms",
              "optimizer ms", "overhead % (paired)", "device B", "host B", "NVMe B");
  for (const StepTier& t : s.tiers) {
    std::printf(
        "  %-7s %24s %24s %24s | %12lld %12lld %12lld %s\n", MemoryTierName(t.tier),
        Ms({t.wall_ms.median / 1e3, t.wall_ms.min / 1e3, t.wall_ms.max / 1e3}).c_str(),
        Ms({t.optimizer_ms.median / 1e3, t.optimizer_ms.min / 1e3, t.optimizer_ms.max / 1e3})
            .c_str(),
        absl::StrFormat("%.1f [%.1f, %.1f]", t.overhead_pct.median, t.overhead_pct.min,
                        t.overhead_pct.max)
            .c_str(),
        static_cast<long long>(t.plan_bytes[0]), static_cast<long long>(t.plan_bytes[1]),
        static_cast<long long>(t.plan_bytes[2]),
        std::equal(t.plan_bytes, t.plan_bytes + 3, t.ledger_bytes) ? "yes" : "NO");
  }
  std::printf(
      "  device bytes saved: host tier %lld, NVMe tier %lld; final losses bitwise equal: %s\n",
      static_cast<long long>(s.tiers[0].plan_bytes[0] - s.tiers[1].plan_bytes[0]),
      static_cast<long long>(s.tiers[0].plan_bytes[0] - s.tiers[2].plan_bytes[0]),
      s.losses_equal ? "yes" : "NO");
}

nlohmann::json ToJson(const BenchOptions& opts, const std::string& cpu, const std::string& io,
                      const std::vector<perf::PrecisionResult>& results,
                      const std::vector<std::pair<Precision, StepComparison>>& steps,
                      const perf::DdResult& dd, int64_t dd_bytes) {
  nlohmann::json j;
  j["bench"] = "offload_bench";
  j["cpu"] = cpu;
  j["io_backend"] = io;
  j["params"] = opts.params;
  j["units"] = opts.units;
  j["chunk"] = opts.chunk;
  j["repeats"] = opts.repeats;
  j["limit"] = opts.limit;
  j["definitions"] = {
      {"host.ratio",
       "phase / max(adamw, copies) per repeat (paired), median; ratio_range min, max"},
      {"host.hidden",
       "the copies' hidden fraction: 1 - (phase - adamw) / copies per repeat, clamped to [0, 1], "
       "median"},
      {"host.streams", "the same-traffic streams baseline over the same chunks"},
      {"host.phase_gbps",
       "(update_bytes + 2 x copy_bytes) / phase: the phase's memory traffic rate (a memcpy "
       "reads and writes each copied byte)"},
      {"nvme.disk_s",
       "sequential read + sequential write of every state tensor through SwapFiles "
       "(MeasureSequentialSeconds), medians"},
      {"nvme.ratio", "phase / max(adamw, disk) per repeat, median; pass when <= limit"},
      {"nvme.crc_read_overhead_pct",
       "100 x (disk_read_s / disk_read_unverified_s - 1) per repeat, median: the cost of the "
       "swap files' CRC-32C checks on the read path (unverified: SwapOptions::verify false)"},
      {"step.overhead_pct",
       "100 x (step ms of the tier / the device tier's - 1) per repeat (the tiers run back to "
       "back), median"},
      {"times", "seconds: median, min, max over the repeats"},
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const perf::PrecisionResult& r : results) {
    nlohmann::json row = {{"precision", PrecisionName(r.precision)},
                          {"state_numel", r.state_numel},
                          {"chunk", r.chunk}};
    if (r.host) {
      const perf::HostResult& h = *r.host;
      row["host"] = {{"phase_s", SpreadJson(h.phase)},
                     {"adamw_s", SpreadJson(h.adamw)},
                     {"copies_s", SpreadJson(h.copies)},
                     {"streams_s", SpreadJson(h.streams)},
                     {"copy_bytes", h.copy_bytes},
                     {"update_bytes", h.update_bytes},
                     {"phase_gbps", (h.update_bytes + 2.0 * h.copy_bytes) / h.phase.median / 1e9},
                     {"streams_gbps", h.update_bytes / h.streams.median / 1e9},
                     {"ratio", h.ratio.median},
                     {"ratio_range", {h.ratio.min, h.ratio.max}},
                     {"hidden", h.hidden.median},
                     {"hidden_range", {h.hidden.min, h.hidden.max}},
                     {"streams_vs_adamw", h.adamw_vs_streams}};
    }
    if (r.nvme) {
      const perf::NvmeResult& n = *r.nvme;
      row["nvme"] = {{"phase_s", SpreadJson(n.phase)},
                     {"adamw_s", SpreadJson(n.adamw)},
                     {"io_s", SpreadJson(n.io)},
                     {"disk_read_s", SpreadJson(n.disk_read)},
                     {"disk_write_s", SpreadJson(n.disk_write)},
                     {"disk_read_unverified_s", SpreadJson(n.disk_read_unverified)},
                     {"disk_write_unverified_s", SpreadJson(n.disk_write_unverified)},
                     {"crc_read_overhead_pct", SpreadJson(n.crc_read_overhead_pct)},
                     {"crc_write_overhead_pct", SpreadJson(n.crc_write_overhead_pct)},
                     {"crc_implementation", n.crc_implementation},
                     {"disk_s", n.disk.median},
                     {"io_bytes", n.io_bytes},
                     {"ratio", n.ratio.median},
                     {"ratio_range", {n.ratio.min, n.ratio.max}},
                     {"pass", n.pass}};
    }
    rows.push_back(row);
  }
  j["results"] = rows;
  j["dd"] = {{"ran", dd.ran},
             {"bytes", dd_bytes},
             {"write_s", dd.write_s},
             {"read_s", dd.read_s},
             {"note", dd.note}};
  nlohmann::json step_rows = nlohmann::json::array();
  for (const auto& [precision, s] : steps) {
    for (const StepTier& t : s.tiers) {
      step_rows.push_back(
          {{"precision", PrecisionName(precision)},
           {"tier", MemoryTierName(t.tier)},
           {"step_ms",
            {{"median", t.wall_ms.median}, {"min", t.wall_ms.min}, {"max", t.wall_ms.max}}},
           {"optimizer_ms", t.optimizer_ms.median},
           {"overhead_pct", t.overhead_pct.median},
           {"overhead_pct_range", {t.overhead_pct.min, t.overhead_pct.max}},
           {"plan_bytes",
            {{"device", t.plan_bytes[0]}, {"host", t.plan_bytes[1]}, {"nvme", t.plan_bytes[2]}}},
           {"ledger_equals_plan", std::equal(t.plan_bytes, t.plan_bytes + 3, t.ledger_bytes)},
           {"losses_equal", s.losses_equal}});
    }
  }
  j["step"] = {{"model",
                {{"hidden", opts.model.hidden},
                 {"blocks", opts.model.blocks},
                 {"micro_batch", opts.model.micro_batch}}},
               {"repeats", opts.step_repeats},
               {"steps", opts.step_steps},
               {"rows", step_rows}};
  return j;
}

int Run(const BenchOptions& opts) {
  absl::StatusOr<examples::ScratchDir> dir =
      examples::ScratchDir::Create(opts.dir, "zs_offload_bench_");
  if (!dir.ok()) {
    std::fprintf(stderr, "offload_bench: %s\n", std::string(dir.status().message()).c_str());
    return 1;
  }
  const std::string cpu = CpuModel();
  std::printf("offload_bench: CPU %s\n", cpu.c_str());
  std::printf(
      "offload_bench: %lld params in %d units, chunks of %lld elements, %d repeats, "
      "swap directory %s\n",
      static_cast<long long>(opts.params), opts.units, static_cast<long long>(opts.chunk),
      opts.repeats, dir->path().c_str());
  std::vector<perf::PrecisionResult> results;
  std::string io_backend = "-";
  int64_t dd_bytes = 0;
  bool all_pass = true;
  for (Precision p : opts.precisions) {
    absl::StatusOr<perf::PrecisionResult> r = perf::MeasureOptimizerPhase(opts, p, dir->path());
    if (!r.ok()) {
      std::fprintf(stderr, "offload_bench: %s: %s\n", PrecisionName(p),
                   r.status().ToString().c_str());
      return 1;
    }
    if (r->nvme) {
      io_backend = r->nvme->io_backend;
      dd_bytes = std::max(dd_bytes, r->nvme->io_bytes / 2);
      all_pass = all_pass && r->nvme->pass;
    }
    PrintPrecision(opts, *r);
    results.push_back(*std::move(r));
  }
  std::printf("\nI/O backend (swap files): %s\n", io_backend.c_str());
  perf::DdResult dd;
  if (opts.nvme && opts.dd && dd_bytes > 0) {
    dd = perf::MeasureDd(dir->path(), dd_bytes, opts.chunk * 4);
    if (dd.ran) {
      std::printf(
          "dd reference (%s): %.1f MiB write %.1f ms (%.2f GB/s), read %.1f ms (%.2f GB/s)\n",
          dd.note.c_str(), dd_bytes / 1048576.0, dd.write_s * 1e3, dd_bytes / dd.write_s / 1e9,
          dd.read_s * 1e3, dd_bytes / dd.read_s / 1e9);
    } else {
      std::printf("dd reference: not run (%s)\n", dd.note.c_str());
    }
    std::printf("fio: %s\n", system("command -v fio >/dev/null 2>&1") == 0
                                 ? "installed (not run by this bench; see docs/perf.md)"
                                 : "not installed");
  }
  std::vector<std::pair<Precision, StepComparison>> steps;
  if (opts.step_repeats > 0) {
    for (Precision p : opts.precisions) {
      absl::StatusOr<StepComparison> s = RunSteps(opts, p, dir->path());
      if (!s.ok()) {
        std::fprintf(stderr, "offload_bench: step, %s: %s\n", PrecisionName(p),
                     s.status().ToString().c_str());
        return 1;
      }
      PrintSteps(opts, p, *s);
      steps.emplace_back(p, *std::move(s));
    }
  }
  // Figures of a wrong run are not figures: every tier must train the
  // device tier's bits, with its ledgers equal to its plan.
  bool steps_exact = true;
  for (const auto& [precision, s] : steps) {
    steps_exact = steps_exact && s.losses_equal;
    for (const StepTier& t : s.tiers) {
      steps_exact = steps_exact && std::equal(t.plan_bytes, t.plan_bytes + 3, t.ledger_bytes);
    }
  }
  if (!opts.json_path.empty() &&
      !perf::WriteBenchJson("offload_bench", opts.json_path,
                            ToJson(opts, cpu, io_backend, results, steps, dd, dd_bytes))) {
    return 1;
  }
  if (!steps_exact) {
    std::fprintf(stderr,
                 "offload_bench: the step's tiers disagree (final losses not the same bits, or a "
                 "ledger != its plan: see the table); the offload tiers are broken\n");
    return 1;
  }
  if (opts.check && !all_pass) {
    std::fprintf(stderr, "offload_bench: an NVMe phase is over %.2f x max(AdamW, disk) (--check)\n",
                 opts.limit);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BenchMain<zeroshard::BenchOptions>(
      "offload_bench", argc, argv, zeroshard::ParseFlags, zeroshard::PrintUsage, zeroshard::Run);
}
