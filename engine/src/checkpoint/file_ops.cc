#include "engine/src/checkpoint/file_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

std::atomic<FileOpHook> file_op_hook{nullptr};
std::atomic<bool> exchange_supported{true};

void Before(FileOp op, const std::string& path) {
  if (FileOpHook hook = file_op_hook.load(std::memory_order_relaxed)) hook(op, path);
}

absl::Status SystemError(const std::string& what, const std::string& path, int error) {
  const std::string text =
      absl::StrFormat("%s %s: %s (errno %d)", what, path, std::strerror(error), error);
  if (error == ENOENT) return absl::NotFoundError(text);
  if (error == ENOSPC || error == EDQUOT) {
    return absl::ResourceExhaustedError(text + "; free disk space or choose another directory");
  }
  if (error == EACCES || error == EPERM || error == EROFS) {
    return absl::PermissionDeniedError(text + "; check the directory's permissions");
  }
  if (error == ENOTDIR) {
    return absl::FailedPreconditionError(
        text + "; a part of the path is a file, not a directory: choose another directory");
  }
  if (error == EEXIST || error == EISDIR) {
    return absl::FailedPreconditionError(text + "; something else is in the way there");
  }
  if (error == ENAMETOOLONG || error == ELOOP) return absl::InvalidArgumentError(text);
  return absl::InternalError(text);
}

}  // namespace

const char* FileOpName(FileOp op) {
  switch (op) {
    case FileOp::kCreate:
      return "create";
    case FileOp::kWrite:
      return "write";
    case FileOp::kFsync:
      return "fsync";
    case FileOp::kRename:
      return "rename";
    case FileOp::kExchange:
      return "exchange";
    case FileOp::kUnlink:
      return "unlink";
    case FileOp::kRmdir:
      return "rmdir";
    case FileOp::kMkdir:
      return "mkdir";
  }
  return "?";
}

void SetFileOpHookForTesting(FileOpHook hook) { file_op_hook.store(hook); }
void SetExchangeSupportedForTesting(bool supported) { exchange_supported.store(supported); }

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string ParentPath(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;  // "a/b/" is in "a"
  const size_t slash = path.find_last_of('/', end - 1);
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return SystemError("stat", path, errno);
  return static_cast<int64_t>(st.st_size);
}

absl::Status WriteAll(int fd, const void* bytes, size_t n, const std::string& path) {
  Before(FileOp::kWrite, path);
  const char* p = static_cast<const char*>(bytes);
  while (n > 0) {
    const ssize_t written = write(fd, p, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      return SystemError("write", path, errno);
    }
    p += written;
    n -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status ReadAt(int fd, int64_t offset, void* out, size_t n, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return SystemError("read", path, errno);
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrFormat(
          "%s: the file ends at byte %d, before the %d bytes expected there; it is truncated", path,
          offset, n));
    }
    p += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
  return absl::OkStatus();
}

absl::Status FsyncDirectory(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return SystemError("open directory", path, errno);
  const int rc = fsync(fd);
  const int error = errno;
  close(fd);
  if (rc != 0 && error != EINVAL) return SystemError("fsync directory", path, error);
  return absl::OkStatus();
}

