// mlp_demo: trains the residual MLP on N ranks with a ZeRO stage, and the
// one-rank baseline that accumulates the same micro-batches, then reports
// loss, weight agreement, per-rank model-state memory and step time.
//
//   build/examples/mlp/mlp_demo [--ranks 4] [--stage 2] [--steps 200] ...
//   build/examples/mlp/mlp_demo --stage 3 --prefetch 2 --precision fp16
//   mpirun -n 4 build/examples/mlp/mlp_demo --backend mpi
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/checkpoint_dir_flag.h"
#include "cli/output_file.h"
#include "examples/common/cpu_blas.h"
#include "examples/common/machine_memory.h"
#include "examples/common/median.h"
#include "examples/common/scratch_dir.h"
#include "examples/common/tier_bytes.h"
#include "examples/mlp/demo_options.h"
#include "examples/mlp/demo_report.h"
#include "examples/mlp/demo_resources.h"
#include "examples/mlp/grid_trainer.h"
#include "examples/mlp/mlp.h"
#include "nlohmann/json.hpp"
#include "tools/machine_profile.h"
#include "tools/mlp_step_model.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/process_grid.h"
#include "zeroshard/status.h"
#if ZS_HAVE_CUDA
#include "examples/mlp/cuda/cuda_mlp_trainer.h"
#endif

namespace zeroshard {
namespace mlp {
namespace {

// Redraws one progress line on stderr (rank 0 only): in place on a terminal,
// a line per quarter otherwise so logs stay readable.
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total)
      : label_(std::move(label)), total_(total), tty_(isatty(STDERR_FILENO) != 0) {}

  void Update(int64_t done, double loss) {
    const absl::Time now = absl::Now();
    const bool last = done == total_;
    if (tty_) {
      if (!last && now - last_draw_ < absl::Milliseconds(100)) return;
    } else if (!last && (done * 4 / total_) == ((done - 1) * 4 / total_)) {
      return;
    }
    last_draw_ = now;
    const double seconds = absl::ToDoubleSeconds(now - start_);
    const int width = 24;
    const int filled = static_cast<int>(width * done / total_);
    std::fprintf(stderr, "%s%-26s [%s%s] %4lld/%lld  loss %.5f  %5.1f step/s%s", tty_ ? "\r" : "",
                 label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), loss, seconds > 0 ? done / seconds : 0.0,
                 (last || !tty_) ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  int64_t total_;
  bool tty_;
  absl::Time start_ = absl::Now();
  absl::Time last_draw_ = absl::InfinitePast();
};

// All-gathers `n` 8-byte values per rank that live in host memory; through
// `device` when the communicator moves GPU memory.
absl::Status AllGatherHost(Communicator& comm, Device& device, const void* mine, void* all, int n,
                           DType dtype) {
  if (comm.memory_kind() == DeviceKind::kCpu) return comm.AllGatherSync(mine, all, n, dtype);
  const int64_t bytes = int64_t{n} * 8;
  ZS_ASSIGN_OR_RETURN(DeviceBuffer temp,
                      device.Allocate(bytes * (comm.size() + 1), MemoryCategory::kWorkspace,
                                      "demo_report_exchange"));
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
  char* dev_all = temp.as<char>() + bytes;
  ZS_RETURN_IF_ERROR(device.CopyAsync(temp.data(), mine, bytes, *stream));
  ZS_RETURN_IF_ERROR(stream->Synchronize());
  ZS_RETURN_IF_ERROR(comm.AllGatherSync(temp.data(), dev_all, n, dtype));
  ZS_RETURN_IF_ERROR(device.CopyAsync(all, dev_all, bytes * comm.size(), *stream));
  return stream->Synchronize();
}

// Collects a per-rank row of `n` values on every rank (rank order).
absl::StatusOr<std::vector<int64_t>> GatherInt64(Communicator& comm, Device& device,
                                                 const int64_t* row, int n) {
  std::vector<int64_t> all(static_cast<size_t>(n) * comm.size());
  ZS_RETURN_IF_ERROR(AllGatherHost(comm, device, row, all.data(), n, DType::kInt64));
  return all;
}

// The engine's device for this run: this process's GPU for a --device cuda
// run's ranks.
absl::StatusOr<std::unique_ptr<Device>> MakeDevice(bool gpu, int ordinal) {
  if (gpu) return CreateCudaDevice(ordinal);
  return CreateCpuDevice();
}

// One optimizer step of whichever trainer the run uses.
struct StepFn {
  std::function<absl::StatusOr<double>()> train_step;
  std::function<const StepResult&()> last_step;
};

absl::Status GatherLedger(Communicator& comm, Device& device, RunResult* out) {
  LedgerRow row;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    row[c] = device.ledger().current(static_cast<MemoryCategory>(c));
  }
  row[kNumMemoryCategories] = device.ledger().current_model_states();
  const int n = static_cast<int>(row.size());
  ZS_ASSIGN_OR_RETURN(std::vector<int64_t> all, GatherInt64(comm, device, row.data(), n));
  if (comm.rank() != 0) return absl::OkStatus();
  out->ledger.assign(comm.size(), LedgerRow{});
  for (int r = 0; r < comm.size(); ++r) {
    std::copy(all.begin() + r * n, all.begin() + (r + 1) * n, out->ledger[r].begin());
  }
  return absl::OkStatus();
}

// Each step's total and total - input wait, ms, as Engine::Stats().last
// gives them after the step.
struct StepSeries {
  std::vector<double> total, less_input;
  void Add(const StepTimes& t) {
    total.push_back(absl::ToDoubleMilliseconds(t.total));
    less_input.push_back(absl::ToDoubleMilliseconds(t.total - t.input_wait));
  }
  // The median after the warm-up steps (of all steps when there are no more).
  static double Median(std::vector<double> v) {
    if (static_cast<int>(v.size()) > kTimingWarmupSteps)
      v.erase(v.begin(), v.begin() + kTimingWarmupSteps);
    return examples::Median(std::move(v));
  }
};

// Collects every rank's time split (ms per step, TimeColumn order) on rank 0.
absl::Status GatherTimes(Communicator& comm, Device& device, const EngineStats& stats,
                         const StepSeries& series, RunResult* out) {
  const double steps = std::max<int64_t>(1, stats.steps);
  const double row[kNumTimeColumns] = {
      absl::ToDoubleMilliseconds(stats.totals.compute) / steps,
      absl::ToDoubleMilliseconds(stats.totals.exposed_comm) / steps,
      absl::ToDoubleMilliseconds(stats.totals.optimizer) / steps,
      absl::ToDoubleMilliseconds(stats.totals.input_wait) / steps,
      absl::ToDoubleMilliseconds(stats.totals.engine_other) / steps,
      absl::ToDoubleMilliseconds(stats.totals.pipeline_bubble) / steps,
      absl::ToDoubleMilliseconds(stats.totals.total) / steps,
      absl::ToDoubleMilliseconds(stats.totals.hidden_comm) / steps,
      StepSeries::Median(series.total),
      StepSeries::Median(series.less_input)};
  std::vector<double> all(static_cast<size_t>(kNumTimeColumns) * comm.size());
  ZS_RETURN_IF_ERROR(
      AllGatherHost(comm, device, row, all.data(), kNumTimeColumns, DType::kFloat64));
  if (comm.rank() == 0) {
    for (int r = 0; r < comm.size(); ++r) {
      out->step_ms.emplace_back(all.begin() + r * kNumTimeColumns,
                                all.begin() + (r + 1) * kNumTimeColumns);
    }
  }
  return absl::OkStatus();
}

// The trainer's part of a checkpoint: where its sampler is and what its
// data generator is keyed by (the MLP's data are a pure function of the
// seeds and the sample index, so this is the whole data state).
std::string TrainerState(const MlpConfig& cfg, int64_t step) {
  return absl::StrFormat(
      "{\"sampler_step\": %d, \"micro_batch\": %d, \"data_seed\": %d, \"teacher_seed\": %d, "
      "\"init_seed\": %d}",
      step, cfg.micro_batch, cfg.data_seed, cfg.teacher_seed, cfg.init_seed);
}

// The resumed trainer state must describe this run's data.
absl::Status CheckTrainerState(const MlpConfig& cfg, const CheckpointInfo& info) {
  const std::string expected = TrainerState(cfg, info.step);
  const nlohmann::json saved = nlohmann::json::parse(info.trainer_state, nullptr, false);
  const nlohmann::json mine = nlohmann::json::parse(expected, nullptr, false);
  if (saved != mine) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s: its trainer state %s does not describe this run's data (%s); resume "
        "with the same --micro-batch and seeds",
        info.path, info.trainer_state, mine.dump()));
  }
  return absl::OkStatus();
}

