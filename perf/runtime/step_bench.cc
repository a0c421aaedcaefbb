// step_bench: the engine's training step on the mlp_demo model for ZeRO
// stages 0-3 and several rank counts: where a step's time goes, samples/s,
// scaling efficiency, cost per epoch, and memory per rank against the plan.
//
//   build/perf/runtime/step_bench --ranks 1,2,4 --json build/perf/step_local.json
//   mpirun -np 2 build/perf/runtime/step_bench --backend mpi --json step_mpi_np2.json
//
// For each rank count (local: a fresh group of threads; mpi: mpirun's world)
// and each stage, one after another: create an engine, init, Start(), train
// --warmup steps, then time --steps steps. Per rank:
//  - the step split (ms per timed step): Engine::Stats() totals over the
//    timed steps (a snapshot after the warm-up subtracted from one at the
//    end) divided by the step count, read by ReadStepParts; the parts add up
//    to the step's total. Hidden comm is not a part: collectives that ran
//    while the rank did something else (comm_busy - exposed_comm);
//  - the wall time of the timed steps;
//  - memory: the device ledger's peak (MemoryLedger::peak_total) against
//    PlanEngineBuffers' total for the same model, TrainSpec and world (what
//    the engine promises to allocate; the trainer's activations are its own
//    and in neither);
//  - the CPUs it may run on (sched_getaffinity): mpirun binds each rank to
//    one core at np <= 2, and the rank's loader and progress threads share
//    it (`zeroshard estimate --cpus-per-rank` takes the fewest over ranks).
// Reported: parts as the mean over ranks; samples/s = samples per step
// (ranks x micro-batch: weak scaling, a fixed batch per rank) x steps / the
// slowest rank's wall time; scaling efficiency = samples/s on N ranks /
// (N x samples/s on 1 rank) of the same stage (needs 1 in --ranks; with mpi
// the report pairs files of different worlds); cost per epoch = epoch hours
// (--dataset-samples / samples/s) x N devices x --price-per-device-hour.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/flags.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/model_flags.h"
#include "nlohmann/json.hpp"
#include "perf/bench_backend.h"
#include "perf/bench_json.h"
#include "perf/bench_main.h"
#include "perf/runtime/mlp_bench_train_spec.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {
namespace {

struct BenchOptions {
  perf::BackendOptions backend{/*mpi=*/false, /*local_ranks=*/{1, 2, 4}};
  std::vector<int> stages = {0, 1, 2, 3};
  int steps = 10;
  int warmup = 2;
  Precision precision = Precision::kFp32;
  int prefetch_units = 1;  // TrainSpec::prefetch_units (stage 3)
  int grad_buffers = 2;    // TrainSpec::num_grad_buffers
  double dataset_samples = 1e6;
  double price_per_device_hour = 2.0;  // USD
  std::string json_path;
  // mlp_demo's default model: 5 blocks x hidden 256 (2.6M params).
  mlp::MlpConfig model = mlp::MlpShape(/*hidden=*/256, /*blocks=*/5, /*micro_batch=*/16);
};

void PrintUsage() {
  const BenchOptions d;
  std::printf(
      "usage: step_bench [flags]\n"
      "Engine step split, samples/s, scaling efficiency, cost per epoch and memory per rank\n"
      "against the plan, for ZeRO stages 0-3 on the mlp_demo model.\n\n"
      "  --backend B                 local (threads, default) or mpi (under mpirun)\n"
      "  --ranks LIST                local rank counts (default 1,2,4; ignored with mpi)\n"
      "  --stages LIST               ZeRO stages (default 0,1,2,3)\n"
      "  --steps N                   timed steps per run (default %d)\n"
      "  --warmup N                  untimed steps first (default %d)\n"
      "  --precision P               fp32, bf16 or fp16 (default fp32)\n"
      "  --prefetch N                stage 3: units gathered ahead (default %d)\n"
      "  --grad-buffers N            gradient staging buffers (default %d)\n"
      "  --hidden H                  hidden size (default %lld)\n"
      "  --blocks B                  residual blocks (default %d)\n"
      "  --micro-batch M             samples per rank per step (default %d)\n"
      "  --dataset-samples N         samples per epoch for the cost (default %.0f)\n"
      "  --price-per-device-hour X   USD per device (rank) hour (default %.2f)\n"
      "  --json FILE                 write the results as JSON\n"
      "  --help                      this text\n",
      d.steps, d.warmup, d.prefetch_units, d.grad_buffers, static_cast<long long>(d.model.hidden),
      d.model.blocks, d.model.micro_batch, d.dataset_samples, d.price_per_device_hour);
}

absl::StatusOr<BenchOptions> ParseFlags(int argc, char** argv, bool* help) {
  BenchOptions opts;
  cli::FlagSet flags;
  mlp::AddModelFlags(flags, &opts.model);
  perf::AddBackendFlag(flags, &opts.backend);
  flags.IntList("ranks", &opts.backend.local_ranks, 1, 64)
      .IntList("stages", &opts.stages, 0, 3)
      .Int("steps", &opts.steps, 1, cli::kMaxCount)
      // At least one: stage 3's first step records the gather order.
      .Int("warmup", &opts.warmup, 1, cli::kMaxCount)
      .Custom("precision",
              [&](const std::string& value) -> absl::Status {
                ZS_ASSIGN_OR_RETURN(opts.precision, ParsePrecision(value));
                return absl::OkStatus();
              })
      .Int("prefetch", &opts.prefetch_units, 0, cli::kMaxCount)
      .Int("grad-buffers", &opts.grad_buffers, 1, cli::kMaxCount)
      .Number("dataset-samples", &opts.dataset_samples, 0, 1e30, /*lo_open=*/true)
      .Number("price-per-device-hour", &opts.price_per_device_hour, 0, 1e30, /*lo_open=*/true)
      .String("json", &opts.json_path);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  if (*help) return opts;
  ZS_RETURN_IF_ERROR(opts.model.Validate());
  return opts;
}

// The step split: the parts that add up to a step's total, in the order the
// report stacks them, then hidden comm (not a part). All the reading of
// StepTimes is here, so a new field of the engine's split changes this
// function and kPartNames only.
constexpr const char* kPartNames[] = {"compute",    "exposed_comm", "optimizer",
                                      "input_wait", "engine_other", "pipeline_bubble",
                                      "total",      "hidden_comm"};
constexpr int kNumParts = 6;  // the first six add up to "total"
constexpr int kTotalColumn = 6;
constexpr int kHiddenColumn = 7;
constexpr int kNumStepColumns = 8;

std::vector<double> ReadStepParts(const StepTimes& after, const StepTimes& before, int steps) {
  auto ms = [steps](absl::Duration a, absl::Duration b) {
    return absl::ToDoubleMilliseconds(a - b) / steps;
  };
  const double exposed = ms(after.exposed_comm, before.exposed_comm);
  return {ms(after.compute, before.compute),
          exposed,
          ms(after.optimizer, before.optimizer),
          ms(after.input_wait, before.input_wait),
          ms(after.engine_other, before.engine_other),
          ms(after.pipeline_bubble, before.pipeline_bubble),
          ms(after.total, before.total),
          std::max(0.0, ms(after.comm_busy, before.comm_busy) - exposed)};
}

// One rank's row: the step columns, then these.
enum Extra : int {
  kWallMs = kNumStepColumns,  // the timed steps' wall time / steps
  kLedgerPeak,                // bytes
  kLedgerCurrent,
  kPlanBytes,
  kFinalLoss,
  kCpus,  // CPUs this rank may run on
  kRowSize
};

struct RunResult {
  int ranks = 0;
  int stage = 0;
  std::vector<std::vector<double>> per_rank;  // [rank][column]
};

// The CPUs the calling thread may run on (a thread rank's are its
// process's unless someone pinned it); 0 when the call fails.
int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
}

