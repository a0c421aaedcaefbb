// The checkpoint directory's life cycle: making a written step complete
// (manifest, rename into place, `latest`), pruning old steps, and finding
// the step a path names.
#ifndef ZEROSHARD_CHECKPOINT_DIRECTORY_H_
#define ZEROSHARD_CHECKPOINT_DIRECTORY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace zeroshard::internal {

// Rank 0's commit, once every rank's file is in `partial_dir`: writes
// manifest.json there (atomically), renames `partial_dir` to `final_dir`
// (an existing `final_dir`, from an earlier run that reached the same step,
// is replaced), points `root`/latest at it, then deletes complete steps
// beyond the newest `keep_last` and abandoned `.partial` steps older than
// `step`. The step named by `latest` is never deleted.
absl::Status CommitCheckpointDirectory(const std::string& root, const std::string& partial_dir,
                                       const std::string& final_dir,
                                       const std::string& manifest_json, int64_t step,
                                       int keep_last);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_CHECKPOINT_DIRECTORY_H_