// One rank of a training run; rank 0 fills `out`. `checkpointed`: the run
// saves and resumes per opts (the distributed run; not the baseline).
absl::Status TrainRank(const DemoOptions& opts, int stage, int accum, const std::string& label,
                       bool checkpointed, Communicator& comm, RunResult* out) {
  const absl::Time start = absl::Now();
  const bool lead = comm.rank() == 0;
  const bool gpu = comm.memory_kind() == DeviceKind::kCuda;
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, MakeDevice(gpu, opts.gpu_ordinal));
  // The distributed run keeps its optimizer state on --offload's tier; the
  // baseline on the device.
  TrainSpec train = MakeTrainSpec(opts, stage, accum);
  if (checkpointed) {
    train.offload = opts.offload;
    train.zeropp = opts.zeropp;
    if (opts.hpz) train.zeropp.secondary_partition_size = comm.node_layout().max_ranks_per_node();
  }
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                      Engine::Create(BuildModelSpec(opts.model), train, *device, comm));
  // The engine's bytes per tier, before a trainer adds anything of its own.
  if (lead) {
    ZS_ASSIGN_OR_RETURN(out->tiers, examples::ReadTierBytes(*engine, comm.size()));
  }
  if (checkpointed && opts.resume) {
    ZS_ASSIGN_OR_RETURN(CheckpointInfo info, engine->Load(opts.checkpoint_dir));
    ZS_RETURN_IF_ERROR(CheckTrainerState(opts.model, info));
    if (lead) {
      out->first_step = info.step;
      out->resumed_world = info.world_size;
      out->resumed_accum_total = info.world_size * info.grad_accum_steps;
      std::fprintf(stderr,
                   "mlp_demo: resumed from %s: step %lld of %lld, written by %d rank(s) with ZeRO "
                   "stage %d, %s; trainer state %s\n",
                   info.path.c_str(), static_cast<long long>(info.step),
                   static_cast<long long>(opts.steps), info.world_size, info.zero_stage,
                   PrecisionName(info.precision), info.trainer_state.c_str());
      if (!info.note.empty()) std::fprintf(stderr, "mlp_demo: note: %s\n", info.note.c_str());
      out->resumed_changes = absl::StrJoin(info.changed_settings, ", ");
      if (!info.changed_settings.empty()) {
        std::fprintf(stderr,
                     "mlp_demo: note: this run differs from the one that saved: %s (the "
                     "trajectory is not the saved run's)\n",
                     absl::StrJoin(info.changed_settings, ", ").c_str());
      }
    }
  } else {
    ZS_RETURN_IF_ERROR(InitEngineParams(*engine, opts.model));
  }
  // A directory some rank cannot reach or write fails the run now, not at
  // its first save an interval of training later.
  if (checkpointed && opts.save_every > 0) {
    if (lead && !opts.resume) {
      ZS_RETURN_IF_ERROR(zeroshard::cli::ClearCheckpointDirForNewRun(
          opts.checkpoint_dir, opts.overwrite_checkpoints, "mlp_demo"));
    }
    ZS_RETURN_IF_ERROR(engine->PrepareCheckpointDirectory(opts.checkpoint_dir));
  }
  // The trainer (its data loader builds the teacher: ~0.4 s at hidden 512)
  // is made before Start(): the first step's time runs from the end of
  // Start(), so set-up after it would be booked as that step's compute.
  StepFn trainer;
  std::unique_ptr<MlpTrainer> cpu_trainer;
