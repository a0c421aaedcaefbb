#include "examples/mlp/demo_resources.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "examples/mlp/mlp.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

// The planner's bytes of one rank held in memory: the device tier (the CPU
// device's buffers are host memory) and the host tier; NVMe is on disk.
absl::StatusOr<double> PlannedMemoryBytes(const ModelSpec& model, const TrainSpec& train,
                                          int world) {
  ZS_ASSIGN_OR_RETURN(const BufferPlan plan, PlanEngineBuffers(model, train, world));
  return static_cast<double>(plan.total_bytes(MemoryTier::kDevice)) +
         static_cast<double>(plan.total_bytes(MemoryTier::kHost));
}

// The parameter count of `cfg`, in double: a model too large for int64 is
// refused before any shape product is formed.
double ParamCount(const MlpConfig& cfg) {
  const double h = static_cast<double>(cfg.hidden);
  const double block = 8 * h * h + 5 * h + (cfg.lora() ? 10 * h * cfg.lora_rank : 0);
  return cfg.blocks * block + (cfg.lm() ? static_cast<double>(cfg.vocab) * (h + 1) : 0);
}

}  // namespace

double DemoMemoryEstimate::total_bytes() const {
  return std::max(ranks_here * (engine_bytes + trainer_bytes), baseline_bytes);
}

std::string DemoMemoryEstimate::Describe() const {
  return absl::StrFormat("%d rank(s) x (engine buffers %s + trainer %s); the baseline %s",
                         ranks_here, examples::FormatBytes(engine_bytes),
                         examples::FormatBytes(trainer_bytes),
                         examples::FormatBytes(baseline_bytes));
}

absl::StatusOr<DemoMemoryEstimate> EstimateDemoMemory(const DemoOptions& opts, int world,
                                                      int ranks_here) {
  DemoMemoryEstimate e;
  e.ranks_here = ranks_here;
  const MlpConfig& cfg = opts.model;
  // fp32 master, Adam m and v and the params: 16 bytes a param at least in
  // the baseline, which keeps everything on one rank. Past 2^60 bytes no
  // plan is formed (its shape products would overflow).
  const double params = ParamCount(cfg);
  if (params * 16 > static_cast<double>(int64_t{1} << 60)) {
    e.baseline_bytes = params * 16;
    return e;
  }
  const ModelSpec model = BuildModelSpec(cfg);
  const DataLoaderOptions data = MakeDataLoaderOptions(opts);
  e.trainer_bytes = MlpTrainer::EstimateBytes(cfg, data);
  TrainSpec train = MakeTrainSpec(opts, opts.stage, opts.accum);
  train.offload = opts.offload;
  train.zeropp = opts.zeropp;
  if (opts.hpz) train.zeropp.secondary_partition_size = 1;
  const int positions = opts.tp * opts.pp;
  if (opts.mem_cap > 0) {
    train.zero_stage = 3;
    ZS_ASSIGN_OR_RETURN(e.engine_bytes, PlannedMemoryBytes(model, train, world));
  } else if (positions > 1) {
    ZS_ASSIGN_OR_RETURN(const double dp_plan,
                        PlannedMemoryBytes(model, train, std::max(1, world / positions)));
    e.engine_bytes = dp_plan / positions;
  } else if (!opts.device_cuda) {
    ZS_ASSIGN_OR_RETURN(e.engine_bytes, PlannedMemoryBytes(model, train, world));
  }
  // The baseline: one rank at stage 0 accumulating every rank's
  // micro-batches, on the CPU, next to the distributed run's final weights.
  const TrainSpec baseline = MakeTrainSpec(opts, /*stage=*/0, world * opts.accum);
  ZS_ASSIGN_OR_RETURN(const double baseline_plan, PlannedMemoryBytes(model, baseline, 1));
  e.baseline_bytes = baseline_plan + e.trainer_bytes + params * sizeof(float);
  return e;
}

absl::Status CheckDemoMemory(const DemoOptions& opts, int world, int ranks_here,
                             const examples::MachineMemory& machine) {
  ZS_ASSIGN_OR_RETURN(const DemoMemoryEstimate e, EstimateDemoMemory(opts, world, ranks_here));
  return examples::CheckFitsMachine(
      e.total_bytes(), e.Describe(), machine,
      "--hidden, --blocks, --micro-batch, --vocab, --lora or --ranks (or use --stage 3 / "
      "--offload to shard or move the engine's buffers)");
}

}  // namespace mlp
}  // namespace zeroshard
