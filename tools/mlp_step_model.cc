// The calibrated step-time model of an engine run of the example MLP
// (PredictMlpEngineStep, tools/mlp_step_model.h; docs/estimator.md,
// "Calibrated step time").
#include "tools/mlp_step_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/machine_profile.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/estimate/byte_units.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/status.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {
namespace {

// nccl-tests bytes of the two small collectives every step makes besides
// the units': the engine's all-gather of each rank's norm record
// (GlobalSumSquaresAndCheckSequence) and the trainer's all-reduce of the
// loss (one double).
constexpr double kNormRecordBytesPerRank = 64.0;
constexpr double kLossBytes = 8.0;

// Per micro-batch of one rank, what MlpTrainer computes (examples/mlp:
// BlockForward / BlockBackward per unit, the view copies of MlpTrainer).
struct TrainerWork {
  double gemm_flops = 0;
  double gelu_elements = 0;
  double gelu_grad_elements = 0;
  double copy_bytes = 0;  // memcpy-like passes, bytes counted once
};

TrainerWork TrainerMicroBatch(const MlpWorkload& w) {
  const double h = static_cast<double>(w.hidden);
  const double b = static_cast<double>(w.micro_batch);
  const double blocks = static_cast<double>(w.blocks);
  const double inner = 4.0 * h;
  const double gemm = 2.0 * b * inner * h;  // every one of the block's products
  const double unit_numel = 2.0 * inner * h + inner + h;
  TrainerWork t;
  // Forward: 2 products per block. Backward: dW2, dpre, dW1 and dx per
  // block, but no dx for the first block (nothing to propagate to).
  t.gemm_flops = gemm * (2.0 * blocks + 4.0 * blocks - 1.0);
  t.gelu_elements = blocks * b * inner;
  t.gelu_grad_elements = blocks * b * inner;
  // The unit's fp32 weights copied out of the view in the forward and
  // again in the backward, the gradients copied into the view; plus the
  // bias, residual and column-sum passes (b x 12 h floats per block).
  t.copy_bytes = blocks * (3.0 * unit_numel * 4.0 + b * 12.0 * h * 4.0);
  return t;
}

// The loader's thread per micro-batch: the teacher's forward (same shapes)
// and b x h normal inputs, costed as one transcendental each (a GELU).
TrainerWork LoaderMicroBatch(const MlpWorkload& w) {
  const double h = static_cast<double>(w.hidden);
  const double b = static_cast<double>(w.micro_batch);
  const double blocks = static_cast<double>(w.blocks);
  TrainerWork t;
  t.gemm_flops = blocks * 2.0 * (2.0 * b * 4.0 * h * h);
  t.gelu_elements = blocks * b * 4.0 * h + b * h;
  t.copy_bytes = blocks * b * 6.0 * h * 4.0;
  return t;
}

double Seconds(const TrainerWork& t, const MachineProfile& p) {
  return t.gemm_flops / p.sgemm_flops_per_s + t.gelu_elements * p.gelu_s_per_element +
         t.gelu_grad_elements * p.gelu_grad_s_per_element + t.copy_bytes / p.copy_bytes_per_s;
}

// The promise of the prediction: every figure finite, non-negative, and
// every time at most kMaxPredictedStepSeconds. The profile and workload
// ranges keep each figure finite; a time past the bound names itself.
absl::Status CheckFigures(const EngineStepPrediction& p) {
  const std::pair<const char*, double> times[] = {{"gemm", p.gemm},
                                                  {"element-wise", p.elementwise},
                                                  {"compute", p.compute},
                                                  {"optimizer", p.optimizer},
                                                  {"communication", p.comm_total},
                                                  {"exposed communication", p.exposed_comm},
                                                  {"loader", p.loader},
                                                  {"critical path", p.critical_path},
                                                  {"CPU work", p.cpu_work},
                                                  {"contention", p.contention},
                                                  {"total", p.total}};
  for (const auto& [what, seconds] : times) {
    if (!(seconds >= 0 && seconds <= kMaxPredictedStepSeconds)) {
      return absl::OutOfRangeError(absl::StrFormat(
          "the predicted %s time, %s s per step, passes the model's bound of %s s (%.1f days): "
          "the workload is far too large for the profile's measured rates (or the rates are "
          "wrong); lower --hidden, --blocks or --micro-batch, or check the profile",
          what, FormatNumber(seconds), FormatNumber(kMaxPredictedStepSeconds),
          kMaxPredictedStepSeconds / 86400));
    }
  }
  for (const auto& [what, count] : {std::pair<const char*, double>{"FLOP count", p.flops},
                                    {"communication bytes", p.comm_bytes}}) {
    if (!(count >= 0 && std::isfinite(count))) {
      return absl::InternalError(absl::StrFormat(
          "the predicted %s per step is %s; please report this with the command line", what,
          FormatNumber(count)));
    }
  }
  return absl::OkStatus();
}

// The workload's flat buffer as the engine lays it out (alignment and rank
// padding): every unit has the same segment, split into `ranks` shards.
struct MlpLayout {
  int64_t total_numel = 0;        // all units, padded
  int64_t shard_numel = 0;        // one rank's shard of every unit
  int64_t unit_padded_numel = 0;  // one unit's segment
};

// The engine's own plan for the workload's ModelSpec (`blocks` units of
// W1 [4h, h], b1 [4h], W2 [h, 4h], b2 [h]) at stage 1, fp32: its Adam
// moments are one rank's shard, and ranks x shard is the padded whole.
ModelSpec MlpSpec(const MlpWorkload& w) {
  ModelSpec spec;
  spec.units.resize(static_cast<size_t>(w.blocks));
  const int64_t h = w.hidden;
  const std::pair<const char*, std::vector<int64_t>> params[] = {
      {"w1", {4 * h, h}}, {"b1", {4 * h}}, {"w2", {h, 4 * h}}, {"b2", {h}}};
  for (int b = 0; b < w.blocks; ++b) {
    UnitSpec& unit = spec.units[static_cast<size_t>(b)];
    unit.name = absl::StrCat("block.", b);
    for (const auto& [name, shape] : params) {
      ParamSpec param;
      param.name = name;
      param.shape = shape;
      // Megatron's split (the grid trainer's): W1 and b1 by rows, W2 by
      // columns, b2 replicated.
      param.tp_split_dim = name == std::string("w2") ? 1 : name == std::string("b2") ? -1 : 0;
      unit.params.push_back(std::move(param));
    }
  }
  return spec;
}

absl::StatusOr<MlpLayout> LayOut(const MlpWorkload& w, int ranks) {
  const ModelSpec spec = MlpSpec(w);
  TrainSpec train;  // fp32, as the calibrated trainer runs
  train.zero_stage = 1;
  ZS_ASSIGN_OR_RETURN(const BufferPlan plan, PlanEngineBuffers(spec, train, ranks));
  const PlannedBuffer* moments = plan.Find(kAdamMBuffer);
  if (moments == nullptr) {
    return absl::InternalError("the engine's plan has no Adam moment buffer; please report this");
  }
  MlpLayout layout;
  layout.shard_numel = moments->numel;
  layout.total_numel = moments->numel * ranks;
  layout.unit_padded_numel = layout.total_numel / w.blocks;
  return layout;
}

}  // namespace

