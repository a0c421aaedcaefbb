// ProcessGrid: ranks arranged as data-parallel x tensor-parallel x pipeline
// (docs/parallelism.md).
//
// Order (Megatron-LM's): tensor-parallel rank fastest, then data-parallel,
// then pipeline stage slowest:
//   world rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// so a tensor-parallel group is tp consecutive ranks (the GPUs of one node
// where it fits), and a pipeline stage is a contiguous block of tp * dp
// ranks.
//
// Each rank holds one (tp_rank, pp_rank) shard of the model
// (ShardModelSpec in model_spec.h); the engine runs on that shard with the
// dp group as its communicator, so ZeRO shards optimizer state (stage 1),
// gradients (2) and params (3) over the dp ranks only.
#ifndef ZEROSHARD_PROCESS_GRID_H_
#define ZEROSHARD_PROCESS_GRID_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "zeroshard/communicator.h"

namespace zeroshard {

struct GridShape {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int world() const { return dp * tp * pp; }
  // "dp 2 x tp 2 x pp 1".
  std::string ToString() const;
};

struct GridCoord {
  int dp = 0;
  int tp = 0;
  int pp = 0;
};

// Position of `rank` in `shape` and back (pure; rank < shape.world()).
GridCoord CoordOf(int rank, const GridShape& shape);
int RankOf(const GridCoord& coord, const GridShape& shape);

class ProcessGrid {
 public:
  // Collective over `world`: every rank passes the same shape. All-gathers
  // every rank's shape first, so every rank returns the same error: a rank
  // whose shape differs from rank 0's is FailedPrecondition naming the first
  // such rank and both shapes; a shape whose dp x tp x pp is not
  // world.size() (or has a factor < 1) is InvalidArgument. Then splits
  // `world` (Communicator::Split) into the dp, tp, pp and model-parallel
  // groups, in that order; Split's errors pass through (Unimplemented for a
  // backend without it). Host memory communicators (local, mpi) only for
  // now: the exchange and Split move host records, which the nccl backend
  // (device buffers) cannot, so a communicator whose memory_kind() is not
  // kCpu is Unimplemented. `world` must outlive the grid.
  static absl::StatusOr<std::unique_ptr<ProcessGrid>> Create(Communicator& world,
                                                             const GridShape& shape);
  virtual ~ProcessGrid() = default;

  virtual const GridShape& shape() const = 0;
  virtual const GridCoord& coord() const = 0;

  virtual Communicator& world() = 0;
  // Ranks with this rank's (tp, pp): the engine's communicator.
  virtual Communicator& dp() = 0;
  // Ranks with this rank's (dp, pp), in tp order: Megatron's f/g all-reduces.
  virtual Communicator& tp() = 0;
  // Ranks with this rank's (dp, tp), in stage order: activations and their
  // gradients go between neighbours by Send/Recv.
  virtual Communicator& pp() = 0;
  // The tp * pp ranks with this rank's dp index (rank = tp + tp * pp): the
  // group that must agree on the global gradient norm and on skipping a step
  // (ModelParallelOptions::group).
  virtual Communicator& model_parallel() = 0;
};

}  // namespace zeroshard

#endif  // ZEROSHARD_PROCESS_GRID_H_
