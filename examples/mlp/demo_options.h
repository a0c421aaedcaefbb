// Command-line options of mlp_demo and the TrainSpec they describe.
#ifndef ZEROSHARD_EXAMPLES_MLP_DEMO_OPTIONS_H_
#define ZEROSHARD_EXAMPLES_MLP_DEMO_OPTIONS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "examples/mlp/mlp.h"
#include "zeroshard/communicator.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {
namespace mlp {

struct DemoOptions {
  int ranks = 4;  // local backend; with mpi the world is mpirun's
  int stage = 2;  // ZeRO stage 0-3
  int64_t steps = 200;
  Precision precision = Precision::kFp32;
  int accum = 1;            // micro-batches per rank per step
  int prefetch = 1;         // stage 3: units gathered ahead of use (TrainSpec::prefetch_units)
  ZeroPlusPlusSpec zeropp;  // --zeropp: the distributed run's ZeRO++ options
  // --zeropp hpz: the secondary group is the ranks of a node
  // (zeropp.secondary_partition_size = the fullest node's ranks, from the
  // communicator when the run starts).
  bool hpz = false;
  // 5 blocks x hidden 256 (2.6M params): baseline + distributed take about
  // 30 s on two idle cores, under a minute on two busy ones.
  MlpConfig model = [] {
    MlpConfig m;
    m.hidden = 256;
    m.blocks = 5;
    m.micro_batch = 16;
    return m;
  }();
  double lr = 3e-3;
  double weight_decay = 0.01;
  // Early gradients of this task have norm ~8, later ones ~1: 2.0 clips the
  // first steps only.
  double clip = 2.0;
  bool backend_mpi = false;
  // --device cuda: the distributed run's math on GPUs: with --backend local
  // its ranks are threads sharing GPU 0 (local backend over its memory);
  // with --backend mpi each process takes GPU (local rank % GPUs) and the
  // collectives go through nccl. The baseline stays on the CPU, so the
  // report compares the two.
  bool device_cuda = false;
  int gpu_ordinal = 0;  // the GPU of this process's ranks (set by main)
  // Communicator timeout per collective, in [kMinCommTimeout,
  // kMaxCommTimeout] (ParseCommTimeout); 0: $ZS_COMM_TIMEOUT, else 120 s.
  absl::Duration comm_timeout = absl::ZeroDuration();
  // Checkpoints of the distributed run (docs/checkpoint.md): into
  // checkpoint_dir every save_every steps (0: never), keeping keep_last;
  // resume: start from checkpoint_dir/latest instead of the initial weights.
  std::string checkpoint_dir;
  int64_t save_every = 0;
  int keep_last = 2;
  bool resume = false;
  // overwrite_checkpoints: a new run may save into a checkpoint_dir holding
  // checkpoints, which are removed first (cli/checkpoint_dir_flag.h).
  bool overwrite_checkpoints = false;
  // Model parallelism (docs/parallelism.md): a dp x tp x pp grid with
  // dp = world / (tp * pp); 1 x 1 runs the plain data-parallel trainer.
  int tp = 1;
  int pp = 1;
  // --sync-data: each micro-batch is made on the trainer's thread when it
  // is needed (DataLoaderOptions::depth 0), all of it input wait, instead of
  // by the data loader's thread ahead of time: an input-bound run.
  bool sync_data = false;
  // Per-rank byte cap: the planner (PlanGrid) chooses tp, pp, dp and the
  // ZeRO stage that fit it; 0: not given.
  int64_t mem_cap = 0;
  // --machine PROFILE (with --mem-cap): a `zeroshard calibrate` profile;
  // the planner then also considers the optimizer on the host or NVMe
  // tier and picks the fastest candidate that fits by the calibrated model
  // (tools/mlp_step_model.h), and sets offload.optimizer below to its
  // choice. Without it: the device tier, preference order.
  std::string machine;
  // --print-spec: print the model's ModelSpec as a `zeroshard estimate
  // --spec` file (JSON) to stdout and exit without training.
  bool print_spec = false;
  // --offload optimizer=device|host|nvme, --offload-dir, --offload-chunk:
  // where the distributed run keeps its optimizer state (docs/offload.md);
  // the baseline stays on the device. An nvme run without --offload-dir
  // gets a fresh directory under /tmp, removed at the end.
  OffloadSpec offload;
  // --result-json FILE: the distributed run's losses, a fingerprint of its
  // final weights and its bytes per memory tier (plan and ledger), for
  // scripts that compare runs bit for bit (tests/examples).
  std::string result_json;
};

// True when the run uses a model-parallel grid (GridMlpTrainer).
inline bool UsesGrid(const DemoOptions& opts) { return opts.tp * opts.pp > 1 || opts.mem_cap > 0; }

// True when the planner chooses the optimizer's tier (--mem-cap --machine):
// the run may swap to NVMe under offload.dir.
inline bool ChoosesOffload(const DemoOptions& opts) {
  return opts.mem_cap > 0 && !opts.machine.empty();
}

// The MLP trainer's data loader (--sync-data).
DataLoaderOptions MakeDataLoaderOptions(const DemoOptions& opts);

// The communicator options of the run (--comm-timeout).
CommOptions MakeCommOptions(const DemoOptions& opts);

// Parses --name value / --name=value flags. Sets *help and returns defaults
// on --help or -h. InvalidArgument naming the flag on an unknown flag, a
// missing or malformed value, or a value out of range.
absl::StatusOr<DemoOptions> ParseDemoFlags(int argc, char** argv, bool* help);

void PrintUsage(std::FILE* out);

// The TrainSpec of one run: AdamW, warmup (5% of the steps) then cosine decay
// to 10% of lr, clipping at opts.clip, opts.precision (fp16: the default
// dynamic loss scaling), prefetch depth opts.prefetch (used by stage 3 only).
TrainSpec MakeTrainSpec(const DemoOptions& opts, int stage, int accum);

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_DEMO_OPTIONS_H_