TrainSpec MakeTrainSpec(const BenchOptions& opts, int stage) {
  TrainSpec train = perf::MlpBenchTrainSpec(stage, opts.precision, opts.prefetch_units);
  train.num_grad_buffers = opts.grad_buffers;
  return train;
}

absl::StatusOr<RunResult> RunStage(const BenchOptions& opts, int stage, Communicator& comm) {
  const ModelSpec spec = mlp::BuildModelSpec(opts.model);
  const TrainSpec train = MakeTrainSpec(opts, stage);
  ZS_ASSIGN_OR_RETURN(BufferPlan plan, PlanEngineBuffers(spec, train, comm.size()));
  std::unique_ptr<Device> device = CreateCpuDevice();
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                      mlp::CreateMlpEngine(opts.model, train, *device, comm));
  mlp::MlpTrainer trainer(opts.model, *engine, comm);  // before Start(), as mlp_demo
  ZS_RETURN_IF_ERROR(engine->Start(mlp::TrainerSettings(opts.model)));
  for (int s = 0; s < opts.warmup; ++s) ZS_RETURN_IF_ERROR(trainer.TrainStep().status());

  const EngineStats before = engine->Stats();
  const auto start = std::chrono::steady_clock::now();
  double loss = 0.0;
  for (int s = 0; s < opts.steps; ++s) {
    ZS_ASSIGN_OR_RETURN(loss, trainer.TrainStep());
  }
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      opts.steps;
  const EngineStats after = engine->Stats();
  if (after.steps - before.steps != opts.steps) {
    return absl::InternalError(absl::StrFormat(
        "rank %d stage %d: the engine counted %d timed steps, expected %d", comm.rank(), stage,
        static_cast<int>(after.steps - before.steps), opts.steps));
  }
  std::vector<double> row = ReadStepParts(after.totals, before.totals, opts.steps);
  row.resize(kRowSize);
  row[kWallMs] = wall_ms;
  row[kLedgerPeak] = static_cast<double>(engine->ledger().peak_total());
  row[kLedgerCurrent] = static_cast<double>(engine->ledger().current_total());
  row[kPlanBytes] = static_cast<double>(plan.total_bytes());
  row[kFinalLoss] = loss;
  row[kCpus] = AffinityCpus();
  std::vector<double> all(static_cast<size_t>(kRowSize) * comm.size());
  ZS_RETURN_IF_ERROR(comm.AllGatherSync(row.data(), all.data(), kRowSize, DType::kFloat64));
  RunResult result;
  result.ranks = comm.size();
  result.stage = stage;
  for (int r = 0; r < comm.size(); ++r) {
    result.per_rank.emplace_back(all.begin() + r * kRowSize, all.begin() + (r + 1) * kRowSize);
  }
  return result;
}

