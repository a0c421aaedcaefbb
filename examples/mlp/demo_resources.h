// mlp_demo's memory check: the run's estimated bytes (the engine's planned
// buffers and the trainers' own) against the machine, before anything is
// allocated.
#ifndef ZEROSHARD_EXAMPLES_MLP_DEMO_RESOURCES_H_
#define ZEROSHARD_EXAMPLES_MLP_DEMO_RESOURCES_H_

#include <string>

#include "absl/status/statusor.h"
#include "examples/common/machine_memory.h"
#include "examples/mlp/demo_options.h"

namespace zeroshard {
namespace mlp {

// The run's peak host bytes, about: the distributed run's ranks in this
// process, then the one-rank baseline (they run one after the other).
struct DemoMemoryEstimate {
  int ranks_here = 1;            // the distributed run's ranks in this process
  double engine_bytes = 0;       // per rank: PlanEngineBuffers, every tier but NVMe
  double trainer_bytes = 0;      // per rank: MlpTrainer::EstimateBytes
  double baseline_bytes = 0;     // the baseline's engine and trainer, and the
                                 // distributed run's final weights it is compared with
  double total_bytes() const;    // max(ranks_here x (engine + trainer), baseline)
  std::string Describe() const;  // "4 ranks x (engine 1.2 GiB + trainer 3 MiB); baseline 2 GiB"
};

// The estimate of a run of `opts` on `world` ranks, `ranks_here` of them in
// this process (local backend: all; mpi: one). The engine's bytes come from
// the planner (PlanEngineBuffers on BuildModelSpec): on a grid (--tp, --pp)
// a position holds about 1 / (tp pp) of the model sharded over dp; with
// --mem-cap the grid is not chosen yet, and the model sharded at stage 3
// over every rank is the least any choice holds. With --device cuda the
// engine's buffers are on the GPU and are not counted. A model past 2^63
// bytes is refused by the planner: InvalidArgument with its message.
absl::StatusOr<DemoMemoryEstimate> EstimateDemoMemory(const DemoOptions& opts, int world,
                                                      int ranks_here);

// OK when EstimateDemoMemory fits `machine`; ResourceExhausted naming the
// estimate, the machine's bytes and the flags to lower otherwise (and the
// planner's error, as InvalidArgument, for a model it cannot size).
absl::Status CheckDemoMemory(const DemoOptions& opts, int world, int ranks_here,
                             const examples::MachineMemory& machine);

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_DEMO_RESOURCES_H_