absl::StatusOr<EngineStepPrediction> PredictMlpEngineStep(const MlpWorkload& w, int stage,
                                                          int ranks, absl::string_view backend,
                                                          const MachineProfile& p,
                                                          int cpus_per_rank) {
  if (w.hidden < 1 || w.hidden > (1 << 16) || w.blocks < 1 || w.blocks > kMaxUnits ||
      w.micro_batch < 1 || w.micro_batch > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mlp workload: hidden %d (1-65536), blocks %d (1-%d), micro-batch %d (1-2^20) out of range",
        w.hidden, w.blocks, kMaxUnits, w.micro_batch));
  }
  if (stage < 0 || stage > 3) {
    return absl::InvalidArgumentError(absl::StrFormat("stage %d is not 0, 1, 2 or 3", stage));
  }
  if (ranks < 1 || ranks > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrFormat("ranks %d outside [1, 2^20]", ranks));
  }
  if (cpus_per_rank < 0 || cpus_per_rank > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cpus per rank %d outside [0, 2^20]; give 0 when the ranks are not bound to CPUs, or "
        "the CPUs each rank may run on (mpirun binds a rank to 1 core at np <= 2)",
        cpus_per_rank));
  }
  ZS_RETURN_IF_ERROR(ValidateMachineProfile(p));

  // The params this rank's optimizer updates, as the engine lays them out
  // (alignment and rank padding): the Adam moments PlanEngineBuffers sizes,
  // every element at stage 0, the rank's shard at stages 1-3.
  ZS_ASSIGN_OR_RETURN(const MlpLayout layout, LayOut(w, ranks));
  EngineStepPrediction out;
  const TrainerWork trainer = TrainerMicroBatch(w);
  out.flops = trainer.gemm_flops;
  out.gemm = trainer.gemm_flops / p.sgemm_flops_per_s;
  out.compute = Seconds(trainer, p);
  out.elementwise = out.compute - out.gemm;
  out.loader = Seconds(LoaderMicroBatch(w), p);
  // Stage 0 updates every param on every rank; stages 1-3 their shard.
  const double updated = static_cast<double>(stage == 0 ? layout.total_numel : layout.shard_numel);
  out.optimizer = updated * p.optimizer_s_per_param;

  if (ranks > 1) {
    const auto by_backend = p.collectives.find(std::string(backend));
    const bool found = by_backend != p.collectives.end() && by_backend->second.count(ranks) > 0;
    if (!found) {
      const std::string launcher =
          backend == "mpi" ? absl::StrFormat("mpirun -np %d ", ranks) : std::string();
      return absl::NotFoundError(absl::StrFormat(
          "the machine profile has no %s collectives for %d ranks; add them with `%szeroshard "
          "calibrate --backend %s%s --what collectives --out PROFILE` (it keeps the rest)",
          backend, ranks, launcher, backend,
          backend == "mpi" ? "" : absl::StrFormat(" --ranks %d", ranks)));
    }
    const CollectiveProfile& c = by_backend->second.at(ranks);
    const CollectiveFit& reduce = stage < 2 ? c.all_reduce : c.reduce_scatter;
    const int gathers_per_unit = stage == 0 ? 0 : stage == 3 ? 2 : 1;
    double reductions = 0, gathers = 0;
    double first_reduce = 0, first_gather = 0;
    for (int u = 0; u < w.blocks; ++u) {
      const double bytes = static_cast<double>(layout.unit_padded_numel) * 4.0;
      const double r = reduce.Seconds(bytes);
      const double g = c.all_gather.Seconds(bytes);
      reductions += r;
      gathers += gathers_per_unit * g;
      out.comm_bytes += bytes * (1 + gathers_per_unit);
      if (u == 0) first_reduce = r;  // unit 0's reduction is the backward's last
      if (u == 0 && gathers_per_unit > 0) first_gather = g;
    }
    const double small =
        c.all_gather.Seconds(kNormRecordBytesPerRank * ranks) + c.all_reduce.Seconds(kLossBytes);
    out.collectives = w.blocks * (1 + gathers_per_unit) + 2;
    out.comm_bytes += kNormRecordBytesPerRank * ranks + kLossBytes;
    out.comm_total = reductions + gathers + small;
    // Reductions run behind the backward of the units after them and the
    // gathers behind the compute of the units before them (async
    // collectives, prefetch 1); the backward's last reduction, the first
    // gather and the two small collectives wait in full.
    const double overlappable = (reductions - first_reduce) + (gathers - first_gather);
    out.exposed_comm =
        first_reduce + first_gather + small + std::max(0.0, overlappable - out.compute);
  }
  out.critical_path = out.compute + out.optimizer + out.exposed_comm;
  // One rank's threads (trainer, loader, collectives) need this much CPU
  // per step; a collective on more ranks than cores was measured sharing
  // the cores already, so only its cores / ranks share counts.
  const double cores = static_cast<double>(p.cores);
  const double n = static_cast<double>(ranks);
  out.cpu_work =
      out.compute + out.loader + out.optimizer + out.comm_total * std::min(1.0, cores / n);
  // Ranks bound to CPUs can only use the cores they are bound to: one rank
  // bound to one core runs its loader and progress threads on the
  // trainer's core however many cores stand idle.
  out.usable_cores =
      cpus_per_rank == 0
          ? p.cores
          : static_cast<int>(std::min<int64_t>(p.cores, int64_t{ranks} * int64_t{cpus_per_rank}));
  out.total = std::max(out.critical_path, n * out.cpu_work / out.usable_cores);
  out.contention = out.total - out.critical_path;
  ZS_RETURN_IF_ERROR(CheckFigures(out));
  return out;
}