absl::Status RunRank(const BenchOptions& opts, Communicator& comm, std::vector<RunResult>* out) {
  for (int stage : opts.stages) {
    if (comm.rank() == 0) {
      std::fprintf(stderr, "step_bench: %d rank%s, stage %d: %d warm-up + %d timed steps\n",
                   comm.size(), comm.size() == 1 ? "" : "s", stage, opts.warmup, opts.steps);
    }
    absl::StatusOr<RunResult> result = RunStage(opts, stage, comm);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrFormat("%d ranks, stage %d, rank %d: %s", comm.size(), stage,
                                          comm.rank(), result.status().message()));
    }
    if (comm.rank() == 0) out->push_back(*std::move(result));
  }
  return absl::OkStatus();
}

double Mean(const RunResult& r, int column) {
  double sum = 0;
  for (const auto& row : r.per_rank) sum += row[column];
  return sum / r.per_rank.size();
}

double Max(const RunResult& r, int column) {
  double m = 0;
  for (const auto& row : r.per_rank) m = std::max(m, row[column]);
  return m;
}

double Min(const RunResult& r, int column) {
  double m = r.per_rank.empty() ? 0 : r.per_rank[0][column];
  for (const auto& row : r.per_rank) m = std::min(m, row[column]);
  return m;
}

