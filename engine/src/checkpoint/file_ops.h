// POSIX file-system steps of a checkpoint, each returning a Status that
// names the path and the system error: atomic writes (temporary name, fsync,
// rename, fsync of the directory; the temporary removed on every failure),
// directory creation, listing, renaming, exchanging and removal, and the
// checks a reader makes before it trusts a path (what it resolves to, which
// file it is).
//
// Every step that changes the file system passes through one hook, so that
// a test can kill the process at each of them in turn (checkpoint_kill_test).
#ifndef ZEROSHARD_CHECKPOINT_FILE_OPS_H_
#define ZEROSHARD_CHECKPOINT_FILE_OPS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zeroshard::internal {

// "<dir>/<name>".
std::string JoinPath(const std::string& dir, const std::string& name);
// The directory part of `path` ("." for a bare name).
std::string ParentPath(const std::string& path);

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
absl::StatusOr<int64_t> FileSize(const std::string& path);

// The mutating steps the hook sees, in the order a caller makes them.
enum class FileOp { kCreate, kWrite, kFsync, kRename, kExchange, kUnlink, kRmdir, kMkdir };
const char* FileOpName(FileOp op);
// Called before every mutating step with the path it changes (for a rename,
// the source). Tests only: null (the default) calls nothing. Not
// synchronised with steps in flight: set it before any.
using FileOpHook = void (*)(FileOp op, const std::string& path);
void SetFileOpHookForTesting(FileOpHook hook);
// false: ExchangePaths reports that the file system cannot exchange, so
// that tests run the commit's fallback on file systems that can.
void SetExchangeSupportedForTesting(bool supported);

// A file written under a temporary name and renamed onto its path only when
// complete, so a reader sees the old file or the whole new one. The
// temporary is `path`.tmp, created exclusively (a stale one, left by a
// killed writer, is unlinked first: only the name, so a file linked
// elsewhere keeps its data); it is removed whenever the file is not
// committed (an error at any step, or destruction before Commit).
class AtomicFile {
 public:
  static absl::StatusOr<AtomicFile> Create(const std::string& path);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  ~AtomicFile();

  // Appends `n` bytes (retrying short writes and EINTR).
  absl::Status Write(const void* bytes, size_t n);
  // fsync, close, rename onto the path, fsync of the directory. After an
  // error nothing is left at the temporary name and the path is unchanged
  // (unless the rename itself succeeded and only the directory's fsync
  // failed).
  absl::Status Commit();
  const std::string& temp_path() const { return temp_; }

 private:
  AtomicFile() = default;
  void Abandon();
  std::string path_;
  std::string temp_;
  int fd_ = -1;
};

// `bytes` as the whole of `path`, through AtomicFile.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);

// `bytes` as the whole of `path` (created or truncated), without fsync or
// rename: for files whose loss in a crash does not matter (the directory
// check's probe), so that they cost no disk flush.
absl::Status WriteFilePlainly(const std::string& path, const std::string& bytes);

// mkdir -p (existing directories are fine).
absl::Status MakeDirectories(const std::string& path);
absl::Status FsyncDirectory(const std::string& path);
// rename(2), then fsync of the parent directory.
absl::Status RenamePath(const std::string& from, const std::string& to);
// Swaps two existing paths in one atomic step (renameat2 RENAME_EXCHANGE),
// then fsyncs their directory. Unimplemented when the file system cannot
// (NFS and some others): the caller then renames in two steps.
absl::Status ExchangePaths(const std::string& a, const std::string& b);
// rm -r; a missing path is fine; a symlink is removed, never followed.
absl::Status RemoveTree(const std::string& path);
// Entry names (not . and ..), sorted.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);

// Which file a path is (stat: symlinks followed), to tell whether two paths
// are the same file whatever their spelling.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  bool operator==(const FileIdentity& o) const { return device == o.device && inode == o.inode; }
};
std::optional<FileIdentity> IdentityOf(const std::string& path);

// Whether `path`, every symlink resolved, is `root` or lies under it (both
// resolved with realpath). NotFound when either does not exist.
absl::StatusOr<bool> ResolvesInside(const std::string& path, const std::string& root);
// `path` with every symlink resolved (realpath), or `path` itself when it
// cannot be resolved: for messages.
std::string ResolvedPath(const std::string& path);

// Writes all of `bytes` to `fd` at the current offset (retrying short
// writes and EINTR); `path` names the file in errors.
absl::Status WriteAll(int fd, const void* bytes, size_t n, const std::string& path);
// Reads exactly `n` bytes at `offset` (DataLoss when the file ends first).
absl::Status ReadAt(int fd, int64_t offset, void* out, size_t n, const std::string& path);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_CHECKPOINT_FILE_OPS_H_
