// prefetch_bench: ZeRO stage 3 step time against the prefetch depth, on the
// residual MLP of mlp_demo (same default size), fp32.
//
//   mpirun --allow-run-as-root --oversubscribe -np 4 build/perf/runtime/prefetch_bench
//   build/perf/runtime/prefetch_bench --backend local --ranks 4     (threads, quick check)
//
// For each depth (TrainSpec::prefetch_units = 0, 1, 2), one after another in
// the same processes: create a stage-3 engine, init, Start(), train a few
// warm-up steps, then time --steps steps. The times are Engine::Stats()
// totals over the timed steps only (a snapshot after the warm-up subtracted
// from one at the end) divided by the step count. Rank 0 prints the table:
// exposed comm is the max over ranks (the slowest rank sets the pace), the
// other columns are the mean over ranks. The final loss of every depth is
// printed too: prefetching changes when params arrive, never their values,
// so it must be the same for every depth.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/flags.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/model_flags.h"
#include "perf/bench_backend.h"
#include "perf/bench_main.h"
#include "perf/runtime/mlp_bench_train_spec.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {
namespace {

constexpr int kDepths[] = {0, 1, 2};

struct BenchOptions {
  perf::BackendOptions backend{/*mpi=*/true, /*local_ranks=*/{}};
  int ranks = 4;  // local backend only; with mpi the world is mpirun's
  int steps = 30;
  int warmup = 3;
  // mlp_demo's default model: 5 blocks x hidden 256 (2.6M params).
  mlp::MlpConfig model = mlp::MlpShape(/*hidden=*/256, /*blocks=*/5, /*micro_batch=*/16);
};

void PrintUsage() {
  const BenchOptions d;
  std::printf(
      "usage: prefetch_bench [flags]\n"
      "ZeRO stage 3 step time for prefetch depth 0, 1 and 2 on the mlp_demo model.\n\n"
      "  --backend B        mpi (one process per rank under mpirun) or local\n"
      "                     (threads) (default mpi)\n"
      "  --ranks N          local ranks (default %d; ignored with mpi)\n"
      "  --steps N          timed steps per depth (default %d)\n"
      "  --warmup N         untimed steps per depth first (default %d)\n"
      "  --hidden H         hidden size (default %lld)\n"
      "  --blocks B         residual blocks (default %d)\n"
      "  --micro-batch M    samples per micro-batch (default %d)\n"
      "  --help             this text\n",
      d.ranks, d.steps, d.warmup, static_cast<long long>(d.model.hidden), d.model.blocks,
      d.model.micro_batch);
}

absl::StatusOr<BenchOptions> ParseFlags(int argc, char** argv, bool* help) {
  BenchOptions opts;
  cli::FlagSet flags;
  mlp::AddModelFlags(flags, &opts.model);
  perf::AddBackendFlag(flags, &opts.backend);
  flags.Int("ranks", &opts.ranks, 1, cli::kMaxCount)
      .Int("steps", &opts.steps, 1, cli::kMaxCount)
      // At least one: the first step records the gather order that later
      // steps prefetch along, so it must not be timed.
      .Int("warmup", &opts.warmup, 1, cli::kMaxCount);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  if (*help) return opts;
  opts.backend.local_ranks = {opts.ranks};
  ZS_RETURN_IF_ERROR(opts.model.Validate());
  return opts;
}

// Per-rank values of one depth, in this order (ms per timed step, except the
// last two).
enum Column : int {
  kTotal = 0,
  kCompute,
  kExposedComm,
  kOptimizer,
  kEngineOther,
  kInputWait,
  kPrefetchActive,  // 0 or 1
  kFinalLoss,
  kNumColumns
};

struct DepthResult {
  int depth = 0;
  std::vector<std::vector<double>> ranks;  // [rank][Column]
};

double PerStepMs(absl::Duration after, absl::Duration before, int steps) {
  return absl::ToDoubleMilliseconds(after - before) / steps;
}

// One depth on this rank; every rank gets every rank's row.
absl::StatusOr<DepthResult> RunDepth(const BenchOptions& opts, int depth, Communicator& comm) {
  std::unique_ptr<Device> device = CreateCpuDevice();
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                      mlp::CreateMlpEngine(
                          opts.model, perf::MlpBenchTrainSpec(/*stage=*/3, Precision::kFp32, depth),
                          *device, comm));
  ZS_RETURN_IF_ERROR(engine->Start());
  mlp::MlpTrainer trainer(opts.model, *engine, comm);
  for (int s = 0; s < opts.warmup; ++s) ZS_RETURN_IF_ERROR(trainer.TrainStep().status());

