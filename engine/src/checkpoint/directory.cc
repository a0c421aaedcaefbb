#include "engine/src/checkpoint/directory.h"

#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/checkpoint/file_ops.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/input_file.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

const char kPartialSuffix[] = ".partial";
const char kReplacedSuffix[] = ".replaced";
const char kDeletingSuffix[] = ".deleting";

namespace {

// The step of "step_00000100" + `suffix`, or -1.
int64_t StepWithSuffix(const std::string& name, absl::string_view suffix) {
  if (!absl::EndsWith(name, suffix)) return -1;
  return ParseStepDirName(name.substr(0, name.size() - suffix.size()));
}

bool IsRealDirectory(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

// Complete steps in `root` (a step directory with a manifest), by step.
std::vector<std::pair<int64_t, std::string>> CompleteSteps(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(root);
  if (!names.ok()) return steps;
  for (const std::string& name : *names) {
    const int64_t step = ParseStepDirName(name);
    if (step >= 0 && PathExists(JoinPath(JoinPath(root, name), kManifestName))) {
      steps.push_back({step, name});
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

namespace {

// Whether every rank file the manifest lists is in `dir` as its rank wrote
// it. The message names the ranks whose files are not.
absl::Status CheckEveryRankFile(const std::string& dir, const Manifest& manifest) {
  std::vector<int> missing;
  std::vector<std::string> causes;
  for (int r = 0; r < manifest.world_size; ++r) {
    absl::StatusOr<RankFileReader> reader = RankFileReader::Open(dir, manifest, r);
    if (reader.ok()) continue;
    missing.push_back(r);
    if (causes.size() < 2) causes.push_back(std::string(reader.status().message()));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "the file%s of rank%s %s %s not in %s as %s rank wrote %s (%s%s): every rank must save "
      "into the same directory, which for ranks on several machines means one on a shared file "
      "system; nothing was committed and `latest` is unchanged",
      missing.size() > 1 ? "s" : "", missing.size() > 1 ? "s" : "", absl::StrJoin(missing, ", "),
      missing.size() > 1 ? "are" : "is", dir, missing.size() > 1 ? "each" : "its",
      missing.size() > 1 ? "them" : "it", absl::StrJoin(causes, "; "),
      missing.size() > causes.size() ? "; ..." : ""));
}

}  // namespace

absl::Status CommitCheckpointDirectory(const std::string& root, const std::string& partial_dir,
                                       const std::string& final_dir, const Manifest& manifest,
                                       int keep_last) {
  ZS_RETURN_IF_ERROR(CheckEveryRankFile(partial_dir, manifest));
  ZS_RETURN_IF_ERROR(RemoveTree(JoinPath(partial_dir, kDirectoryProbeName)));
  ZS_RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(partial_dir, kManifestName), ManifestToJson(manifest)));
  ZS_RETURN_IF_ERROR(FsyncDirectory(partial_dir));

  // The step in place. `final_dir` is at every moment a complete step (the
  // old one or the new one), except on the fallback path between its two
  // renames, where the old one is `.replaced` and ResolveCheckpoint reads it.
  std::string old_copy;  // where the replaced step ended up, to be removed
  struct stat st {};
  if (lstat(final_dir.c_str(), &st) == 0) {
    absl::Status exchanged = ExchangePaths(partial_dir, final_dir);
    if (exchanged.ok()) {
      old_copy = partial_dir;
    } else if (absl::IsUnimplemented(exchanged)) {
      old_copy = final_dir + kReplacedSuffix;
      ZS_RETURN_IF_ERROR(RemoveTree(old_copy));
      ZS_RETURN_IF_ERROR(RenamePath(final_dir, old_copy));
      ZS_RETURN_IF_ERROR(RenamePath(partial_dir, final_dir));
    } else {
      return exchanged;
    }
  } else {
    ZS_RETURN_IF_ERROR(RenamePath(partial_dir, final_dir));
  }
  ZS_RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(root, kLatestName), StepDirName(manifest.step) + "\n"));
  if (!old_copy.empty()) ZS_RETURN_IF_ERROR(RemoveTree(old_copy));
  return PruneCheckpointDirectory(root, manifest.step, keep_last);
}

