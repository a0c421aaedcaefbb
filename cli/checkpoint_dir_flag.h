// --overwrite-checkpoints: what a new run does with a --checkpoint-dir that
// already holds checkpoints. A run that does not --resume but saves into
// such a directory would re-save the other run's step numbers, move its
// `latest` and leave its newer steps beside the new ones: one directory, two
// runs, and a resume that takes whichever `latest` names. So it is refused
// (FailedPrecondition, naming the steps and the three ways on), unless the
// flag says to remove them first, as Orbax's CheckpointManager refuses an
// existing step and torch.distributed.checkpoint asks for overwrite.
#ifndef ZEROSHARD_CLI_CHECKPOINT_DIR_FLAG_H_
#define ZEROSHARD_CLI_CHECKPOINT_DIR_FLAG_H_

#include <string>

#include "absl/status/status.h"

namespace zeroshard::cli {

// OK when `dir` holds no complete checkpoint (or does not exist yet), or
// when `overwrite` is set; else FailedPrecondition naming `dir`, its steps
// and the flags that go on (--resume, another --checkpoint-dir,
// --overwrite-checkpoints). Reads only: every rank may call it.
absl::Status CheckNewRunCheckpointDir(const std::string& dir, bool overwrite);

// With `overwrite`, removes the checkpoints in `dir` (RemoveCheckpoints) and
// says so on stderr as `program`: call it on one rank only (the lead), before
// the collective PrepareCheckpointDirectory. A no-op without checkpoints.
absl::Status ClearCheckpointDirForNewRun(const std::string& dir, bool overwrite,
                                         const char* program);

}  // namespace zeroshard::cli

#endif  // ZEROSHARD_CLI_CHECKPOINT_DIR_FLAG_H_
