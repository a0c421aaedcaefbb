// pipeline_bubble_bench: the 1F1B pipeline bubble against the ideal
// (p - 1) / (m + p - 1), for p = 2, 4 stages and m = 4, 8, 16 micro-batches,
// on local ranks (threads), one stage per rank.
//
//   build/perf/runtime/pipeline_bubble_bench                 (both modes)
//   build/perf/runtime/pipeline_bubble_bench --mode sleep --tf-ms 2 --tb-ms 4
//
// sleep: each forward / backward is a sleep of tF / tB (no CPU used), so
//   the stages do not compete for cores and the figure measures the
//   schedule (OneFOneBSchedule) and the Send/Recv machinery alone: each op
//   waits for its Recv from the neighbour, sleeps, then Sends, exactly as
//   GridMlpTrainer does. bubble = 1 - m (tF + tB) / step wall time (the
//   slowest stage's), plus the time the stages spent blocked in Recv.
// compute: GridMlpTrainer on a dp 1 x tp 1 x pp p grid, the real MLP
//   (mlp_demo's default size unless --hidden/--blocks): bubble =
//   Engine::Stats().totals.pipeline_bubble / total, mean over stages. With
//   more stage threads than cores the stages time-share the CPU and the
//   figure mixes bubble with contention: read it beside the sleep figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/flags.h"
#include "examples/mlp/grid_trainer.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/model_flags.h"
#include "examples/mlp/pipeline_schedule.h"
#include "perf/bench_main.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/process_grid.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

struct BenchOptions {
  std::string mode = "both";
  double tf_ms = 2.0;
  double tb_ms = 4.0;
  int steps = 3;  // timed steps per configuration (after one warm-up step)
  mlp::MlpConfig model = mlp::MlpShape(/*hidden=*/256, /*blocks=*/4, /*micro_batch=*/16);
};

constexpr int kStages[] = {2, 4};
constexpr int kMicroBatches[] = {4, 8, 16};
constexpr int64_t kMessageFloats = 16 * 256;  // one activation of the demo's micro-batch

double Ideal(int p, int m) { return static_cast<double>(p - 1) / (m + p - 1); }

// One step of the sleep pipeline on stage `s`; returns the step's wall time
// and adds the time blocked in Recv to *recv_wait.
absl::StatusOr<absl::Duration> SleepStep(Communicator& comm, int m, const BenchOptions& o,
                                         absl::Duration* recv_wait) {
  const int p = comm.size(), s = comm.rank();
  std::vector<float> in(kMessageFloats), out(kMessageFloats, 1.0f);
  ZS_RETURN_IF_ERROR(comm.BarrierSync());
  const absl::Time start = absl::Now();
  std::vector<CommHandle> sends;
  for (const mlp::PipelineOp& op : mlp::OneFOneBSchedule(p, s, m)) {
    const bool forward = op.kind == mlp::PipelineOpKind::kForward;
    const int from = forward ? s - 1 : s + 1;
    const int to = forward ? s + 1 : s - 1;
    const uint64_t tag = forward ? 1 : 2;
    if (from >= 0 && from < p) {
      const absl::Time wait = absl::Now();
      ZS_RETURN_IF_ERROR(comm.Recv(in.data(), kMessageFloats, DType::kFloat32, from, tag).Wait());
      *recv_wait += absl::Now() - wait;
    }
    std::this_thread::sleep_for(
        std::chrono::microseconds(static_cast<int64_t>(1000 * (forward ? o.tf_ms : o.tb_ms))));
    if (to >= 0 && to < p) {
      sends.push_back(comm.Send(out.data(), kMessageFloats, DType::kFloat32, to, tag));
    }
  }
  for (CommHandle& h : sends) ZS_RETURN_IF_ERROR(h.Wait());
  const absl::Duration mine = absl::Now() - start;
  // The step ends when the slowest stage ends.
  double ms = absl::ToDoubleMilliseconds(mine), slowest = 0.0;
  std::vector<double> all(p);
  ZS_RETURN_IF_ERROR(comm.AllGatherSync(&ms, all.data(), 1, DType::kFloat64));
  for (double v : all) slowest = std::max(slowest, v);
  return absl::Milliseconds(slowest);
}

absl::Status RunSleep(const BenchOptions& o) {
  std::printf("\nsleep mode: tF %.1f ms, tB %.1f ms per op (sleeps: no CPU contention)\n", o.tf_ms,
              o.tb_ms);
  std::printf("  %3s %3s %12s %10s %10s %16s\n", "p", "m", "step ms", "bubble", "ideal",
              "recv wait/stage");
  for (int p : kStages) {
    for (int m : kMicroBatches) {
      double wall_ms = 0.0, wait_ms = 0.0;
      ZS_RETURN_IF_ERROR(RunLocalRanks(p, [&](int rank, Communicator& comm) -> absl::Status {
        absl::Duration wait;
        ZS_RETURN_IF_ERROR(SleepStep(comm, m, o, &wait).status());  // warm-up
        wait = absl::ZeroDuration();
        absl::Duration wall;
        for (int i = 0; i < o.steps; ++i) {
          ZS_ASSIGN_OR_RETURN(const absl::Duration d, SleepStep(comm, m, o, &wait));
          wall += d;
        }
        double w = absl::ToDoubleMilliseconds(wait) / o.steps, sum = 0.0;
        ZS_RETURN_IF_ERROR(comm.AllReduceSync(&w, &sum, 1, DType::kFloat64));
        if (rank == 0) {
          wall_ms = absl::ToDoubleMilliseconds(wall) / o.steps;
          wait_ms = sum / p;
        }
        return absl::OkStatus();
      }));
      const double busy = m * (o.tf_ms + o.tb_ms);
      std::printf("  %3d %3d %12.2f %9.1f%% %9.1f%% %13.2f ms\n", p, m, wall_ms,
                  100.0 * (1.0 - busy / wall_ms), 100.0 * Ideal(p, m), wait_ms);
    }
  }
  return absl::OkStatus();
}