absl::Status PruneCheckpointDirectory(const std::string& root, int64_t committed_step,
                                      int keep_last) {
  const std::string committed = StepDirName(committed_step);
  ZS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(root));
  // Leftovers first: none of them is a checkpoint a reader would take.
  for (const std::string& name : names) {
    const std::string path = JoinPath(root, name);
    const bool leftover =
        StepWithSuffix(name, kPartialSuffix) >= 0 || StepWithSuffix(name, kReplacedSuffix) >= 0 ||
        StepWithSuffix(name, kDeletingSuffix) >= 0 || absl::StartsWith(name, kDirectoryProbeName) ||
        name == std::string(kLatestName) + ".tmp" ||
        (name != committed && ParseStepDirName(name) >= 0 && IsRealDirectory(path) &&
         !PathExists(JoinPath(path, kManifestName)));
    if (leftover) ZS_RETURN_IF_ERROR(RemoveTree(path));
  }
  // Complete steps older than the committed one, beyond keep_last - 1 of them.
  std::vector<std::pair<int64_t, std::string>> older;
  for (const auto& step : CompleteSteps(root)) {
    if (step.first < committed_step) older.push_back(step);
  }
  const int excess = static_cast<int>(older.size()) - (keep_last - 1);
  for (int i = 0; i < excess; ++i) {
    const std::string doomed = JoinPath(root, older[i].second) + kDeletingSuffix;
    ZS_RETURN_IF_ERROR(RemoveTree(doomed));
    ZS_RETURN_IF_ERROR(RenamePath(JoinPath(root, older[i].second), doomed));
    ZS_RETURN_IF_ERROR(RemoveTree(doomed));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveCheckpointWithNote(const std::string& path, std::string* note) {
  note->clear();
  if (!IsDirectory(path)) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: no such checkpoint directory; pass the directory given to Save or one of its "
        "step_N directories",
        path));
  }
  if (PathExists(JoinPath(path, kManifestName))) return path;
  const std::string latest = JoinPath(path, kLatestName);
  struct stat st {};
  if (lstat(latest.c_str(), &st) != 0) {
    bool has_rank_files = false;
    if (absl::StatusOr<std::vector<std::string>> names = ListDirectory(path); names.ok()) {
      for (const std::string& n : *names) has_rank_files |= absl::StartsWith(n, "rank_");
    }
    if (absl::EndsWith(path, kPartialSuffix) || has_rank_files) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: not a complete checkpoint: it has rank files but no %s (a save that did not "
          "finish); load a complete step",
          path, kManifestName));
    }
    std::vector<std::string> complete;
    for (const auto& [step, name] : CompleteSteps(path)) complete.push_back(name);
    if (complete.empty()) {
      return absl::NotFoundError(
          absl::StrFormat("%s is not a zeroshard checkpoint: it has neither %s nor a '%s' file",
                          path, kManifestName, kLatestName));
    }
    return absl::FailedPreconditionError(
        absl::StrFormat("%s has no '%s' file (complete steps found: %s); pass one of them", path,
                        kLatestName, absl::StrJoin(complete, ", ")));
  }
  auto outside = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s resolves to %s, outside the checkpoint directory %s: the names a checkpoint "
        "resolves must stay inside it; pass the target itself if it is the checkpoint you mean",
        what, ResolvedPath(what), path));
  };
  absl::StatusOr<bool> inside = ResolvesInside(latest, path);
  if (inside.ok() && !*inside) return outside(latest);
  absl::StatusOr<std::string> text =
      ReadInputFile(latest, "a checkpoint's `latest` file", kMaxLatestBytes);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return text.status();
    if (absl::IsOutOfRange(text.status()) || absl::IsFailedPrecondition(text.status())) {
      return absl::DataLossError(absl::StrCat(
          text.status().message(),
          "; `latest` holds only the name of the newest complete step: pass a step directory, or "
          "write the name of a complete one into it"));
    }
    return text.status();
  }
  ZS_ASSIGN_OR_RETURN(const std::string name, ParseLatest(*text, latest));
  const std::string step_dir = JoinPath(path, name);
  if (lstat(step_dir.c_str(), &st) == 0) {
    ZS_ASSIGN_OR_RETURN(const bool step_inside, ResolvesInside(step_dir, path));
    if (!step_inside) return outside(step_dir);
    if (!PathExists(JoinPath(step_dir, kManifestName))) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s names %s, which is incomplete (no %s); pass another step directory",
                          latest, step_dir, kManifestName));
    }
    return step_dir;
  }
  // A re-save of this very step on a file system that cannot exchange two
  // directories was interrupted between its two renames: the step `latest`
  // names is intact under the name it was moved to.
  const std::string replaced = step_dir + kReplacedSuffix;
  if (IsRealDirectory(replaced) && PathExists(JoinPath(replaced, kManifestName))) {
    *note = absl::StrFormat(
        "%s names %s, which a re-save of the same step left as %s when it was interrupted; "
        "that step is read (the next Save tidies the directory)",
        latest, name, replaced);
    return replaced;
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s names %s, which is missing; pass another step directory", latest, step_dir));
}

}  // namespace zeroshard::internal

namespace zeroshard {

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  std::string note;
  return internal::ResolveCheckpointWithNote(path, &note);
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& [step, name] : internal::CompleteSteps(dir)) names.push_back(name);
  return names;
}

absl::Status RemoveCheckpoints(const std::string& dir) {
  using internal::JoinPath;
  // `latest` first: from then on no reader takes what is left for a
  // checkpoint, and a crash in the middle leaves steps that the next
  // RemoveCheckpoints (or a run's pruning) finishes.
  const std::string latest = JoinPath(dir, internal::kLatestName);
  if (internal::PathExists(latest)) ZS_RETURN_IF_ERROR(internal::RemoveTree(latest));
  for (const std::string& name : ListCheckpoints(dir)) {
    const std::string doomed = JoinPath(dir, name) + internal::kDeletingSuffix;
    ZS_RETURN_IF_ERROR(internal::RemoveTree(doomed));
    ZS_RETURN_IF_ERROR(internal::RenamePath(JoinPath(dir, name), doomed));
    ZS_RETURN_IF_ERROR(internal::RemoveTree(doomed));
  }
  return internal::PruneCheckpointDirectory(dir, -1, 1);
}

}  // namespace zeroshard