// The derived figures of one run.
struct Derived {
  double samples_per_step = 0, samples_per_s = 0, efficiency = -1, epoch_hours = 0, cost = 0;
};

Derived Derive(const BenchOptions& opts, const RunResult& r, const std::vector<RunResult>& all) {
  Derived d;
  d.samples_per_step = static_cast<double>(r.ranks) * opts.model.micro_batch;
  d.samples_per_s = d.samples_per_step / (Max(r, kWallMs) / 1e3);
  for (const RunResult& one : all) {
    if (one.ranks == 1 && one.stage == r.stage) {
      const double one_sps = opts.model.micro_batch / (Max(one, kWallMs) / 1e3);
      d.efficiency = d.samples_per_s / (r.ranks * one_sps);
    }
  }
  d.epoch_hours = opts.dataset_samples / d.samples_per_s / 3600.0;
  d.cost = d.epoch_hours * r.ranks * opts.price_per_device_hour;
  return d;
}

void PrintTable(const BenchOptions& opts, const std::string& backend,
                const std::vector<RunResult>& results) {
  const int64_t params = mlp::BuildModelSpec(opts.model).NumParams();
  std::printf(
      "\nstep_bench: residual MLP %d blocks x hidden %d (%lld params), micro-batch %d per rank, "
      "%s, backend %s,\n%d warm-up + %d timed steps per run; ms per step, mean over ranks\n",
      opts.model.blocks, static_cast<int>(opts.model.hidden), static_cast<long long>(params),
      opts.model.micro_batch, PrecisionName(opts.precision), backend.c_str(), opts.warmup,
      opts.steps);
  std::printf("BLAS: %s\n", mlp::BlasDescription().c_str());
  std::printf("%5s %5s %4s %8s %8s %8s %8s %8s %8s %8s | %8s %9s %6s %10s | %9s %9s\n", "ranks",
              "stage", "cpus", "compute", "exp.comm", "optim", "input", "eng.oth", "total",
              "hid.comm", "wall", "samples/s", "eff", "USD/epoch", "plan MiB", "peak MiB");
  for (const RunResult& r : results) {
    const Derived d = Derive(opts, r, results);
    std::printf(
        "%5d %5d %4d %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f | %8.2f %9.1f %6s %10.4f | %9.2f "
        "%9.2f\n",
        r.ranks, r.stage, static_cast<int>(Min(r, kCpus)), Mean(r, 0), Mean(r, 1), Mean(r, 2),
        Mean(r, 3), Mean(r, 4), Mean(r, kTotalColumn), Mean(r, kHiddenColumn), Max(r, kWallMs),
        d.samples_per_s, d.efficiency < 0 ? "-" : absl::StrFormat("%.3f", d.efficiency).c_str(),
        d.cost, Max(r, kPlanBytes) / 1048576.0, Max(r, kLedgerPeak) / 1048576.0);
  }
  std::printf(
      "cpus: the fewest CPUs a rank may run on (sched_getaffinity); eff: samples/s / (ranks x "
      "samples/s of 1 rank, same stage); cost: %.0f samples per epoch at %.2f USD per "
      "device-hour\n",
      opts.dataset_samples, opts.price_per_device_hour);
}