namespace {

absl::StatusOr<const CollectiveProfile*> Collectives(const MachineProfile& p,
                                                     absl::string_view backend, int ranks) {
  const auto by_backend = p.collectives.find(std::string(backend));
  if (by_backend == p.collectives.end() || by_backend->second.count(ranks) == 0) {
    const bool mpi = backend == "mpi";
    return absl::NotFoundError(absl::StrFormat(
        "the machine profile has no %s collectives for %d ranks; add them with `%szeroshard "
        "calibrate --backend %s%s --what collectives --out PROFILE` (it keeps the rest)",
        backend, ranks, mpi ? absl::StrFormat("mpirun -np %d ", ranks) : std::string(), backend,
        mpi ? std::string() : absl::StrFormat(" --ranks %d", ranks)));
  }
  return &by_backend->second.at(ranks);
}

}  // namespace

absl::StatusOr<GridStepPrediction> PredictMlpGridStep(const MlpWorkload& w, const MlpGridRun& run,
                                                      absl::string_view backend,
                                                      const MachineProfile& p) {
  if (w.hidden < 1 || w.hidden > (1 << 16) || w.blocks < 1 || w.blocks > kMaxUnits ||
      w.micro_batch < 1 || w.micro_batch > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mlp workload: hidden %d (1-65536), blocks %d (1-%d), micro-batch %d (1-2^20) out of range",
        w.hidden, w.blocks, kMaxUnits, w.micro_batch));
  }
  if (run.tp < 1 || run.pp < 1 || run.dp < 1 || run.pp > w.blocks || run.stage < 0 ||
      run.stage > 3 || run.accum < 1 || run.accum > (1 << 20) ||
      int64_t{run.tp} * run.pp * run.dp > (1 << 20) || static_cast<int>(run.optimizer_tier) < 0 ||
      static_cast<int>(run.optimizer_tier) >= kNumMemoryTiers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mlp grid run: tp %d, pp %d (<= blocks %d), dp %d, stage %d, accum %d, optimizer tier %d "
        "out of range",
        run.tp, run.pp, w.blocks, run.dp, run.stage, run.accum,
        static_cast<int>(run.optimizer_tier)));
  }
  ZS_RETURN_IF_ERROR(ValidateMachineProfile(p));
  const bool nvme = run.optimizer_tier == MemoryTier::kNvme;
  if (nvme && (p.offload.nvme_read_bytes_per_s <= 0 || p.offload.nvme_write_bytes_per_s <= 0)) {
    return absl::NotFoundError(
        "the machine profile has no NVMe rates; add them with `zeroshard calibrate --what "
        "offload --offload-dir DIR --out PROFILE` (it keeps the rest)");
  }
  GridStepPrediction out;
  const int64_t m64 = int64_t{run.accum} * run.tp * run.pp;
  if (m64 > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mlp grid run: %d micro-batches per step (accum x tp x pp) is more than 2^20", m64));
  }
  out.micro_batches = static_cast<int>(m64);
  const double m = static_cast<double>(m64);

  // The rank's slice: the largest pipeline stage's blocks, each block's
  // 4h inner width split over tp (the products and GELUs shrink by tp; the
  // b x h residual passes do not).
  MlpWorkload slice = w;
  slice.blocks = (w.blocks + run.pp - 1) / run.pp;
  TrainerWork work = TrainerMicroBatch(slice);
  const double tp = static_cast<double>(run.tp);
  work.gemm_flops /= tp;
  work.gelu_elements /= tp;
  work.gelu_grad_elements /= tp;
  const double h = static_cast<double>(w.hidden);
  const double b = static_cast<double>(w.micro_batch);
  const double unit_numel = 8.0 * h * h + 5.0 * h;
  work.copy_bytes = slice.blocks * (3.0 * unit_numel * 4.0 / tp + b * 12.0 * h * 4.0);
  const double micro = Seconds(work, p);
  out.compute = m * micro;
  out.bubble = static_cast<double>(run.pp - 1) * micro;
  const double activation_bytes = b * h * 4.0;
  if (run.tp > 1) {
    ZS_ASSIGN_OR_RETURN(const CollectiveProfile* c, Collectives(p, backend, run.tp));
    out.tp_comm = 2.0 * slice.blocks * m * c->all_reduce.Seconds(activation_bytes);
  }
  if (run.pp > 1) out.pp_comm = 2.0 * m * activation_bytes / p.copy_bytes_per_s;

  // The shard the engine of the largest stage updates, by its own plan.
  const ModelSpec spec = MlpSpec(w);
  TrainSpec train;
  train.zero_stage = run.stage;
  train.grad_accum_steps = out.micro_batches;
  train.offload.optimizer = run.optimizer_tier;
  int64_t updated = 0, unit_numel_shard = 0;
  int units_on_stage = 0;
  for (int pp_rank = 0; pp_rank < run.pp; ++pp_rank) {
    ZS_ASSIGN_OR_RETURN(const ModelSpec shard, ShardModelSpec(spec, run.tp, 0, run.pp, pp_rank));
    ZS_ASSIGN_OR_RETURN(const BufferPlan plan, PlanEngineBuffers(shard, train, run.dp));
    const PlannedBuffer* moments = plan.Find(kAdamMBuffer);
    if (moments == nullptr) {
      return absl::InternalError("the engine's plan has no Adam moment buffer; please report this");
    }
    if (moments->numel > updated) {
      updated = moments->numel;
      units_on_stage = static_cast<int>(shard.units.size());
      // The padded whole of one unit of the slice: the stage-1 shard times
      // dp over its units (every unit of the MLP alike).
      TrainSpec stage1 = train;
      stage1.zero_stage = 1;
      stage1.offload.optimizer = MemoryTier::kDevice;
      ZS_ASSIGN_OR_RETURN(const BufferPlan sharded, PlanEngineBuffers(shard, stage1, run.dp));
      unit_numel_shard = sharded.Find(kAdamMBuffer)->numel * run.dp / units_on_stage;
    }
  }
  const double shard = static_cast<double>(updated);
  out.optimizer = shard * p.optimizer_s_per_param;
  if (run.optimizer_tier != MemoryTier::kDevice) {
    const double copy_rate =
        p.offload.host_copy_bytes_per_s > 0 ? p.offload.host_copy_bytes_per_s : p.copy_bytes_per_s;
    out.offload_copy = 2.0 * shard * 4.0 / copy_rate;  // fp32 grads out, params back
  }
  if (nvme) {
    const double state_bytes = 2.0 * shard * 4.0;  // fp32: m and v (no separate master)
    out.offload_io = state_bytes / p.offload.nvme_read_bytes_per_s +
                     state_bytes / p.offload.nvme_write_bytes_per_s;
  }
  out.optimizer_phase = std::max(out.optimizer, out.offload_io) + out.offload_copy;

  double dp_total = 0;
  if (run.dp > 1) {
    ZS_ASSIGN_OR_RETURN(const CollectiveProfile* c, Collectives(p, backend, run.dp));
    const double bytes = static_cast<double>(unit_numel_shard) * 4.0;
    const CollectiveFit& reduce = run.stage < 2 ? c->all_reduce : c->reduce_scatter;
    const double reductions_per_unit = run.stage >= 2 ? m : 1.0;
    const double gathers_per_unit = run.stage == 0 ? 0.0 : run.stage == 3 ? 2.0 * m : 1.0;
    const double r = reduce.Seconds(bytes);
    const double g = c->all_gather.Seconds(bytes);
    dp_total = units_on_stage * (reductions_per_unit * r + gathers_per_unit * g);
    const double first = r + (gathers_per_unit > 0 ? g : 0.0);
    out.dp_exposed = first + std::max(0.0, dp_total - first - out.compute);
  }
  out.critical_path =
      out.compute + out.bubble + out.tp_comm + out.pp_comm + out.dp_exposed + out.optimizer_phase;
  const double cores = static_cast<double>(p.cores);
  const double world = static_cast<double>(int64_t{run.tp} * run.pp * run.dp);
  out.cpu_work = out.compute + out.optimizer + out.offload_copy +
                 (out.tp_comm + out.pp_comm + dp_total) * std::min(1.0, cores / world);
  out.total = std::max(out.critical_path, world * out.cpu_work / cores);
  for (double v : {out.compute, out.bubble, out.tp_comm, out.pp_comm, out.dp_exposed,
                   out.optimizer_phase, out.total}) {
    if (!(v >= 0 && v <= kMaxPredictedStepSeconds)) {
      return absl::OutOfRangeError(absl::StrFormat(
          "the predicted grid step (%s s) passes the model's bound of %s s; lower --hidden, "
          "--blocks or --micro-batch, or check the profile",
          FormatNumber(v), FormatNumber(kMaxPredictedStepSeconds)));
    }
  }
  return out;
}

}  // namespace zeroshard
