#include "engine/src/common/bounded_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zeroshard::internal {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

absl::Status SystemError(const char* call, const std::string& path, int error) {
  const std::string text =
      absl::StrFormat("%s %s: %s (errno %d)", call, path, std::strerror(error), error);
  if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(text);
  if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(text);
  return absl::InternalError(text);
}

absl::Status CheckRegular(const struct stat& st, const std::string& path, int64_t max_bytes,
                          absl::string_view what) {
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: %s, where %s must be a regular file; it is not read", path, KindOf(st.st_mode), what));
  }
  if (st.st_size > max_bytes) {
    return absl::OutOfRangeError(
        absl::StrFormat("%s: %d bytes, but %s is at most %d bytes; it is not read (damaged, or "
                        "not the file meant?)",
                        path, static_cast<int64_t>(st.st_size), what, max_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes,
                                            absl::string_view what) {
  // stat first: a FIFO or device is refused without being opened (opening
  // some devices has effects of its own).
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return SystemError("stat", path, errno);
  if (absl::Status s = CheckRegular(st, path, max_bytes, what); !s.ok()) return s;
  // O_NONBLOCK: should the path have been swapped for a FIFO since the stat,
  // the open returns at once and the fstat below refuses it.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return SystemError("open", path, errno);
  struct stat opened {};
  if (fstat(fd, &opened) != 0) {
    const int error = errno;
    close(fd);
    return SystemError("fstat", path, error);
  }
  if (absl::Status s = CheckRegular(opened, path, max_bytes, what); !s.ok()) {
    close(fd);
    return s;
  }
  std::string out(static_cast<size_t>(opened.st_size), '\0');
  size_t have = 0;
  char probe = 0;
  while (true) {
    // Read into the string while it has room, then one byte more to see
    // whether the file grew past max_bytes.
    char* dest = have < out.size() ? &out[have] : &probe;
    const size_t want = have < out.size() ? out.size() - have : 1;
    const ssize_t n = read(fd, dest, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      close(fd);
      return SystemError("read", path, error);
    }
    if (n == 0) break;
    if (dest == &probe) {
      if (static_cast<int64_t>(out.size()) >= max_bytes) {
        close(fd);
        return absl::OutOfRangeError(absl::StrFormat(
            "%s: grew past %d bytes while being read, but %s is at most %d bytes; it is not read",
            path, max_bytes, what, max_bytes));
      }
      out.push_back(probe);
      ++have;
      continue;
    }
    have += static_cast<size_t>(n);
  }
  close(fd);
  out.resize(have);
  return out;
}

}  // namespace zeroshard::internal

namespace zeroshard {

std::string QuoteForMessage(absl::string_view text, size_t max_chars) {
  const absl::string_view head = text.substr(0, max_chars);
  std::string quoted = absl::StrCat("'", absl::CHexEscape(head), "'");
  if (head.size() < text.size()) {
    absl::StrAppend(&quoted, "... (", text.size(), " bytes)");
  }
  return quoted;
}

}  // namespace zeroshard
