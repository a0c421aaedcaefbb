#include "cli/checkpoint_dir_flag.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "zeroshard/checkpoint.h"

namespace zeroshard::cli {
namespace {

// "step_00000010" or "step_00000010 .. step_00000030 (3 steps)".
std::string DescribeSteps(const std::vector<std::string>& steps) {
  if (steps.size() == 1) return steps[0];
  return absl::StrFormat("%s .. %s (%d steps)", steps.front(), steps.back(), steps.size());
}

}  // namespace

absl::Status CheckNewRunCheckpointDir(const std::string& dir, bool overwrite) {
  const std::vector<std::string> steps = ListCheckpoints(dir);
  if (steps.empty() || overwrite) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "--checkpoint-dir %s already holds the checkpoints of a run (%s); saving a new run there "
      "would mix its steps with them: continue that run with --resume, give another "
      "--checkpoint-dir, or pass --overwrite-checkpoints to remove them first",
      dir, DescribeSteps(steps)));
}

absl::Status ClearCheckpointDirForNewRun(const std::string& dir, bool overwrite,
                                         const char* program) {
  if (!overwrite) return absl::OkStatus();
  const std::vector<std::string> steps = ListCheckpoints(dir);
  if (steps.empty()) return absl::OkStatus();
  absl::Status removed = RemoveCheckpoints(dir);
  if (!removed.ok()) {
    return absl::Status(
        removed.code(),
        absl::StrFormat("--overwrite-checkpoints: removing the checkpoints in %s: %s", dir,
                        removed.message()));
  }
  std::fprintf(stderr, "%s: --overwrite-checkpoints: removed %s from %s\n", program,
               DescribeSteps(steps).c_str(), dir.c_str());
  return absl::OkStatus();
}

}  // namespace zeroshard::cli