bool WriteJson(const BenchOptions& opts, const std::string& backend,
               const std::vector<RunResult>& results) {
  nlohmann::json j;
  j["bench"] = "step_bench";
  j["backend"] = backend;
  j["model"] = {{"name", "mlp_demo residual MLP"},
                {"hidden", opts.model.hidden},
                {"blocks", opts.model.blocks},
                {"micro_batch", opts.model.micro_batch},
                {"params", mlp::BuildModelSpec(opts.model).NumParams()}};
  j["precision"] = PrecisionName(opts.precision);
  j["blas"] = mlp::BlasDescription();
  j["warmup"] = opts.warmup;
  j["steps"] = opts.steps;
  j["dataset_samples"] = opts.dataset_samples;
  j["price_per_device_hour_usd"] = opts.price_per_device_hour;
  j["parts"] = std::vector<std::string>(kPartNames, kPartNames + kNumParts);
  j["definitions"] = {
      {"parts_ms",
       "Engine::Stats() totals over the timed steps / steps, mean over ranks; they "
       "add up to total_ms"},
      {"hidden_comm_ms", "comm_busy - exposed_comm: collectives that ran behind other work"},
      {"wall_ms", "wall time of the timed steps / steps, slowest rank"},
      {"samples_per_s", "ranks x micro_batch x steps / (slowest rank's wall time)"},
      {"scaling_efficiency", "samples_per_s / (ranks x samples_per_s of 1 rank, same stage)"},
      {"cost_per_epoch_usd", "dataset_samples / samples_per_s / 3600 x ranks x price"},
      {"memory", "ledger peak_total per rank (max over ranks) vs PlanEngineBuffers total"},
      {"cpus",
       "CPUs a rank may run on (sched_getaffinity: CPU_COUNT), per rank; the run's is the "
       "fewest over ranks"},
  };
  nlohmann::json runs = nlohmann::json::array();
  for (const RunResult& r : results) {
    const Derived d = Derive(opts, r, results);
    nlohmann::json parts;
    for (int p = 0; p < kNumParts; ++p) parts[kPartNames[p]] = Mean(r, p);
    nlohmann::json per_rank = nlohmann::json::array();
    for (const auto& row : r.per_rank) {
      nlohmann::json one;
      for (int c = 0; c < kNumStepColumns; ++c) one[kPartNames[c]] = row[c];
      one["wall_ms"] = row[kWallMs];
      one["ledger_peak_bytes"] = row[kLedgerPeak];
      one["cpus"] = static_cast<int>(row[kCpus]);
      per_rank.push_back(one);
    }
    runs.push_back(
        {{"ranks", r.ranks},
         {"stage", r.stage},
         {"cpus", static_cast<int>(Min(r, kCpus))},
         {"parts_ms", parts},
         {"total_ms", Mean(r, kTotalColumn)},
         {"hidden_comm_ms", Mean(r, kHiddenColumn)},
         {"wall_ms", Max(r, kWallMs)},
         {"samples_per_step", d.samples_per_step},
         {"samples_per_s", d.samples_per_s},
         {"scaling_efficiency", d.efficiency < 0 ? nlohmann::json() : nlohmann::json(d.efficiency)},
         {"epoch_hours", d.epoch_hours},
         {"cost_per_epoch_usd", d.cost},
         {"memory",
          {{"plan_bytes", static_cast<int64_t>(Max(r, kPlanBytes))},
           {"ledger_peak_bytes", static_cast<int64_t>(Max(r, kLedgerPeak))},
           {"ledger_current_bytes", static_cast<int64_t>(Max(r, kLedgerCurrent))}}},
         {"final_loss", r.per_rank[0][kFinalLoss]},
         {"per_rank", per_rank}});
  }
  j["runs"] = runs;
  return perf::WriteBenchJson("step_bench", opts.json_path, j);
}

int Report(const BenchOptions& opts, const std::string& backend, int,
           const std::vector<RunResult>& results) {
  PrintTable(opts, backend, results);
  return !opts.json_path.empty() && !WriteJson(opts, backend, results) ? 1 : 0;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BackendBenchMain<zeroshard::BenchOptions, zeroshard::RunResult>(
      "step_bench", argc, argv, zeroshard::ParseFlags, zeroshard::PrintUsage, zeroshard::RunRank,
      zeroshard::Report);
}