#if ZS_HAVE_CUDA
  std::unique_ptr<gpu::CudaMlpTrainer> gpu_trainer;
  if (gpu) {
    ZS_ASSIGN_OR_RETURN(gpu_trainer,
                        gpu::CudaMlpTrainer::Create(opts.model, *engine, comm, *device));
    trainer = {[&] { return gpu_trainer->TrainStep(); },
               [&]() -> const StepResult& { return gpu_trainer->last_step(); }};
  }
#endif
  if (!gpu) {
    cpu_trainer =
        std::make_unique<MlpTrainer>(opts.model, *engine, comm, MakeDataLoaderOptions(opts));
    trainer = {[&] { return cpu_trainer->TrainStep(); },
               [&]() -> const StepResult& { return cpu_trainer->last_step(); }};
  }
  ZS_RETURN_IF_ERROR(engine->Start(TrainerSettings(opts.model)));
  const int64_t first = engine->steps();
  StepSeries series;
  ProgressBar bar(label, opts.steps);
  CheckpointOptions save_options;
  save_options.keep_last = opts.keep_last;
  for (int64_t s = first; s < opts.steps; ++s) {
    ZS_ASSIGN_OR_RETURN(const double loss, trainer.train_step());
    series.Add(engine->Stats().last);
    if (checkpointed && opts.save_every > 0 && engine->steps() % opts.save_every == 0) {
      ZS_RETURN_IF_ERROR(engine->Save(opts.checkpoint_dir,
                                      TrainerState(opts.model, engine->steps()), save_options));
    }
    if (!lead) continue;
    out->losses.push_back(loss);
    if (trainer.last_step().clip_coef < 1.0) ++out->clipped_steps;
    if (trainer.last_step().skipped) ++out->skipped_steps;
    bar.Update(s + 1, loss);
  }
  // The last checkpoint is complete before the run reports.
  ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
  if (lead) out->wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);

  // Every rank takes part in GetParam (it gathers shards); rank 0 keeps them.
  // A tied alias is its owner's tensor: compared once, as the owner.
  const ModelSpec& spec = engine->model();
  for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
    const UnitSpec& unit = spec.units[static_cast<size_t>(u)];
    for (int p = 0; p < static_cast<int>(unit.params.size()); ++p) {
      if (unit.params[static_cast<size_t>(p)].tied_to.has_value()) continue;
      ZS_ASSIGN_OR_RETURN(std::vector<float> values, engine->GetParam(u, p));
      if (!lead) continue;
      out->params.push_back(std::move(values));
      out->param_names.push_back(unit.name + " " + unit.params[static_cast<size_t>(p)].name);
    }
  }
  if (lead && cpu_trainer != nullptr) out->activation_bytes = cpu_trainer->activation_bytes();
  ZS_RETURN_IF_ERROR(GatherLedger(comm, *device, out));
  if (lead) {
    TrainSpec on_device = train;
    on_device.offload = OffloadSpec();
    ZS_ASSIGN_OR_RETURN(BufferPlan plan,
                        PlanEngineBuffers(engine->model(), on_device, comm.size()));
    out->device_plan_without_offload = plan.total_bytes();
  }

  const EngineStats stats = engine->Stats();
  if (lead) {
    out->final_loss_scale = stats.loss_scale;
    out->prefetch_active = stats.prefetch_active;
  }
  return GatherTimes(comm, *device, stats, series, out);
}

// FNV-1a (64 bits) over the bytes of every weight, in order: equal for two
// runs exactly when their final weights are the same bits (but for a
// collision).
uint64_t WeightsFingerprint(const std::vector<std::vector<float>>& params) {
  uint64_t h = 14695981039346656037ull;
  for (const std::vector<float>& p : params) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p.data());
    for (size_t i = 0; i < p.size() * sizeof(float); ++i) {
      h = (h ^ bytes[i]) * 1099511628211ull;
    }
  }
  return h;
}

