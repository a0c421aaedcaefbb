#include "engine/src/checkpoint/directory.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

// The step of "step_00000100" (and of "step_00000100.partial" when
// `partial`), or -1.
int64_t StepOf(const std::string& name, bool partial) {
  absl::string_view view = name;
  if (!absl::ConsumePrefix(&view, "step_")) return -1;
  if (partial != absl::ConsumeSuffix(&view, ".partial")) return -1;
  int64_t step = -1;
  if (view.empty() || !absl::SimpleAtoi(view, &step)) return -1;
  return step;
}

// Complete steps in `root` (a step directory with a manifest), by step.
std::vector<std::pair<int64_t, std::string>> CompleteSteps(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(root);
  if (!names.ok()) return steps;
  for (const std::string& name : *names) {
    const int64_t step = StepOf(name, /*partial=*/false);
    if (step >= 0 && PathExists(JoinPath(JoinPath(root, name), kManifestName))) {
      steps.push_back({step, name});
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

absl::Status CommitCheckpointDirectory(const std::string& root, const std::string& partial_dir,
                                       const std::string& final_dir,
                                       const std::string& manifest_json, int64_t step,
                                       int keep_last) {
  ZS_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(partial_dir, kManifestName), manifest_json));
  ZS_RETURN_IF_ERROR(FsyncDirectory(partial_dir));
  std::string replaced;
  if (PathExists(final_dir)) {
    replaced = final_dir + ".replaced";
    ZS_RETURN_IF_ERROR(RemoveTree(replaced));
    ZS_RETURN_IF_ERROR(RenamePath(final_dir, replaced));
  }
  ZS_RETURN_IF_ERROR(RenamePath(partial_dir, final_dir));
  const std::string name = StepDirName(step);
  ZS_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(root, kLatestName), name + "\n"));
  if (!replaced.empty()) ZS_RETURN_IF_ERROR(RemoveTree(replaced));

  // Pruning: the newest keep_last complete steps stay, and `name` always.
  std::vector<std::pair<int64_t, std::string>> steps = CompleteSteps(root);
  const int excess = static_cast<int>(steps.size()) - keep_last;
  for (int i = 0; i < excess; ++i) {
    if (steps[i].second == name) continue;
    ZS_RETURN_IF_ERROR(RemoveTree(JoinPath(root, steps[i].second)));
  }
  // Steps a crashed run left half written, older than this one.
  ZS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(root));
  for (const std::string& entry : names) {
    const int64_t abandoned = StepOf(entry, /*partial=*/true);
    if (abandoned >= 0 && abandoned < step) {
      ZS_RETURN_IF_ERROR(RemoveTree(JoinPath(root, entry)));
    }
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::internal

namespace zeroshard {

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  using internal::JoinPath;
  if (!internal::IsDirectory(path)) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: no such checkpoint directory; pass the directory given to Save or one of its "
        "step_N directories",
        path));
  }
  if (internal::PathExists(JoinPath(path, internal::kManifestName))) return path;
  const std::string latest = JoinPath(path, internal::kLatestName);
  if (!internal::PathExists(latest)) {
    bool has_rank_files = false;
    if (absl::StatusOr<std::vector<std::string>> names = internal::ListDirectory(path);
        names.ok()) {
      for (const std::string& n : *names) has_rank_files |= absl::StartsWith(n, "rank_");
    }
    if (absl::EndsWith(path, ".partial") || has_rank_files) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: not a complete checkpoint: it has rank files but no %s (a save that did not "
          "finish); load a complete step",
          path, internal::kManifestName));
    }
    std::vector<std::string> complete;
    for (const auto& [step, name] : internal::CompleteSteps(path)) complete.push_back(name);
    if (complete.empty()) {
      return absl::NotFoundError(
          absl::StrFormat("%s is not a zeroshard checkpoint: it has neither %s nor a '%s' file",
                          path, internal::kManifestName, internal::kLatestName));
    }
    return absl::FailedPreconditionError(
        absl::StrFormat("%s has no '%s' file (complete steps found: %s); pass one of them", path,
                        internal::kLatestName, absl::StrJoin(complete, ", ")));
  }
  ZS_ASSIGN_OR_RETURN(std::string text, internal::ReadWholeFile(latest));
  const std::string name(absl::StripAsciiWhitespace(text));
  if (internal::StepOf(name, /*partial=*/false) < 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: '%s' is not a step name like step_00000100; the file is damaged: pass a step "
        "directory",
        latest, name));
  }
  const std::string step_dir = JoinPath(path, name);
  if (!internal::PathExists(JoinPath(step_dir, internal::kManifestName))) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s names %s, which is missing or incomplete; pass another step directory",
                        latest, step_dir));
  }
  return step_dir;
}

}  // namespace zeroshard
