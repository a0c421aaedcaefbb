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
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "examples/common/flags.h"
#include "examples/mlp/mlp.h"
#include "perf/bench_main.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {
namespace {

constexpr int kDepths[] = {0, 1, 2};

struct BenchOptions {
  bool backend_mpi = true;
  int ranks = 4;  // local backend only; with mpi the world is mpirun's
  int steps = 30;
  int warmup = 3;
  // mlp_demo's default model: 5 blocks x hidden 256 (2.6M params).
  mlp::MlpConfig model = [] {
    mlp::MlpConfig m;
    m.hidden = 256;
    m.blocks = 5;
    m.micro_batch = 16;
    return m;
  }();
};

void PrintUsage(std::FILE* out) {
  const BenchOptions d;
  std::fprintf(out,
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
  *help = false;
  auto int_flag = [](const std::string& flag, const std::string& value, int64_t min,
                     auto* out) -> absl::Status {
    int64_t v = 0;
    if (!absl::SimpleAtoi(value, &v) || v < min || v > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", flag, ": bad value '", value, "', expected an integer >= ", min));
    }
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(v);
    return absl::OkStatus();
  };
  ZS_RETURN_IF_ERROR(examples::ForEachFlag(
      argc, argv, help, [&](const std::string& name, const std::string& value) -> absl::Status {
        if (name == "backend") {
          if (value != "mpi" && value != "local") {
            return absl::InvalidArgumentError(
                absl::StrCat("flag --backend: bad value '", value, "', expected mpi or local"));
          }
          opts.backend_mpi = value == "mpi";
        } else if (name == "ranks") {
          ZS_RETURN_IF_ERROR(int_flag(name, value, 1, &opts.ranks));
        } else if (name == "steps") {
          ZS_RETURN_IF_ERROR(int_flag(name, value, 1, &opts.steps));
        } else if (name == "warmup") {
          // At least one: the first step records the gather order that later
          // steps prefetch along, so it must not be timed.
          ZS_RETURN_IF_ERROR(int_flag(name, value, 1, &opts.warmup));
        } else if (name == "hidden") {
          ZS_RETURN_IF_ERROR(int_flag(name, value, 1, &opts.model.hidden));
        } else if (name == "blocks") {
          ZS_RETURN_IF_ERROR(int_flag(name, value, 1, &opts.model.blocks));
        } else if (name == "micro-batch") {
          ZS_RETURN_IF_ERROR(int_flag(name, value, 1, &opts.model.micro_batch));
        } else {
          return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
        }
        return absl::OkStatus();
      }));
  if (*help) return opts;
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

TrainSpec MakeTrainSpec(int depth) {
  TrainSpec train;
  train.zero_stage = 3;
  train.precision = Precision::kFp32;
  train.prefetch_units = depth;
  train.optimizer.kind = OptimizerKind::kAdamW;
  train.optimizer.lr = 3e-3;
  train.optimizer.weight_decay = 0.01;
  train.max_grad_norm = 2.0;
  return train;
}

// One depth on this rank; every rank gets every rank's row.
absl::StatusOr<DepthResult> RunDepth(const BenchOptions& opts, int depth, Communicator& comm) {
  std::unique_ptr<Device> device = CreateCpuDevice();
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(mlp::BuildModelSpec(opts.model), MakeTrainSpec(depth), *device, comm));
  ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, opts.model));
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
      opts.model.micro_batch, world, opts.backend_mpi ? "mpi" : "local threads", opts.warmup,
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

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "prefetch_bench: run failed: %s\n", status.ToString().c_str());
  return 1;
}

int RunLocal(const BenchOptions& opts) {
  std::vector<DepthResult> results;
  const absl::Status status = RunLocalRanks(
      opts.ranks, [&](int, Communicator& comm) { return RunRank(opts, comm, &results); });
  if (!status.ok()) return Fail(status);
  PrintTable(opts, opts.ranks, results);
  return 0;
}

int RunMpi(const BenchOptions& opts) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateMpiCommunicator();
  if (!comm.ok()) return Fail(comm.status());
  std::vector<DepthResult> results;
  const absl::Status status = RunRank(opts, **comm, &results);
  int code = 0;
  if (!status.ok()) {
    code = Fail(status);
  } else if ((*comm)->rank() == 0) {
    PrintTable(opts, (*comm)->size(), results);
  }
  comm->reset();
  FinalizeMpi();
  return code;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BenchMain<zeroshard::BenchOptions>(
      "prefetch_bench", argc, argv, zeroshard::ParseFlags, [] { zeroshard::PrintUsage(stdout); },
      [](const zeroshard::BenchOptions& opts) {
        return opts.backend_mpi ? zeroshard::RunMpi(opts) : zeroshard::RunLocal(opts);
      });
}