// --result-json: what a script needs to compare two runs bit for bit.
absl::Status WriteResultJson(const DemoOptions& opts, const DemoResults& r) {
  const RunResult& d = r.distributed;
  double slowest_step_ms = 0;
  for (const std::vector<double>& ms : d.step_ms) {
    slowest_step_ms = std::max(slowest_step_ms, ms[kTotalMs]);
  }
  nlohmann::json tiers = nlohmann::json::object();
  for (int t = 0; t < examples::kNumTiers; ++t) {
    tiers[MemoryTierName(static_cast<MemoryTier>(t))] = {{"plan", d.tiers.plan[t]},
                                                         {"ledger", d.tiers.ledger[t]}};
  }
  const nlohmann::json j = {
      {"offload", MemoryTierName(opts.offload.optimizer)},
      {"offload_grads", MemoryTierName(opts.offload.grads)},
      {"offload_params", MemoryTierName(opts.offload.params)},
      {"ranks", r.world},
      {"stage", opts.stage},
      {"precision", PrecisionName(opts.precision)},
      {"losses", d.losses},  // doubles: nlohmann writes them to round-trip
      {"weights_fnv1a64", absl::StrFormat("%016x", WeightsFingerprint(d.params))},
      {"tiers_rank0", tiers},
      {"device_plan_without_offload", d.device_plan_without_offload},
      {"baseline_losses", r.baseline.losses},
      {"zeropp",
       {{"qwz", opts.zeropp.quantized_weights},
        {"hpz", opts.hpz},
        {"qgz_bits", opts.zeropp.quantized_grad_bits}}},
      // mpi: every rank's bytes sent, summed (Communicator::traffic).
      {"inter_node_bytes", r.inter_node_bytes},
      {"intra_node_bytes", r.intra_node_bytes},
      // The slowest rank's mean step time (StepTimes' total, ms).
      {"step_ms", slowest_step_ms}};
  return cli::WriteOutputFile("--result-json", opts.result_json, j.dump(1) + "\n");
}

// One rank of a dp x tp x pp run (GridMlpTrainer); world rank 0 fills
// `out`, with the full weights assembled from every shard.
absl::Status GridTrainRank(const DemoOptions& opts, const GridShape& shape, int stage,
                           const std::string& label, Communicator& world, RunResult* out) {
  const absl::Time start = absl::Now();
  const bool lead = world.rank() == 0;
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGrid> grid, ProcessGrid::Create(world, shape));
  std::unique_ptr<Device> device = CreateCpuDevice();
  ZS_ASSIGN_OR_RETURN(const ModelSpec shard, BuildShardModelSpec(opts.model, shape, grid->coord()));
  // The optimizer's tier is the planner's choice (--mem-cap --machine), else
  // the device (opts.offload is refused with --tp/--pp).
  TrainSpec train = MakeTrainSpec(opts, stage, GridMicroBatches(opts.accum, shape));
  train.offload = opts.offload;
  if (train.offload.optimizer == MemoryTier::kNvme && shape.tp * shape.pp > 1) {
    // The swap files are named by dp rank: each (tp, pp) position's engines
    // get a directory of their own.
    ZS_ASSIGN_OR_RETURN(
        train.offload.dir,
        examples::GridSwapDir(train.offload.dir, grid->coord().tp, grid->coord().pp));
  }
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(shard, train, *device, grid->dp(),
                     ModelParallelOptions{&grid->model_parallel(), grid->coord().tp == 0}));
  if (lead) {
    // The planner's tier (--mem-cap --machine): rank 0's bytes per tier, and
    // its device plan without offload, for the report.
    ZS_ASSIGN_OR_RETURN(out->tiers, examples::ReadTierBytes(*engine, grid->dp().size()));
    TrainSpec on_device = train;
    on_device.offload = OffloadSpec();
    ZS_ASSIGN_OR_RETURN(BufferPlan plan, PlanEngineBuffers(shard, on_device, grid->dp().size()));
    out->device_plan_without_offload = plan.total_bytes();
  }
  ZS_RETURN_IF_ERROR(InitShardEngineParams(*engine, opts.model, *grid));
  // Before Start(), as in TrainRank: set-up after it is the first step's time.
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<GridMlpTrainer> trainer,
                      GridMlpTrainer::Create(opts.model, *engine, *grid));
  ZS_RETURN_IF_ERROR(engine->Start(TrainerSettings(opts.model)));
  StepSeries series;
  ProgressBar bar(label, opts.steps);
  for (int64_t s = 0; s < opts.steps; ++s) {
    ZS_ASSIGN_OR_RETURN(const double loss, trainer->TrainStep());
    series.Add(engine->Stats().last);
    if (!lead) continue;
    out->losses.push_back(loss);
    if (trainer->last_step().clip_coef < 1.0) ++out->clipped_steps;
    if (trainer->last_step().skipped) ++out->skipped_steps;
    bar.Update(s + 1, loss);
  }
  if (lead) out->wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  ZS_ASSIGN_OR_RETURN(std::vector<std::vector<float>> params,
                      GatherGridParams(*engine, opts.model, *grid));
  if (lead) out->params = std::move(params);
  ZS_RETURN_IF_ERROR(GatherLedger(world, *device, out));
  const EngineStats stats = engine->Stats();
  if (lead) {
    out->final_loss_scale = stats.loss_scale;
    out->prefetch_active = stats.prefetch_active;
  }
  return GatherTimes(world, *device, stats, series, out);
}

