#include "engine/src/checkpoint/file_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

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
  return absl::InternalError(text);
}

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
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

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SystemError("open", path, errno);
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      out.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int error = errno;
    close(fd);
    if (n < 0) return SystemError("read", path, error);
    return out;
  }
}

absl::Status WriteAll(int fd, const void* bytes, size_t n, const std::string& path) {
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

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return SystemError("create", tmp, errno);
  absl::Status status = WriteAll(fd, bytes.data(), bytes.size(), tmp);
  if (status.ok() && fsync(fd) != 0) status = SystemError("fsync", tmp, errno);
  if (close(fd) != 0 && status.ok()) status = SystemError("close", tmp, errno);
  if (!status.ok()) {
    unlink(tmp.c_str());
    return status;
  }
  return RenamePath(tmp, path);
}

absl::Status MakeDirectories(const std::string& path) {
  if (path.empty() || IsDirectory(path)) return absl::OkStatus();
  const std::string parent = Parent(path);
  if (parent != path) ZS_RETURN_IF_ERROR(MakeDirectories(parent));
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return SystemError("mkdir", path, errno);
  }
  return absl::OkStatus();
}

absl::Status RenamePath(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) {
    return SystemError("rename " + from + " to", to, errno);
  }
  return FsyncDirectory(Parent(to));
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : SystemError("stat", path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    ZS_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDirectory(path));
    for (const std::string& e : entries) ZS_RETURN_IF_ERROR(RemoveTree(JoinPath(path, e)));
    if (rmdir(path.c_str()) != 0 && errno != ENOENT) return SystemError("rmdir", path, errno);
    return absl::OkStatus();
  }
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

}  // namespace zeroshard::internal
