// What mlp_demo measures in its runs, and the report it prints.
#ifndef ZEROSHARD_EXAMPLES_MLP_DEMO_REPORT_H_
#define ZEROSHARD_EXAMPLES_MLP_DEMO_REPORT_H_

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "examples/common/tier_bytes.h"
#include "examples/mlp/demo_options.h"
#include "zeroshard/device.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/process_grid.h"

namespace zeroshard {
namespace mlp {

// Columns of the per-step time split (ms per step, Engine::Stats().totals /
// steps).
enum TimeColumn : int {
  kComputeMs = 0,
  kExposedCommMs,
  kOptimizerMs,
  kInputWaitMs,
  kEngineOtherMs,
  kPipelineBubbleMs,  // waiting for a neighbouring pipeline stage (--pp)
  kTotalMs,
  kHiddenCommMs,  // not part of the split: collectives' run time not waited for
  // Not means: the median over the steps after kTimingWarmupSteps of the
  // step's total and of total - input wait (how perf/peers times PyTorch).
  kMedianTotalMs,
  kMedianLessInputMs,
  kNumTimeColumns
};

// Steps left out of the medians above (the first step allocates and
// touches the optimizer state; perf/peers' PyTorch runs skip as many).
inline constexpr int kTimingWarmupSteps = 3;

// One rank's ledger: current bytes per MemoryCategory, then the ledger's
// current_model_states().
using LedgerRow = std::array<int64_t, kNumMemoryCategories + 1>;

// One run, as seen by its rank 0 (per-rank rows gathered from every rank).
struct RunResult {
  int64_t first_step = 0;                    // steps of a resumed checkpoint (0: from scratch)
  int resumed_world = 0;                     // ranks of the run that wrote it
  int resumed_accum_total = 0;               // its micro-batches per step (ranks x accum)
  std::string resumed_changes;               // settings this run changed (CheckpointInfo)
  std::vector<double> losses;                // global mean loss of steps first_step+1, ...
  std::vector<std::vector<float>> params;    // final fp32 weights, ModelSpec order (no tied alias)
  std::vector<std::string> param_names;      // "unit param" of each entry of params
  int64_t activation_bytes = 0;              // MlpTrainer::activation_bytes() (CPU trainer)
  std::vector<LedgerRow> ledger;             // per rank, after training
  std::vector<std::vector<double>> step_ms;  // per rank, TimeColumn order
  int64_t clipped_steps = 0;
  int64_t skipped_steps = 0;
  double final_loss_scale = 1.0;  // EngineStats::loss_scale after training (fp16)
  bool prefetch_active = false;   // EngineStats::prefetch_active after training (stage 3)
  double wall_seconds = 0.0;
  // Rank 0's bytes per memory tier (plan, and ledger right after
  // Engine::Create), and the device bytes the plan gives the same run
  // without offload.
  examples::TierBytes tiers;
  int64_t device_plan_without_offload = 0;
};

struct DemoResults {
  int world = 1;
  GridShape grid;               // the distributed run's dp x tp x pp (dp = world without --tp/--pp)
  std::string grid_origin;      // "--tp/--pp" or the planner's choice; empty for a dp-only run
  std::string nodes;            // mpi: Communicator::node_layout().Describe(); empty otherwise
  std::string collective_path;  // mpi: Communicator::collective_path(); empty otherwise
  // mpi: the distributed run's collective bytes, all ranks' sum, sent to a
  // rank on the same node and on another node (Communicator::traffic).
  int64_t intra_node_bytes = 0;
  int64_t inter_node_bytes = 0;
  int64_t planned_bytes = 0;  // --mem-cap: the chosen candidate's per-rank figure (PlanGrid)
  RunResult distributed;      // N ranks, the requested stage
  RunResult baseline;         // 1 rank, stage 0, accum N*A
  RunResult stage0;           // N ranks, stage 0: ledger only, no training
  absl::Time start = absl::Now();
};

// Largest differences between two runs' final weights.
struct WeightComparison {
  double max_abs = 0.0;
  int max_abs_param = 0;  // index [unit * 4 + param] where max_abs occurs
  // Largest over params of max|a - b| / max|b| (the param's own scale).
  double max_rel = 0.0;
  int64_t values = 0;
  bool bitwise_identical = true;
};
WeightComparison CompareWeights(const std::vector<std::vector<float>>& a,
                                const std::vector<std::vector<float>>& b);

// "587.0 KiB": `bytes` in the largest binary unit that leaves at least 1.
std::string FormatSize(int64_t bytes);

// The planner's candidates (per-rank bytes of each tp x pp split at ZeRO
// stages 0-3) and its choice for --mem-cap, printed before training; the
// grid runs `micro_batches` per dp rank.
void PrintGridPlan(const GridPlan& plan, int micro_batches, std::FILE* out);

// Prints the report (the caller is rank 0).
void PrintReport(const DemoOptions& opts, const DemoResults& results, std::FILE* out);

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_DEMO_REPORT_H_