// A stage-0 engine on the same ranks, created only to read what it allocates.
absl::Status Stage0LedgerRank(const DemoOptions& opts, Communicator& comm, RunResult* out) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                      MakeDevice(comm.memory_kind() == DeviceKind::kCuda, opts.gpu_ordinal));
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                      Engine::Create(BuildModelSpec(opts.model),
                                     MakeTrainSpec(opts, /*stage=*/0, opts.accum), *device, comm));
  return GatherLedger(comm, *device, out);
}

// A stage-0 engine on this rank's shard of the grid, for its ledger only.
absl::Status GridStage0LedgerRank(const DemoOptions& opts, const GridShape& shape,
                                  Communicator& world, RunResult* out) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGrid> grid, ProcessGrid::Create(world, shape));
  std::unique_ptr<Device> device = CreateCpuDevice();
  ZS_ASSIGN_OR_RETURN(const ModelSpec shard, BuildShardModelSpec(opts.model, shape, grid->coord()));
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(shard, MakeTrainSpec(opts, 0, GridMicroBatches(opts.accum, shape)), *device,
                     grid->dp(),
                     ModelParallelOptions{&grid->model_parallel(), grid->coord().tp == 0}));
  return GatherLedger(world, *device, out);
}

// Everything one rank of the distributed side does: train, then the stage-0
// memory reference. `results->grid` says whether it is a grid run.
absl::Status DistributedRank(const DemoOptions& opts, Communicator& comm, DemoResults* results) {
  if (!results->grid_origin.empty()) {
    const GridShape shape = results->grid;
    const std::string label =
        absl::StrFormat("stage %d, tp %d pp %d dp %d", opts.stage, shape.tp, shape.pp, shape.dp);
    ZS_RETURN_IF_ERROR(GridTrainRank(opts, shape, opts.stage, label, comm, &results->distributed));
    return GridStage0LedgerRank(opts, shape, comm, &results->stage0);
  }
  const std::string label = absl::StrFormat("stage %d, %d ranks", opts.stage, comm.size());
  ZS_RETURN_IF_ERROR(TrainRank(opts, opts.stage, opts.accum, label, /*checkpointed=*/true, comm,
                               &results->distributed));
  return Stage0LedgerRank(opts, comm, &results->stage0);
}

absl::Status Baseline(const DemoOptions& opts, int world, DemoResults* results) {
  return RunLocalRanks(
      1,
      [&](int, Communicator& comm) {
        return TrainRank(opts, /*stage=*/0, world * opts.accum, "baseline, 1 rank",
                         /*checkpointed=*/false, comm, &results->baseline);
      },
      MakeCommOptions(opts));
}

// Prints the error and ends the whole job: the other ranks may be dead or
// stuck, so there is no orderly shutdown to wait for (with MPI, MPI_Abort
// makes the launcher end every rank; a local run's stuck threads end with
// the process).
[[noreturn]] void Fail(const absl::Status& status) {
  std::fprintf(stderr, "mlp_demo: run failed: %s\n", status.ToString().c_str());
  AbortJob(1);
}

// The machine profile of --machine, read as `zeroshard estimate --machine`
// reads it (ReadTextFile: a regular file of at most kMaxTextFileBytes; a
// FIFO or a device is refused at once).
absl::StatusOr<MachineProfile> ReadMachineProfile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path, "the --machine profile");
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrFormat("%s; write it with `zeroshard calibrate --out %s`",
                                               text.status().message(), path));
  }
  if (!text.ok()) return text.status();
  return ParseMachineProfile(*text, path);
}

