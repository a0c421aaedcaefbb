// Sharded checkpoints: what Engine::Save writes and Engine::Load reads, and
// the functions that read a checkpoint without an engine (the `zeroshard
// inspect` and `zeroshard export` commands). docs/checkpoint.md has the
// format, the guarantees and how to recover from a failed run.
//
// A checkpoint directory (the `dir` given to Save) holds one subdirectory
// per saved step, `step_00000100/`, with one shard file per rank of the run
// that wrote it (`rank_00003.bin`) and `manifest.json`, plus a file `latest`
// naming the newest complete step. A step directory is complete or absent:
// files are written under temporary names, synced, renamed, and the step
// appears (and `latest` moves) only after every rank finished.
#ifndef ZEROSHARD_CHECKPOINT_H_
#define ZEROSHARD_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "zeroshard/dtype.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {

struct CheckpointOptions {
  // Complete checkpoints kept in the directory; older ones are deleted after
  // a new one is complete. At least 1: the newest complete checkpoint is
  // never deleted.
  int keep_last = 2;
  // True: Save returns once this rank's state is copied to host memory and
  // the file is written by a background thread while training goes on; the
  // next Save or WaitForCheckpoint completes it. False: Save returns when
  // the checkpoint is complete on disk.
  bool background = true;
  // The host snapshot (12 bytes per element of this rank's shard: master
  // weights and both moments) is kept for the next Save, so later saves copy
  // into memory already mapped. False frees it once the file is written:
  // less host memory between saves, a longer stall in each.
  bool keep_snapshot = true;
};

// What a checkpoint says about itself (manifest.json).
struct CheckpointInfo {
  std::string path;    // the step directory
  int64_t step = 0;    // optimizer steps taken when it was saved
  int world_size = 0;  // ranks of the run that wrote it (one shard file each)
  int zero_stage = 0;
  Precision precision = Precision::kFp32;
  int grad_accum_steps = 1;  // micro-batches per rank per step of that run
  int64_t num_params = 0;
  int num_units = 0;
  std::vector<int64_t> file_bytes;  // per rank file
  std::string trainer_state;        // the JSON object the trainer passed to Save
  // Engine::Load only: the settings in which the loading run differs from
  // the one that saved ("world size 4 -> 2", "schedule.total_steps 60 ->
  // 100", "block.0.b1: lr_scale 1 -> 0.5", "embed.w: weight_decay unset ->
  // 0.1"): allowed, but the trajectory is then not the saved run's.
  std::vector<std::string> changed_settings;
  // How the step was found when not by following `latest` plainly (a
  // re-save of the step `latest` names was interrupted on a file system
  // that cannot exchange directories, and the step was read under the name
  // it was moved to), else "". Worth showing to the user.
  std::string note;
};

// The step directory `path` names: `path` itself when it holds a
// manifest.json, else the step named by `path`/latest (which must be a
// regular file of at most 256 bytes holding one step name; it and the step
// must resolve inside `path`). NotFound or FailedPrecondition naming the
// file and what to do (a half-written step, a directory that is not a
// checkpoint, a `latest` naming a missing step or a place outside `path`);
// DataLoss for a `latest` that is not a step name.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path);

// The complete checkpoints in `dir` (its step directories holding a
// manifest), oldest first; empty when `dir` does not exist or holds none.
// A new run (not a resume) saving into a directory that holds some would
// mix its steps with another run's and move `latest` off them: trainers
// refuse such a directory unless told to replace what is there
// (RemoveCheckpoints), as gpt_train and mlp_demo do (--overwrite-checkpoints).
std::vector<std::string> ListCheckpoints(const std::string& dir);

// Removes the checkpoints in `dir`: `latest` first (so that no reader takes
// what is left for a checkpoint), then each complete step (renamed to
// step_N.deleting, then removed) and the leftovers of interrupted saves.
// Other files are kept. Errors name the path and the system's error.
absl::Status RemoveCheckpoints(const std::string& dir);

// Called as long work goes on: `done` of `total` bytes (read, or written).
using CheckpointProgress = std::function<void(int64_t done, int64_t total)>;

// Reads the manifest of the checkpoint `path` (ResolveCheckpoint) and
// verifies every checksum of every file: each file's size and CRC32C, each
// unit's, each chunk's. Returns the checkpoint's description with `problems`
// empty when it is sound; one line per problem otherwise (naming the file,
// the unit or byte range, expected and found). An error Status only when the
// manifest itself cannot be read. `progress`, when given, is called after
// each rank file with the bytes verified so far.
absl::StatusOr<CheckpointInfo> InspectCheckpoint(const std::string& path,
                                                 std::vector<std::string>* problems,
                                                 const CheckpointProgress& progress = {});

// What a checkpoint's manifest says of it (path, step, world size, model
// size, trainer_state), read without verifying the rank files: cheap, for a
// caller that needs the trainer state before reading the weights (an export
// that verifies what it reads anyway). Errors as ResolveCheckpoint's, and
// DataLoss or InvalidArgument naming manifest.json when it is damaged.
absl::StatusOr<CheckpointInfo> ReadCheckpointInfo(const std::string& path);

struct ExportStats {
  int64_t tensors = 0;
  int64_t bytes_written = 0;
  // The most memory held at once for weights (one unit's fp32 values).
  int64_t peak_buffer_bytes = 0;
};

// Writes the consolidated weights of the checkpoint `path` to `out` in the
// safetensors format: one tensor per param, named "<unit>.<param>", in
// `dtype` (kFloat32: the fp32 master weights exactly; kBFloat16: rounded to
// nearest even). Streams unit by unit: memory use is bounded by the largest
// unit. Verifies the checksum of everything it reads. `out` is written under
// a temporary name (`out`.tmp) and renamed when complete; on an error
// neither `out` nor the temporary is left. InvalidArgument, before anything
// is written, when `out` is a directory, lies inside the checkpoint
// directory, or is the same file as anything the checkpoint holds (compared
// by device and inode: a symlink or hard link to a rank file is refused). `progress`, when given,
// is called after each unit with the tensor bytes written so far.
absl::Status ExportSafetensors(const std::string& path, const std::string& out, DType dtype,
                               ExportStats* stats, const CheckpointProgress& progress = {});

// How ExportSafetensors names what it writes.
struct ExportOptions {
  DType dtype = DType::kFloat32;  // kFloat32 or kBFloat16
  // The tensor name of param `param` of unit `unit` (e.g. Hugging Face's
  // names for a model whose ModelSpec follows them); unset: "<unit>.<param>".
  // Called for every param before anything is written, tied aliases
  // included (their names go into the "zeroshard_tied" metadata only: an
  // alias is never written, its owner is). An error it returns (a unit the
  // rule does not know) is returned as is; the names must be distinct,
  // non-empty and not "__metadata__" (InvalidArgument otherwise).
  std::function<absl::StatusOr<std::string>(const std::string& unit, const std::string& param)>
      tensor_name;
};

// The same with the options above; the overload without them is
// ExportOptions{dtype} with the default names.
absl::Status ExportSafetensors(const std::string& path, const std::string& out,
                               const ExportOptions& options, ExportStats* stats,
                               const CheckpointProgress& progress = {});

}  // namespace zeroshard

#endif  // ZEROSHARD_CHECKPOINT_H_
