#include "zeroshard/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"

namespace zeroshard {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// `path` for a message: a symlink also says where it points, since what is
// refused is the target ("in.json (a symlink to /dev/zero): a character
// device, ...").
std::string Named(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
  char target[4096];
  const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return path;
  return absl::StrFormat("%s (a symlink to %s)", path, std::string(target, n));
}

absl::Status SystemError(const char* call, const std::string& path, absl::string_view what,
                         int error) {
  const std::string text =
      absl::StrFormat("%s %s: %s (errno %d)", call, Named(path), std::strerror(error), error);
  if (error == ENOENT || error == ENOTDIR) {
    return absl::NotFoundError(absl::StrFormat("%s; check the path of %s", text, what));
  }
  if (error == EACCES || error == EPERM) {
    return absl::PermissionDeniedError(
        absl::StrFormat("%s; check the path of %s and its permissions", text, what));
  }
  return absl::InternalError(absl::StrFormat("%s; %s is not read", text, what));
}

absl::Status CheckRegular(const struct stat& st, const std::string& path, absl::string_view what,
                          int64_t max_bytes) {
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: %s, where %s must be a regular file; it is not read", Named(path),
                        KindOf(st.st_mode), what));
  }
  if (st.st_size > max_bytes) {
    return absl::OutOfRangeError(
        absl::StrFormat("%s: %d bytes, but %s is at most %d bytes; it is not read (damaged, or "
                        "not the file meant?)",
                        Named(path), static_cast<int64_t>(st.st_size), what, max_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

InputFile::InputFile(int fd, std::string path, std::string what, int64_t size, int64_t max_bytes)
    : fd_(fd), path_(std::move(path)), what_(std::move(what)), size_(size), max_bytes_(max_bytes) {}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      size_(other.size_),
      max_bytes_(other.max_bytes_) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    size_ = other.size_;
    max_bytes_ = other.max_bytes_;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<InputFile> InputFile::Open(const std::string& path, absl::string_view what,
                                          int64_t max_bytes) {
  // stat first: a FIFO or a device is refused without being opened (opening
  // a FIFO for reading blocks until a writer comes; opening some devices has
  // effects of its own).
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return SystemError("stat", path, what, errno);
  if (absl::Status s = CheckRegular(st, path, what, max_bytes); !s.ok()) return s;
  // O_NONBLOCK: should the path have been swapped for a FIFO since the stat,
  // the open returns at once and the fstat below refuses it.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return SystemError("open", path, what, errno);
  InputFile file(fd, path, std::string(what), 0, max_bytes);  // closes fd on every return
  struct stat opened {};
  if (fstat(fd, &opened) != 0) return SystemError("fstat", path, what, errno);
  if (absl::Status s = CheckRegular(opened, path, what, max_bytes); !s.ok()) return s;
  // What is opened is a regular file now; reads of it are plain blocking
  // reads (O_NONBLOCK was for the open only).
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return SystemError("fcntl", path, what, errno);
  }
  file.size_ = static_cast<int64_t>(opened.st_size);
  return file;
}

absl::Status InputFile::ReadAt(int64_t offset, void* dst, int64_t bytes) const {
  if (offset < 0 || bytes < 0 || offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%s: bytes [%d, +%d) are outside the %d bytes of %s", path_, offset, bytes, size_, what_));
  }
  char* out = static_cast<char*>(dst);
  int64_t done = 0;
  while (done < bytes) {
    // At most 1 GiB a call: Linux reads at most about 2 GiB at once.
    const size_t want = static_cast<size_t>(std::min<int64_t>(bytes - done, int64_t{1} << 30));
    const ssize_t n = pread(fd_, out + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return SystemError("read", path_, what_, errno);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrFormat(
          "%s: ends at byte %d, but %s had %d bytes when it was opened: it shrank while it was "
          "read; read it again once nothing writes it",
          path_, offset + done, what_, size_));
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> InputFile::ReadAll() const {
  std::string out(static_cast<size_t>(size_), '\0');
  if (absl::Status s = ReadAt(0, out.data(), size_); !s.ok()) return s;
  // The file may have grown since it was opened: read on to its end, but
  // never past max_bytes_.
  char chunk[1 << 16];
  while (true) {
    const auto have = static_cast<int64_t>(out.size());
    const ssize_t n = pread(fd_, chunk, sizeof(chunk), static_cast<off_t>(have));
    if (n < 0) {
      if (errno == EINTR) continue;
      return SystemError("read", path_, what_, errno);
    }
    if (n == 0) return out;
    if (n > max_bytes_ - have) {
      return absl::OutOfRangeError(absl::StrFormat(
          "%s: grew past %d bytes while being read, but %s is at most %d bytes; it is not read",
          path_, max_bytes_, what_, max_bytes_));
    }
    out.append(chunk, static_cast<size_t>(n));
  }
}

absl::StatusOr<std::string> ReadInputFile(const std::string& path, absl::string_view what,
                                          int64_t max_bytes) {
  absl::StatusOr<InputFile> file = InputFile::Open(path, what, max_bytes);
  if (!file.ok()) return file.status();
  return file->ReadAll();
}

}  // namespace zeroshard