  const EngineStats before = engine->Stats();
  double loss = 0.0;
  for (int s = 0; s < opts.steps; ++s) {
    ZS_ASSIGN_OR_RETURN(loss, trainer.TrainStep());
  }
  const EngineStats after = engine->Stats();
  if (after.steps - before.steps != opts.steps) {
    return absl::InternalError(absl::StrFormat(
        "prefetch_bench: rank %d depth %d: the engine counted %d timed steps, expected %d",
        comm.rank(), depth, static_cast<int>(after.steps - before.steps), opts.steps));
  }
  const StepTimes& a = after.totals;
  const StepTimes& b = before.totals;
  const double row[kNumColumns] = {PerStepMs(a.total, b.total, opts.steps),
                                   PerStepMs(a.compute, b.compute, opts.steps),
                                   PerStepMs(a.exposed_comm, b.exposed_comm, opts.steps),
                                   PerStepMs(a.optimizer, b.optimizer, opts.steps),
                                   PerStepMs(a.engine_other, b.engine_other, opts.steps),
                                   PerStepMs(a.input_wait, b.input_wait, opts.steps),
                                   after.prefetch_active ? 1.0 : 0.0,
                                   loss};
  std::vector<double> all(static_cast<size_t>(kNumColumns) * comm.size());
  ZS_RETURN_IF_ERROR(comm.AllGatherSync(row, all.data(), kNumColumns, DType::kFloat64));
  DepthResult result;
  result.depth = depth;
  for (int r = 0; r < comm.size(); ++r) {
    result.ranks.emplace_back(all.begin() + r * kNumColumns, all.begin() + (r + 1) * kNumColumns);
  }
  return result;
}

// Every depth on this rank; rank 0 keeps the results.
absl::Status RunRank(const BenchOptions& opts, Communicator& comm,
                     std::vector<DepthResult>* results) {
  for (int depth : kDepths) {
    if (comm.rank() == 0) {
      std::fprintf(stderr, "prefetch_bench: depth %d: %d warm-up + %d timed steps\n", depth,
                   opts.warmup, opts.steps);
    }
    absl::StatusOr<DepthResult> result = RunDepth(opts, depth, comm);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrFormat("prefetch depth %d, rank %d: %s", depth, comm.rank(),
                                          result.status().message()));
    }
    if (comm.rank() == 0) results->push_back(*std::move(result));
  }
  return absl::OkStatus();
}

double Mean(const DepthResult& d, Column c) {
  double sum = 0.0;
  for (const auto& row : d.ranks) sum += row[c];
  return d.ranks.empty() ? 0.0 : sum / d.ranks.size();
}

double Max(const DepthResult& d, Column c) {
  double m = 0.0;
  for (const auto& row : d.ranks) m = std::max(m, row[c]);
  return m;
}

void PrintTable(const BenchOptions& opts, int world, const std::vector<DepthResult>& results) {
  const int64_t params = mlp::BuildModelSpec(opts.model).NumParams();
  std::printf(
      "prefetch_bench: residual MLP %d blocks x hidden %d (%lld params), micro-batch %d, fp32,\n"
      "                ZeRO stage 3, %d ranks (%s), %d warm-up + %d timed steps per depth\n\n",
      opts.model.blocks, static_cast<int>(opts.model.hidden), static_cast<long long>(params),
      opts.model.micro_batch, world, opts.backend.mpi ? "mpi" : "local threads", opts.warmup,
      opts.steps);
  std::printf(
      "ms per step (Engine::Stats() over the timed steps; exposed comm: max over ranks,\n"
      "other columns: mean over ranks; input wait, the rest of total, not shown)\n");
  std::printf("  %5s %9s %9s %13s %10s %12s %9s  %-8s %12s\n", "depth", "total", "compute",
              "exposed comm", "optimizer", "engine other", "vs d0", "prefetch", "final loss");
  const double base_exposed = results.empty() ? 0.0 : Max(results[0], kExposedComm);
  bool same_loss = true;
  for (const DepthResult& d : results) {
    const double exposed = Max(d, kExposedComm);
    std::string ratio = "-";
    if (d.depth != 0) {
      ratio = base_exposed > 0 ? absl::StrFormat("%.2fx", exposed / base_exposed) : "n/a";
    }
    const double active = Mean(d, kPrefetchActive);
    const char* prefetch = active == 1.0 ? "active" : active == 0.0 ? "inactive" : "mixed";
    const double loss = d.ranks.empty() ? 0.0 : d.ranks[0][kFinalLoss];
    const double loss0 = results[0].ranks.empty() ? 0.0 : results[0].ranks[0][kFinalLoss];
    same_loss = same_loss && std::memcmp(&loss, &loss0, sizeof(double)) == 0;
    std::printf("  %5d %9.2f %9.2f %13.2f %10.2f %12.2f %9s  %-8s %12.6f\n", d.depth,
                Mean(d, kTotal), Mean(d, kCompute), exposed, Mean(d, kOptimizer),
                Mean(d, kEngineOther), ratio.c_str(), prefetch, loss);
  }
  std::printf(
      "\n\"vs d0\": exposed comm relative to depth 0. Final losses bitwise equal across "
      "depths: %s\n",
      same_loss ? "yes" : "NO (prefetch must not change the values)");
}

int Report(const BenchOptions& opts, const std::string&, int world,
           const std::vector<DepthResult>& results) {
  PrintTable(opts, world, results);
  return 0;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BackendBenchMain<zeroshard::BenchOptions, zeroshard::DepthResult>(
      "prefetch_bench", argc, argv, zeroshard::ParseFlags, zeroshard::PrintUsage,
      zeroshard::RunRank, zeroshard::Report);
}