// The distributed run's grid: dp only, the --tp/--pp split, or (--mem-cap)
// the planner's choice, which may also set the ZeRO stage in `opts`.
// `lead` prints the choice.
absl::Status ChooseGrid(DemoOptions* opts, int world, bool lead, DemoResults* results) {
  results->grid = GridShape{world, 1, 1};
  if (!UsesGrid(*opts)) return absl::OkStatus();
  if (opts->mem_cap > 0) {
    // The planner sizes every candidate with the engine's own buffer plan
    // for this run's TrainSpec (its stage and, with --machine, its
    // optimizer tier are the planner's to choose).
    GridOptions grid_options;
    MachineProfile profile;
    if (!opts->machine.empty()) {
      ZS_ASSIGN_OR_RETURN(profile, ReadMachineProfile(opts->machine));
      grid_options.optimizer_tiers = {MemoryTier::kDevice, MemoryTier::kHost};
      // NVMe only when the profile has its rates (zeroshard calibrate
      // --what offload): the model cannot time it otherwise.
      if (profile.offload.nvme_read_bytes_per_s > 0) {
        grid_options.optimizer_tiers.push_back(MemoryTier::kNvme);
      } else if (lead) {
        std::fprintf(stderr,
                     "mlp_demo: %s has no NVMe rates; the NVMe tier is not considered (add them "
                     "with `zeroshard calibrate --what offload`)\n",
                     opts->machine.c_str());
      }
      const MlpWorkload workload{opts->model.hidden, opts->model.blocks, opts->model.micro_batch};
      const std::string backend = opts->backend_mpi ? "mpi" : "local";
      const int accum = opts->accum;
      grid_options.step_time = [workload, backend, accum,
                                &profile](const GridCandidate& c) -> absl::StatusOr<double> {
        ZS_ASSIGN_OR_RETURN(
            const GridStepPrediction p,
            PredictMlpGridStep(workload, {c.tp, c.pp, c.dp, c.stage, c.optimizer_tier, accum},
                               backend, profile));
        return p.total;
      };
    }
    absl::StatusOr<GridPlan> plan =
        PlanGrid(BuildModelSpec(opts->model), MakeTrainSpec(*opts, opts->stage, opts->accum), world,
                 opts->mem_cap, grid_options);
    if (!plan.ok()) {
      return absl::Status(plan.status().code(),
                          absl::StrFormat("--mem-cap %s on %d ranks: %s", FormatSize(opts->mem_cap),
                                          world, plan.status().message()));
    }
    const GridCandidate& chosen = plan->chosen_candidate();
    results->grid = GridShape{chosen.dp, chosen.tp, chosen.pp};
    results->grid_origin =
        absl::StrFormat("the planner's choice for --mem-cap %s", FormatSize(opts->mem_cap));
    results->planned_bytes = chosen.per_rank_bytes;
    opts->stage = chosen.stage;
    // The engines of the grid run get this tier (GridTrainRank); an nvme
    // choice swaps under opts->offload.dir, made by main (ChoosesOffload).
    opts->offload.optimizer = chosen.optimizer_tier;
    if (lead) PrintGridPlan(*plan, GridMicroBatches(opts->accum, results->grid), stderr);
    if (lead && chosen.optimizer_tier != MemoryTier::kDevice) {
      std::fprintf(stderr, "mlp_demo: optimizer state on the %s tier%s%s\n",
                   MemoryTierName(chosen.optimizer_tier),
                   chosen.optimizer_tier == MemoryTier::kNvme ? ", swap files under " : "",
                   chosen.optimizer_tier == MemoryTier::kNvme ? opts->offload.dir.c_str() : "");
    }
    return absl::OkStatus();
  }
  if (world % (opts->tp * opts->pp) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d ranks are not a multiple of --tp %d x --pp %d", world, opts->tp, opts->pp));
  }
  results->grid = GridShape{world / (opts->tp * opts->pp), opts->tp, opts->pp};
  results->grid_origin = "--tp/--pp";
  if (lead) {
    std::fprintf(stderr, "mlp_demo: grid %s, ZeRO stage %d over dp, %d micro-batches per dp rank\n",
                 results->grid.ToString().c_str(), opts->stage,
                 GridMicroBatches(opts->accum, results->grid));
  }
  return absl::OkStatus();
}

// Under mpirun every rank chooses its grid from its own flags. A rank
// started with other --tp, --pp or --mem-cap would enter other collectives
// than its peers (a dp-only rank the engine's start-up check, a grid rank
// ProcessGrid::Create's shape exchange) and the job could hang instead of
// failing, so the flags are compared first: one all-gather, on every rank.
// The grid flags are refused with --device cuda, so a GPU run has nothing to
// compare (and its nccl communicator would need device buffers).
absl::Status AgreeGridFlags(const DemoOptions& opts, Communicator& comm) {
  if (opts.device_cuda) return absl::OkStatus();
  const int64_t mine[3] = {opts.tp, opts.pp, opts.mem_cap};
  std::vector<int64_t> all(static_cast<size_t>(3) * comm.size());
  ZS_RETURN_IF_ERROR(comm.AllGatherSync(mine, all.data(), 3, DType::kInt64));
  auto flags = [&](int r) {
    return absl::StrFormat("--tp %d --pp %d --mem-cap %s", all[3 * r], all[3 * r + 1],
                           all[3 * r + 2] > 0 ? FormatSize(all[3 * r + 2]) : "(none)");
  };
  for (int r = 1; r < comm.size(); ++r) {
    if (!std::equal(all.begin() + 3 * r, all.begin() + 3 * r + 3, all.begin())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d was started with %s but rank 0 with %s; give every rank the same --tp, --pp "
          "and --mem-cap (they choose the grid)",
          r, flags(r), flags(0)));
    }
  }
  return absl::OkStatus();
}

// With --mem-cap --machine each rank times the candidates with its own
// profile file; ranks that chose differently would enter different
// collectives, so the choices are compared first (one all-gather).
absl::Status AgreeGridChoice(const DemoOptions& opts, const GridShape& grid, Communicator& comm) {
  if (opts.device_cuda || opts.mem_cap == 0) return absl::OkStatus();
  const int64_t mine[5] = {grid.dp, grid.tp, grid.pp, opts.stage,
                           static_cast<int64_t>(opts.offload.optimizer)};
  std::vector<int64_t> all(static_cast<size_t>(5) * comm.size());
  ZS_RETURN_IF_ERROR(comm.AllGatherSync(mine, all.data(), 5, DType::kInt64));
  for (int r = 1; r < comm.size(); ++r) {
    if (!std::equal(all.begin() + 5 * r, all.begin() + 5 * r + 5, all.begin())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d chose dp %d x tp %d x pp %d, stage %d, optimizer tier %d under --mem-cap but "
          "rank 0 chose dp %d x tp %d x pp %d, stage %d, optimizer tier %d; give every rank the "
          "same --machine profile",
          r, all[5 * r], all[5 * r + 1], all[5 * r + 2], all[5 * r + 3], all[5 * r + 4], all[0],
          all[1], all[2], all[3], all[4]));
    }
  }
  return absl::OkStatus();
}