absl::StatusOr<AtomicFile> AtomicFile::Create(const std::string& path) {
  AtomicFile file;
  file.path_ = path;
  file.temp_ = path + ".tmp";
  // Only the name of a stale temporary goes: O_EXCL below then guarantees
  // that the bytes written land in a new file, never in one linked elsewhere.
  Before(FileOp::kUnlink, file.temp_);
  if (unlink(file.temp_.c_str()) != 0 && errno != ENOENT) {
    return SystemError("unlink stale", file.temp_, errno);
  }
  Before(FileOp::kCreate, file.temp_);
  file.fd_ = open(file.temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (file.fd_ < 0) return SystemError("create", file.temp_, errno);
  return file;
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept { *this = std::move(other); }

AtomicFile& AtomicFile::operator=(AtomicFile&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    temp_ = std::move(other.temp_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

AtomicFile::~AtomicFile() { Abandon(); }

void AtomicFile::Abandon() {
  if (fd_ < 0) return;
  close(fd_);
  fd_ = -1;
  Before(FileOp::kUnlink, temp_);
  unlink(temp_.c_str());
}

absl::Status AtomicFile::Write(const void* bytes, size_t n) {
  if (fd_ < 0) return absl::FailedPreconditionError(temp_ + ": written after it was closed");
  absl::Status status = WriteAll(fd_, bytes, n, temp_);
  if (!status.ok()) Abandon();
  return status;
}

absl::Status AtomicFile::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(temp_ + ": committed after it was closed");
  Before(FileOp::kFsync, temp_);
  if (fsync(fd_) != 0) {
    const absl::Status status = SystemError("fsync", temp_, errno);
    Abandon();
    return status;
  }
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) {
    const absl::Status status = SystemError("close", temp_, errno);
    unlink(temp_.c_str());
    return status;
  }
  Before(FileOp::kRename, temp_);
  if (rename(temp_.c_str(), path_.c_str()) != 0) {
    const absl::Status status = SystemError("rename " + temp_ + " to", path_, errno);
    Before(FileOp::kUnlink, temp_);
    unlink(temp_.c_str());
    return status;
  }
  return FsyncDirectory(ParentPath(path_));
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  ZS_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::Create(path));
  ZS_RETURN_IF_ERROR(file.Write(bytes.data(), bytes.size()));
  return file.Commit();
}

absl::Status WriteFilePlainly(const std::string& path, const std::string& bytes) {
  Before(FileOp::kCreate, path);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return SystemError("create", path, errno);
  absl::Status status = WriteAll(fd, bytes.data(), bytes.size(), path);
  if (close(fd) != 0 && status.ok()) status = SystemError("close", path, errno);
  return status;
}

absl::Status MakeDirectories(const std::string& path) {
  if (path.empty() || IsDirectory(path)) return absl::OkStatus();
  const std::string parent = ParentPath(path);
  if (parent != path) ZS_RETURN_IF_ERROR(MakeDirectories(parent));
  Before(FileOp::kMkdir, path);
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return SystemError("mkdir", path, errno);
  }
  return absl::OkStatus();
}

absl::Status RenamePath(const std::string& from, const std::string& to) {
  Before(FileOp::kRename, from);
  if (rename(from.c_str(), to.c_str()) != 0) {
    return SystemError("rename " + from + " to", to, errno);
  }
  return FsyncDirectory(ParentPath(to));
}

absl::Status ExchangePaths(const std::string& a, const std::string& b) {
  if (!exchange_supported.load()) {
    return absl::UnimplementedError("exchange turned off for this test");
  }
  Before(FileOp::kExchange, a);
  if (renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    const int error = errno;
    if (error == EINVAL || error == ENOSYS || error == ENOTSUP || error == EOPNOTSUPP) {
      return absl::UnimplementedError(absl::StrFormat(
          "exchange %s and %s: the file system cannot (%s)", a, b, std::strerror(error)));
    }
    return SystemError("exchange " + a + " and", b, error);
  }
  return FsyncDirectory(ParentPath(b));
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : SystemError("stat", path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    ZS_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDirectory(path));
    for (const std::string& e : entries) ZS_RETURN_IF_ERROR(RemoveTree(JoinPath(path, e)));
    Before(FileOp::kRmdir, path);
    if (rmdir(path.c_str()) != 0 && errno != ENOENT) return SystemError("rmdir", path, errno);
    return absl::OkStatus();
  }
  Before(FileOp::kUnlink, path);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return SystemError("unlink", path, errno);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return SystemError("open directory", path, errno);
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<FileIdentity> IdentityOf(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileIdentity{st.st_dev, st.st_ino};
}

std::string ResolvedPath(const std::string& path) {
  char* real = realpath(path.c_str(), nullptr);
  if (real == nullptr) return path;
  std::string out(real);
  free(real);
  return out;
}

absl::StatusOr<bool> ResolvesInside(const std::string& path, const std::string& root) {
  auto resolve = [](const std::string& p) -> absl::StatusOr<std::string> {
    char* real = realpath(p.c_str(), nullptr);
    if (real == nullptr) return SystemError("resolve", p, errno);
    std::string out(real);
    free(real);
    return out;
  };
  ZS_ASSIGN_OR_RETURN(const std::string real_path, resolve(path));
  ZS_ASSIGN_OR_RETURN(const std::string real_root, resolve(root));
  if (real_path == real_root) return true;
  const std::string prefix = real_root == "/" ? real_root : real_root + "/";
  return real_path.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace zeroshard::internal