absl::Status RunCompute(const BenchOptions& o) {
  std::printf(
      "\ncompute mode: GridMlpTrainer, %d blocks x hidden %lld, micro-batch %d, fp32, "
      "ZeRO stage 0, %u hardware threads\n",
      o.model.blocks, static_cast<long long>(o.model.hidden), o.model.micro_batch,
      std::thread::hardware_concurrency());
  std::printf("  %3s %3s %12s %10s %10s\n", "p", "m", "step ms", "bubble", "ideal");
  for (int p : kStages) {
    for (int m : kMicroBatches) {
      const GridShape shape{1, 1, p};
      double step_ms = 0.0, bubble = 0.0;
      ZS_RETURN_IF_ERROR(RunLocalRanks(p, [&](int rank, Communicator& world) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGrid> grid, ProcessGrid::Create(world, shape));
        std::unique_ptr<Device> device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(const ModelSpec shard,
                            mlp::BuildShardModelSpec(o.model, shape, grid->coord()));
        TrainSpec train;
        train.zero_stage = 0;
        train.grad_accum_steps = m;
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            Engine::Create(shard, train, *device, grid->dp(),
                                           ModelParallelOptions{&grid->model_parallel(), true}));
        ZS_RETURN_IF_ERROR(mlp::InitShardEngineParams(*engine, o.model, *grid));
        ZS_RETURN_IF_ERROR(engine->Start());
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<mlp::GridMlpTrainer> trainer,
                            mlp::GridMlpTrainer::Create(o.model, *engine, *grid));
        ZS_RETURN_IF_ERROR(trainer->TrainStep().status());  // warm-up
        const EngineStats before = engine->Stats();
        for (int i = 0; i < o.steps; ++i) ZS_RETURN_IF_ERROR(trainer->TrainStep().status());
        const EngineStats after = engine->Stats();
        double row[2] = {absl::ToDoubleMilliseconds(after.totals.pipeline_bubble -
                                                    before.totals.pipeline_bubble),
                         absl::ToDoubleMilliseconds(after.totals.total - before.totals.total)};
        double sum[2];
        ZS_RETURN_IF_ERROR(world.AllReduceSync(row, sum, 2, DType::kFloat64));
        if (rank == 0) {
          bubble = sum[0] / sum[1];
          step_ms = sum[1] / p / o.steps;
        }
        return absl::OkStatus();
      }));
      std::printf("  %3d %3d %12.2f %9.1f%% %9.1f%%\n", p, m, step_ms, 100.0 * bubble,
                  100.0 * Ideal(p, m));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<BenchOptions> ParseFlags(int argc, char** argv, bool* help) {
  const std::vector<std::string> modes = {"sleep", "compute", "both"};
  BenchOptions o;
  int mode = 2;
  cli::FlagSet flags;
  mlp::AddModelFlags(flags, &o.model, /*min_blocks=*/4);
  flags.Choice("mode", modes, &mode)
      .Number("tf-ms", &o.tf_ms, 0, 1e6, /*lo_open=*/true)
      .Number("tb-ms", &o.tb_ms, 0, 1e6, /*lo_open=*/true)
      .Int("steps", &o.steps, 1, cli::kMaxCount);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  o.mode = modes[mode];
  return o;
}

void PrintUsage() {
  std::printf(
      "usage: pipeline_bubble_bench [--mode sleep|compute|both] [--tf-ms 2] [--tb-ms 4]\n"
      "                             [--steps 3] [--hidden 256] [--blocks 4] [--micro-batch 16]\n");
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  using zeroshard::BenchOptions;
  return zeroshard::perf::BenchMain<BenchOptions>(
      "pipeline_bubble_bench", argc, argv, zeroshard::ParseFlags, zeroshard::PrintUsage,
      [](const BenchOptions& o) {
        std::printf("1F1B pipeline bubble vs the ideal (p-1)/(m+p-1), %d timed steps each\n",
                    o.steps);
        absl::Status status;
        if (o.mode != "compute") status = zeroshard::RunSleep(o);
        if (status.ok() && o.mode != "sleep") status = zeroshard::RunCompute(o);
        if (!status.ok()) {
          std::fprintf(stderr, "pipeline_bubble_bench: %s\n", status.ToString().c_str());
          return 1;
        }
        return 0;
      });
}