// The model of `cfg` in the JSON of `zeroshard estimate --spec`
// (docs/estimator.md): units and params with the ParamSpec fields the
// estimator reads (trainable, tied_to, lr_scale, weight_decay written only
// when not the default). No activation bytes: the trainer keeps its
// activations outside the engine, and the estimate is set against the
// engine's ledger.
nlohmann::json SpecJson(const MlpConfig& cfg) {
  nlohmann::json units = nlohmann::json::array();
  for (const UnitSpec& unit : BuildModelSpec(cfg).units) {
    nlohmann::json params = nlohmann::json::array();
    for (const ParamSpec& p : unit.params) {
      nlohmann::json j = {{"name", p.name}, {"shape", p.shape}, {"no_decay", p.no_decay}};
      if (!p.trainable) j["trainable"] = false;
      if (p.tied_to.has_value()) {
        j["tied_to"] = {{"unit", p.tied_to->unit}, {"param", p.tied_to->param}};
      }
      if (p.lr_scale != 1.0) j["lr_scale"] = p.lr_scale;
      if (p.weight_decay.has_value()) j["weight_decay"] = *p.weight_decay;
      params.push_back(std::move(j));
    }
    units.push_back({{"name", unit.name}, {"params", std::move(params)}});
  }
  std::string name = absl::StrFormat("mlp h%d b%d", cfg.hidden, cfg.blocks);
  if (cfg.lm()) name += absl::StrFormat(" vocab %d", cfg.vocab);
  if (cfg.lora()) name += absl::StrFormat(" lora %d", cfg.lora_rank);
  return {{"name", name}, {"units", std::move(units)}};
}

int RunLocal(DemoOptions opts) {
  DemoResults results;
  results.world = opts.ranks;
  if (absl::Status s = ChooseGrid(&opts, opts.ranks, true, &results); !s.ok()) Fail(s);
  CommOptions options = MakeCommOptions(opts);
  std::unique_ptr<Device> gpu;
  if (opts.device_cuda) {
    absl::StatusOr<std::unique_ptr<Device>> device = CreateCudaDevice(0);
    if (!device.ok()) Fail(device.status());
#if !ZS_HAVE_CUDA
    Fail(absl::UnimplementedError("--device cuda: mlp_demo was built without CUDA"));
#endif
    gpu = std::move(*device);
    options.device = gpu.get();  // the ranks' collectives on GPU 0's memory
  }
  absl::Status status = RunLocalRanks(
      opts.ranks, [&](int, Communicator& comm) { return DistributedRank(opts, comm, &results); },
      options);
  if (!status.ok()) Fail(status);
  status = Baseline(opts, opts.ranks, &results);
  if (!status.ok()) Fail(status);
  PrintReport(opts, results, stdout);
  if (!opts.result_json.empty()) {
    if (absl::Status s = WriteResultJson(opts, results); !s.ok()) Fail(s);
  }
  if (absl::Status s = cli::FlushStandardOutput(); !s.ok()) Fail(s);
  return 0;
}

// This process's GPU under mpirun: its rank on the node (OpenMPI's
// OMPI_COMM_WORLD_LOCAL_RANK, Slurm's SLURM_LOCALID) modulo the GPUs.
int LocalGpuOrdinal() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    int rank = 0;
    if (const char* v = std::getenv(name); v != nullptr && absl::SimpleAtoi(v, &rank)) {
      return rank % std::max(1, CudaDeviceCount());
    }
  }
  return 0;
}

