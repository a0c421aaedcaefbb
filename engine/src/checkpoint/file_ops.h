// POSIX file-system steps of a checkpoint, each returning a Status that
// names the path and the system error: whole-file reads, atomic writes
// (temporary name, fsync, rename, fsync of the directory), directory
// creation, listing, renaming and removal.
#ifndef ZEROSHARD_CHECKPOINT_FILE_OPS_H_
#define ZEROSHARD_CHECKPOINT_FILE_OPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zeroshard::internal {

// "<dir>/<name>".
std::string JoinPath(const std::string& dir, const std::string& name);

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
absl::StatusOr<int64_t> FileSize(const std::string& path);

// The whole file. NotFound / Internal naming the path.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Writes `bytes` to `path` so that a reader sees the old file or the whole
// new one: `path`.tmp, fsync, rename, fsync of the directory.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);

// mkdir -p (existing directories are fine).
absl::Status MakeDirectories(const std::string& path);
absl::Status FsyncDirectory(const std::string& path);
// rename(2), then fsync of the parent directory.
absl::Status RenamePath(const std::string& from, const std::string& to);
// rm -r; a missing path is fine.
absl::Status RemoveTree(const std::string& path);
// Entry names (not . and ..), sorted.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);

// Writes all of `bytes` to `fd` at the current offset (retrying short
// writes and EINTR); `path` names the file in errors.
absl::Status WriteAll(int fd, const void* bytes, size_t n, const std::string& path);
// Reads exactly `n` bytes at `offset` (DataLoss when the file ends first).
absl::Status ReadAt(int fd, int64_t offset, void* out, size_t n, const std::string& path);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_CHECKPOINT_FILE_OPS_H_
