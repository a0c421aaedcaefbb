// step_time_gpu_bench: where a training step's time goes on a GPU, and how
// much of the communication the engine hides. The residual MLP of mlp_demo
// (larger by default) trains on GPU 0 with 2 ranks as threads sharing it
// (the local communicator over the GPU's memory), for ZeRO stages 1, 2 and
// 3 (prefetch 1), fp32 and bf16. After --warmup steps, --steps steps are
// timed from Engine::Stats() (totals at the end minus a snapshot after the
// warm-up), per step: the trainer's compute, the exposed communication (the
// engine blocked on a collective; the max over ranks), the hidden
// communication (the collectives' run time not waited for: comm_busy -
// exposed), the optimizer, the total.
//
//   build/perf/gpu/step_time_gpu_bench [--blocks 8] [--hidden 1024] [--micro-batch 64]
//                                      [--ranks 2] [--warmup 5] [--steps 20] [--json FILE]
//
// Exit 0 when every configuration trained (finite losses), 1 on an error,
// 2 on bad arguments, 77 without a CUDA device.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli/flags.h"
#include "examples/mlp/cuda/cuda_mlp_trainer.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/model_flags.h"
#include "perf/bench_main.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

struct Options {
  mlp::MlpConfig model = mlp::MlpShape(/*hidden=*/1024, /*blocks=*/8, /*micro_batch=*/64);
  int ranks = 2;
  int warmup = 5;
  int steps = 20;
  std::string json_path;
};

struct Row {
  std::string config;
  double compute_ms = 0, exposed_ms = 0, hidden_ms = 0, optimizer_ms = 0, total_ms = 0;
  double final_loss = 0;
};

StepTimes Minus(const StepTimes& a, const StepTimes& b) {
  StepTimes d;
  d.compute = a.compute - b.compute;
  d.exposed_comm = a.exposed_comm - b.exposed_comm;
  d.optimizer = a.optimizer - b.optimizer;
  d.total = a.total - b.total;
  d.comm_busy = a.comm_busy - b.comm_busy;
  return d;
}

absl::StatusOr<Row> Measure(const Options& o, int stage, Precision precision) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Device> group_device, CreateCudaDevice(0));
  CommOptions comm_options;
  comm_options.device = group_device.get();
  std::vector<StepTimes> per_rank(o.ranks);
  double final_loss = 0;
  std::mutex mu;
  ZS_RETURN_IF_ERROR(RunLocalRanks(
      o.ranks,
      [&](int rank, Communicator& comm) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateCudaDevice(0));
        TrainSpec train;
        train.zero_stage = stage;
        train.precision = precision;
        train.prefetch_units = 1;
        train.optimizer.lr = 1e-3;
        train.max_grad_norm = 1.0;
        ZS_ASSIGN_OR_RETURN(auto engine, mlp::CreateMlpEngine(o.model, train, *device, comm));
        ZS_RETURN_IF_ERROR(engine->Start(mlp::TrainerSettings(o.model)));
        ZS_ASSIGN_OR_RETURN(auto trainer,
                            mlp::gpu::CudaMlpTrainer::Create(o.model, *engine, comm, *device));
        double loss = 0;
        for (int s = 0; s < o.warmup; ++s) {
          ZS_ASSIGN_OR_RETURN(loss, trainer->TrainStep());
        }
        const StepTimes before = engine->Stats().totals;
        for (int s = 0; s < o.steps; ++s) {
          ZS_ASSIGN_OR_RETURN(loss, trainer->TrainStep());
        }
        if (!std::isfinite(loss)) {
          return absl::InternalError(
              absl::StrFormat("the loss is %g after %d steps", loss, o.warmup + o.steps));
        }
        std::lock_guard<std::mutex> lock(mu);
        per_rank[rank] = Minus(engine->Stats().totals, before);
        if (rank == 0) final_loss = loss;
        return absl::OkStatus();
      },
      comm_options));
  Row row;
  row.config = absl::StrFormat("stage %d %s, %d ranks", stage, PrecisionName(precision), o.ranks);
  const double n = o.steps;
  for (const StepTimes& t : per_rank) {
    // The slowest rank's exposed wait sets the pace; the rest are means.
    row.exposed_ms = std::max(row.exposed_ms, absl::ToDoubleMilliseconds(t.exposed_comm) / n);
    row.compute_ms += absl::ToDoubleMilliseconds(t.compute) / n / o.ranks;
    row.optimizer_ms += absl::ToDoubleMilliseconds(t.optimizer) / n / o.ranks;
    row.total_ms += absl::ToDoubleMilliseconds(t.total) / n / o.ranks;
    row.hidden_ms +=
        std::max(0.0, absl::ToDoubleMilliseconds(t.comm_busy - t.exposed_comm)) / n / o.ranks;
  }
  row.final_loss = final_loss;
  return row;
}

