// The checkpoint directory's life cycle: making a written step complete
// (verify, manifest, put in place, `latest`), pruning old steps and the
// leftovers of interrupted saves, and finding the step a path names.
//
// Every state a crash can leave (checkpoint_kill_test kills the process at
// each file operation of these paths) is one that ResolveCheckpoint reads as
// the previous `latest` or the new one, never as nothing, and that the next
// commit tidies.
#ifndef ZEROSHARD_CHECKPOINT_DIRECTORY_H_
#define ZEROSHARD_CHECKPOINT_DIRECTORY_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/src/checkpoint/format.h"

namespace zeroshard::internal {

// Rank 0's commit, once every rank reported its file written:
// 1. checks that `partial_dir` holds every rank file `manifest.files` lists,
//    as its rank wrote it (RankFileReader::Open: size, header, trailer, chunk
//    index CRC). FailedPrecondition naming the ranks whose files are not
//    there (ranks that saved into different directories) changes nothing;
// 2. writes manifest.json there (atomically);
// 3. puts the step in place as `final_dir`: a rename, or when `final_dir`
//    exists (a re-save of the same step) an atomic exchange with it, or on a
//    file system that cannot exchange, two renames with the old step kept as
//    `final_dir`.replaced in between (ResolveCheckpoint reads it there);
// 4. points `root`/latest at it;
// 5. prunes (PruneCheckpointDirectory).
absl::Status CommitCheckpointDirectory(const std::string& root, const std::string& partial_dir,
                                       const std::string& final_dir, const Manifest& manifest,
                                       int keep_last);

// After `committed_step` was committed and `latest` names it: removes the
// leftovers of interrupted saves and prunes (every `.partial`, `.replaced`
// and `.deleting` step, every step directory without a manifest, the
// directory check's probe files), then the complete steps older than
// `committed_step` beyond the newest `keep_last` (counting the committed
// one): each is first renamed to step_N.deleting, so that a crash in the
// middle leaves nothing that looks like a checkpoint, and the next commit
// finishes the removal. Steps newer than `committed_step` (left by a run that
// was rolled back by editing `latest`) are not touched.
absl::Status PruneCheckpointDirectory(const std::string& root, int64_t committed_step,
                                      int keep_last);

// ResolveCheckpoint (zeroshard/checkpoint.h) with the note it explains an
// unusual resolution by ("" when `latest` was followed plainly).
absl::StatusOr<std::string> ResolveCheckpointWithNote(const std::string& path, std::string* note);

// The complete steps in `root` (a step directory holding a manifest), by
// step; empty when `root` cannot be listed.
std::vector<std::pair<int64_t, std::string>> CompleteSteps(const std::string& root);

// The names a step is renamed to on its way: a save in progress, the old copy
// of a re-saved step, a step being removed.
extern const char kPartialSuffix[];
extern const char kReplacedSuffix[];
extern const char kDeletingSuffix[];

// The probe file the ranks' directory check writes and reads
// (CheckpointWriter::CheckSharedDirectory); pruning removes leftovers of it.
inline constexpr char kDirectoryProbeName[] = ".zeroshard_dir_check";

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_CHECKPOINT_DIRECTORY_H_
