// CheckpointWriter: the writing side of checkpoints (docs/checkpoint.md).
//
// It owns the checkpoint in progress: Begin checks, on every rank alike,
// that every rank sees the directory rank 0 prepared (CheckSharedDirectory),
// copies this rank's shard of every unit (fp32 master, Adam m and v, in
// segment coordinates) into a host snapshot and hands it to a writer
// thread, which streams it into `<dir>/step_N.partial/rank_R.bin`. Commit
// (the engine's next Save or WaitForCheckpoint) joins the thread; one
// all-gather tells every rank whether every write succeeded (with the
// files' sizes and checksums), rank 0 writes the manifest, renames the step
// into place, moves `latest` and prunes to keep_last, and a broadcast tells
// every rank how that went.
#ifndef ZEROSHARD_RUNTIME_CHECKPOINT_WRITER_H_
#define ZEROSHARD_RUNTIME_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/runtime/offload_optimizer.h"
#include "engine/src/runtime/runtime_services.h"
#include "engine/src/runtime/shard_buffers.h"
#include "zeroshard/engine.h"

namespace zeroshard::internal {

class CheckpointWriter {
 public:
  // `mixed`: the fp32 master lives in its own buffer (else the params are
  // the master); frozen segments' params, in `param_dtype`, are saved as
  // fp32 values with zero moments. Every reference must outlive the writer.
  CheckpointWriter(const FlatLayout& layout, int rank, bool mixed, DType param_dtype,
                   const ShardBuffers& buffers, RuntimeServices& services);
  // A background write owns its snapshot: lets it finish (the checkpoint
  // stays incomplete without Commit).
  ~CheckpointWriter();

  // The optimizer state lives on `offload`'s tier (null: on the device).
  void set_offload(OffloadOptimizer* offload) { offload_ = offload; }

  // Collective, the directory check of Save and PrepareCheckpointDirectory:
  // rank 0 creates `root` and `check_dir` (first removing `check_dir` when
  // `fresh`: a crashed save's partial step) and writes a probe with a fresh
  // number there; every rank must read that number through its own path
  // and be able to create a file there. Every rank returns the same status:
  // the first failing rank's (`local`: what a rank found wrong before),
  // or FailedPrecondition naming the ranks that see another directory.
  absl::Status CheckSharedDirectory(const std::string& root, const std::string& check_dir,
                                    bool fresh, const absl::Status& local, const char* call);

  // Collective: starts the checkpoint of `manifest` (all but `files`, which
  // rank 0 fills at commit) into `root`/step_N, after the directory check.
  // `local` is what this rank found wrong with the call; `state_bytes` the
  // bytes the trainer state adds to the manifest. The previous checkpoint
  // must be committed first. Every rank returns the same status.
  absl::Status Begin(const std::string& root, const CheckpointOptions& options, Manifest manifest,
                     absl::Status local, int64_t state_bytes);
  // Collective: completes the checkpoint in progress, if any (see above).
  // When `engine_status` is an error (a failed engine) only joins the
  // writer and returns it: nothing is committed.
  absl::Status Commit(const absl::Status& engine_status);

  bool pending() const { return pending_ != nullptr; }

  // This rank's shard of every segment of the layout, master then m then v
  // per segment, in the file's order (what Begin writes by default).
  absl::Status Snapshot(std::vector<float>* out);
  // Begin writes what `source` puts into its argument (the file's order for
  // this writer's layout and rank) instead of Snapshot: SaveSlices' shards
  // of the whole model, gathered from the grid.
  void set_snapshot_source(std::function<absl::Status(std::vector<float>*)> source) {
    snapshot_source_ = std::move(source);
  }

 private:
  // A checkpoint whose file write may still be running on its writer thread.
  struct Pending {
    std::string root;
    std::string partial_dir;
    std::string final_dir;
    CheckpointOptions options;
    Manifest manifest;
    std::thread writer;
    absl::Status write_status;  // set by the writer
    FileRecord record;          // set by the writer
  };

  const FlatLayout& layout_;
  int rank_;
  int world_;
  bool mixed_;
  DType param_dtype_;
  const ShardBuffers& buffers_;
  RuntimeServices& services_;
  std::unique_ptr<Pending> pending_;
  // This rank's shard as the rank file holds it, read by the writer thread
  // until Commit joins it; kept between saves unless
  // CheckpointOptions::keep_snapshot is false.
  std::vector<float> snapshot_;
  // The size of this engine's widest manifest with an empty trainer state
  // ("{}"), measured at the first Begin (-1 before).
  int64_t widest_manifest_bytes_ = -1;
  OffloadOptimizer* offload_ = nullptr;
  std::function<absl::Status(std::vector<float>*)> snapshot_source_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_CHECKPOINT_WRITER_H_