void PrintUsage() {
  std::printf(
      "usage: step_time_gpu_bench [--blocks N] [--hidden H] [--micro-batch M] [--ranks R] "
      "[--warmup W] [--steps S] [--json FILE] (positive integers)\n");
}

absl::StatusOr<Options> ParseFlags(int argc, char** argv, bool* help) {
  Options o;
  cli::FlagSet flags;
  mlp::AddModelFlags(flags, &o.model)
      .Int("ranks", &o.ranks, 1, cli::kMaxCount)
      .Int("warmup", &o.warmup, 1, cli::kMaxCount)
      .Int("steps", &o.steps, 1, cli::kMaxCount)
      .String("json", &o.json_path);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  return o;
}

int Run(const Options& o) {
  auto probe = CreateCudaDevice(0);
  if (!probe.ok()) {
    std::printf("step_time_gpu_bench: no CUDA device (%s)\n",
                std::string(probe.status().message()).c_str());
    return 77;
  }
  std::printf(
      "step_time_gpu_bench: residual MLP %d blocks x hidden %lld, micro-batch %d, %d "
      "ranks as threads on %s; ms per step over %d steps after %d warm-up steps\n",
      o.model.blocks, static_cast<long long>(o.model.hidden), o.model.micro_batch, o.ranks,
      (*probe)->name().c_str(), o.steps, o.warmup);
  std::printf("  %-26s %9s %13s %12s %10s %9s %11s\n", "", "compute", "exposed comm", "hidden comm",
              "optimizer", "total", "final loss");
  std::vector<Row> rows;
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    for (int stage = 1; stage <= 3; ++stage) {
      absl::StatusOr<Row> row = Measure(o, stage, precision);
      if (!row.ok()) {
        std::fprintf(stderr, "step_time_gpu_bench: stage %d %s: %s\n", stage,
                     PrecisionName(precision), row.status().ToString().c_str());
        return 1;
      }
      std::printf("  %-26s %9.2f %13.2f %12.2f %10.2f %9.2f %11.5f\n", row->config.c_str(),
                  row->compute_ms, row->exposed_ms, row->hidden_ms, row->optimizer_ms,
                  row->total_ms, row->final_loss);
      rows.push_back(*row);
    }
  }
  if (!o.json_path.empty()) {
    std::FILE* f = std::fopen(o.json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "step_time_gpu_bench: cannot write --json %s: %s\n", o.json_path.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::fprintf(f, "{\n  \"bench\": \"step_time_gpu_bench\",\n  \"summary\": [\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    \"%s: compute %.2f ms, exposed comm %.2f ms, hidden comm %.2f ms, "
                   "optimizer %.2f ms, total %.2f ms per step\"%s\n",
                   r.config.c_str(), r.compute_ms, r.exposed_ms, r.hidden_ms, r.optimizer_ms,
                   r.total_ms, i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BenchMain<zeroshard::Options>("step_time_gpu_bench", argc, argv,
                                                        zeroshard::ParseFlags,
                                                        zeroshard::PrintUsage, zeroshard::Run);
}