int RunMpi(DemoOptions opts) {
  std::unique_ptr<Device> gpu;  // outlives the communicator
  absl::StatusOr<std::unique_ptr<Communicator>> comm;
  if (opts.device_cuda) {
    // One process per GPU; the collectives go through nccl between them.
    opts.gpu_ordinal = LocalGpuOrdinal();
    absl::StatusOr<std::unique_ptr<Device>> device = CreateCudaDevice(opts.gpu_ordinal);
    if (!device.ok()) Fail(device.status());
    gpu = std::move(*device);
    comm = CreateNcclCommunicator(*gpu, MakeCommOptions(opts));
  } else {
    comm = CreateMpiCommunicator(MakeCommOptions(opts));
  }
  if (!comm.ok()) Fail(comm.status());
  const bool lead = (*comm)->rank() == 0;
  DemoResults results;
  results.world = (*comm)->size();
  results.nodes = (*comm)->node_layout().Describe();
  results.collective_path = (*comm)->collective_path();
  // The error names the rank that differs; every rank reports it.
  if (absl::Status s = AgreeGridFlags(opts, **comm); !s.ok()) Fail(s);
  // Before anything is allocated: this node's ranks and the baseline fit.
  if (absl::Status s =
          CheckDemoMemory(opts, results.world, (*comm)->node_layout().max_ranks_per_node(),
                          examples::ReadMachineMemory());
      !s.ok()) {
    Fail(absl::Status(s.code(), absl::StrFormat("rank %d: %s", (*comm)->rank(), s.message())));
  }
  if (absl::Status s = ChooseGrid(&opts, results.world, lead, &results); !s.ok()) {
    Fail(absl::Status(s.code(), absl::StrFormat("rank %d: %s", (*comm)->rank(), s.message())));
  }
  if (absl::Status s = AgreeGridChoice(opts, results.grid, **comm); !s.ok()) Fail(s);
  absl::Status status = DistributedRank(opts, **comm, &results);
  if (status.ok()) {
    // Every rank's collective bytes within and across nodes (the
    // communicator's counters, taken before this exchange adds its own).
    const CommTraffic t = (*comm)->traffic();
    const int64_t mine[2] = {t.intra_node_bytes, t.inter_node_bytes};
    std::vector<int64_t> all(2 * static_cast<size_t>(results.world));
    status = (*comm)->AllGather(mine, all.data(), 2, DType::kInt64).Wait();
    for (int r = 0; r < results.world; ++r) {
      results.intra_node_bytes += all[2 * r];
      results.inter_node_bytes += all[2 * r + 1];
    }
  }
  // The baseline is one rank: rank 0 runs it alone, the others are done.
  if (status.ok() && lead) status = Baseline(opts, results.world, &results);
  if (!status.ok()) {
    // Not FinalizeMpi: it would wait for peers that may never come.
    Fail(absl::Status(status.code(),
                      absl::StrFormat("rank %d: %s", (*comm)->rank(), status.message())));
  }
  if (lead) PrintReport(opts, results, stdout);
  if (lead && !opts.result_json.empty()) {
    if (absl::Status s = WriteResultJson(opts, results); !s.ok()) Fail(s);
  }
  if (absl::Status s = cli::FlushStandardOutput(); !s.ok()) Fail(s);
  comm->reset();
  FinalizeMpi();
  return 0;
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard

int main(int argc, char** argv) {
  using zeroshard::mlp::DemoOptions;
  bool help = false;
  absl::StatusOr<DemoOptions> opts = zeroshard::mlp::ParseDemoFlags(argc, argv, &help);
  if (help) {
    zeroshard::mlp::PrintUsage(stdout);
    return 0;
  }
  if (!opts.ok()) {
    std::fprintf(stderr, "mlp_demo: %s (see --help)\n",
                 std::string(opts.status().message()).c_str());
    return 2;
  }
  if (opts->print_spec) {
    std::printf("%s\n", zeroshard::mlp::SpecJson(opts->model).dump(2).c_str());
    return 0;
  }
  // A new run does not save over another run's checkpoints (every process
  // reads the directory; the lead removes them with --overwrite-checkpoints).
  if (!opts->resume && opts->save_every > 0) {
    if (absl::Status s = zeroshard::cli::CheckNewRunCheckpointDir(opts->checkpoint_dir,
                                                                  opts->overwrite_checkpoints);
        !s.ok()) {
      std::fprintf(stderr, "mlp_demo: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  // The input files are refused now, with the flags, when they are not
  // what they must be (a FIFO, a device, a directory, not a profile, no
  // checkpoint), rather than once the ranks have started; ChooseGrid and
  // the ranks' Load read them again.
  absl::Status inputs = absl::OkStatus();
  if (!opts->machine.empty()) inputs = zeroshard::mlp::ReadMachineProfile(opts->machine).status();
  if (inputs.ok() && opts->resume) {
    inputs = zeroshard::ReadCheckpointInfo(opts->checkpoint_dir).status();
  }
  if (!inputs.ok()) {
    std::fprintf(stderr, "mlp_demo: %s\n", std::string(inputs.message()).c_str());
    return 2;
  }
  // The local run's ranks are threads of this process: their estimated
  // bytes and the baseline's must fit the machine before anything is
  // allocated (mpi: each process checks its node in RunMpi).
  if (!opts->backend_mpi) {
    if (absl::Status s = zeroshard::mlp::CheckDemoMemory(*opts, opts->ranks, opts->ranks,
                                                         zeroshard::examples::ReadMachineMemory());
        !s.ok()) {
      std::fprintf(stderr, "mlp_demo: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  // The BLAS's kernel path is chosen before any rank's thread runs a
  // product; a path slower than the CPU allows is said at once, not only in
  // the final report.
  if (!zeroshard::examples::SetUpCpuBlas().warning.empty()) {
    std::fprintf(stderr, "mlp_demo: BLAS: %s\n", zeroshard::examples::CpuBlasDescription().c_str());
  }
  // The nvme tier's swap files: --offload-dir, else a fresh directory
  // removed at the end (one per process: the files are named by rank).
  // Made before the run when --mem-cap --machine may choose the tier too.
  absl::StatusOr<zeroshard::examples::ScratchDir> swap_dir;
  if (opts->offload.optimizer == zeroshard::MemoryTier::kNvme ||
      zeroshard::mlp::ChoosesOffload(*opts)) {
    swap_dir = zeroshard::examples::ScratchDir::Create(opts->offload.dir, "zs_mlp_demo_swap_");
    if (!swap_dir.ok()) {
      std::fprintf(stderr, "mlp_demo: %s\n", std::string(swap_dir.status().message()).c_str());
      return 1;
    }
    opts->offload.dir = swap_dir->path();
  }
  return opts->backend_mpi ? zeroshard::mlp::RunMpi(*opts) : zeroshard::mlp::RunLocal(*opts);
}
