// The calibrated step-time model of the example residual MLP: what
// `zeroshard estimate --machine` and `zeroshard calibrate` predict from a
// MachineProfile (docs/estimator.md, "Calibrated step time"). A command-line
// model of one example trainer, not part of the library: the planner cannot
// read a trainer's arithmetic from a ModelSpec.
#ifndef ZEROSHARD_TOOLS_MLP_STEP_MODEL_H_
#define ZEROSHARD_TOOLS_MLP_STEP_MODEL_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/machine_profile.h"
#include "zeroshard/memory_category.h"

namespace zeroshard {

// The calibrated step-time model (docs/estimator.md, "Calibrated step
// time"): an engine run of the example residual MLP (examples/mlp: `blocks`
// units of W1 [4h, h], b1 [4h], W2 [h, 4h], b2 [h]; MlpTrainer, one
// micro-batch per step, fp32, AdamW with clipping, prefetch 1, the data
// loader on its own thread) on `ranks` ranks of one machine, predicted from
// a MachineProfile. The planner cannot read a trainer's arithmetic from a
// ModelSpec, so the workload names the model whose FLOPs are exact.
struct MlpWorkload {
  int64_t hidden = 256;
  int blocks = 5;
  int64_t micro_batch = 16;  // samples per rank per step
};

// The longest step PredictMlpEngineStep predicts: about 11.6 days. A
// figure beyond it comes from a workload far too large for the machine, or
// from a profile whose rates are wrong; it is refused, never printed.
inline constexpr double kMaxPredictedStepSeconds = 1e6;

// Seconds per optimizer step, by cause; see PredictMlpEngineStep.
struct EngineStepPrediction {
  double gemm = 0;           // the trainer's matrix products: FLOPs / sgemm rate
  double elementwise = 0;    // GELU, its derivative, and the view copies
  double compute = 0;        // gemm + elementwise (StepTimes::compute)
  double optimizer = 0;      // params of the shard x optimizer rate
  double comm_total = 0;     // every collective, alpha + bytes / beta
  double exposed_comm = 0;   // the part not hidden behind compute
  double loader = 0;         // the data loader's work (teacher forward), on its own thread
  double critical_path = 0;  // compute + optimizer + exposed_comm
  double cpu_work = 0;       // CPU seconds one rank's threads need per step
  double contention = 0;     // total - critical_path: waiting for a core
  double total = 0;          // max(critical_path, ranks x cpu_work / usable_cores)
  int usable_cores = 0;      // the cores the ranks' threads share (see below)
  double flops = 0;          // the trainer's matrix-product FLOPs per step
  int collectives = 0;       // collectives per step (the two small ones included)
  double comm_bytes = 0;     // nccl-tests bytes of those collectives per step
};

// Predicts one step of `workload` at ZeRO `stage` (0-3) on `ranks` ranks of
// `backend` ("local" or "mpi") from `profile`:
//   compute    = FLOPs / sgemm rate + GELU elements x t_gelu + GELU' x t_gelu'
//                + view copies / copy rate
//   optimizer  = shard params (all params at stage 0) x t_param
//   comm       = sum over the stage's collectives of alpha + bytes / beta
//                (stage 0: all-reduce per unit; 1: + all-gather per unit;
//                2: reduce-scatter + all-gather per unit; 3: reduce-scatter
//                per unit + an all-gather per unit in the forward and again
//                in the backward), plus a small all-gather (norm) and a
//                small all-reduce (loss) per step
//   exposed    = the last reduction + the first gather + the small ones +
//                max(0, the rest - compute)
//   total      = max(compute + optimizer + exposed,
//                    ranks x (compute + loader + optimizer
//                             + comm x min(1, cores / ranks)) / usable)
// where `usable` (EngineStepPrediction::usable_cores) is the CPUs the
// ranks' threads may run on: profile.cores when `cpus_per_rank` is 0 (not
// bound: every rank's trainer, loader and progress threads share all the
// cores), else min(profile.cores, ranks x cpus_per_rank) (each rank bound
// to that many CPUs, as mpirun binds a rank to one core at np <= 2).
// InvalidArgument for a workload, stage, rank
// count or cpus_per_rank (below 0 or above 2^20) out of range, or a profile
// field outside its range (ValidateMachineProfile); NotFound when the
// profile has no collectives for (backend, ranks), naming the calibrate
// command that adds them; OutOfRange, naming the figure, when a predicted
// time would pass kMaxPredictedStepSeconds. Every figure returned is
// finite and non-negative.
absl::StatusOr<EngineStepPrediction> PredictMlpEngineStep(const MlpWorkload& workload, int stage,
                                                          int ranks, absl::string_view backend,
                                                          const MachineProfile& profile,
                                                          int cpus_per_rank = 0);

// One candidate of the MLP demo's --mem-cap choice (PlanGrid): the grid,
// the ZeRO stage over dp, where the optimizer state lives, and the
// dp-only run's micro-batches per rank (the grid runs accum x tp x pp).
struct MlpGridRun {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int stage = 0;
  MemoryTier optimizer_tier = MemoryTier::kDevice;
  int accum = 1;
};

// Seconds per step of a grid candidate, by cause; see PredictMlpGridStep.
struct GridStepPrediction {
  int micro_batches = 1;       // accum x tp x pp per dp rank
  double compute = 0;          // micro_batches x one micro-batch of the rank's slice
  double bubble = 0;           // (pp - 1) x one micro-batch (1F1B fill and drain)
  double tp_comm = 0;          // 2 all-reduces of b x h per block per micro-batch over tp
  double pp_comm = 0;          // 2 sends of b x h per micro-batch, at the copy rate
  double dp_exposed = 0;       // the dp collectives not hidden behind compute
  double optimizer = 0;        // the rank's shard x t_param (the host AdamW on a CPU build)
  double offload_copy = 0;     // gradient chunks to the host and params back, at host_copy
  double offload_io = 0;       // NVMe: read + write of master (mixed) + m + v of the shard
  double optimizer_phase = 0;  // optimizer + copies, and max(., io) on NVMe (reads/writes overlap)
  double critical_path = 0;
  double cpu_work = 0;
  double total = 0;  // max(critical_path, world x cpu_work / cores)
};

// Predicts one step of `run` for `workload` on tp x pp x dp ranks of
// `backend` from `profile` (docs/parallelism.md, "Choosing by time"): the
// rank's slice of the MLP (blocks / pp blocks, W1 and W2 split over tp)
// runs micro_batches micro-batches at the calibrated rates; pp adds a 1F1B
// bubble of pp - 1 micro-batches and the activation sends; tp adds its
// all-reduces (fully exposed: the next half-block waits for them); dp adds
// the calibrated model's collectives over the shard's units (every
// micro-batch's reduction at stages 2-3); the optimizer phase is the
// PlanEngineBuffers shard x t_param, plus with optimizer_tier host the
// chunk copies (grads and params of the shard at offload.host_copy_gbps,
// or elementwise.copy_gbps when the profile has no offload section) and
// with nvme the swap traffic (the state tensors read at nvme_read_gbps and
// written at nvme_write_gbps), overlapped with the update as the engine
// does. fp32 (the MLP demo's --mem-cap runs). InvalidArgument for a bad
// workload, run or profile; NotFound when the profile lacks collectives
// the run needs or NVMe rates for an nvme run, naming the calibrate
// command that adds them.
absl::StatusOr<GridStepPrediction> PredictMlpGridStep(const MlpWorkload& workload,
                                                      const MlpGridRun& run,
                                                      absl::string_view backend,
                                                      const MachineProfile& profile);

}  // namespace zeroshard

#endif  // ZEROSHARD_TOOLS_MLP_STEP_MODEL_H_
