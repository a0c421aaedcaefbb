#include "cli/output_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zeroshard {
namespace cli {
namespace {

// "flag path" or "path" when no flag names the file.
std::string Subject(absl::string_view flag, const std::string& path) {
  return flag.empty() ? path : absl::StrCat(flag, " ", path);
}

std::string ParentDirectory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// What the user can do about a failed write.
const char* Remedy(int error_number) {
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
      return "free disk space or give a path on another file system";
    case EACCES:
    case EPERM:
    case EROFS:
      return "give a path in a directory you can write";
    default:
      return "check the path and the file system, or give another path";
  }
}

}  // namespace

absl::StatusOr<OutputFile> OutputFile::Open(absl::string_view flag, const std::string& path,
                                            Mode mode) {
  const std::string subject = Subject(flag, path);
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": the path is empty"));
  std::FILE* file = std::fopen(path.c_str(), mode == Mode::kAppend ? "ae" : "we");
  if (file != nullptr) return OutputFile(std::string(flag), path, file);
  const int error = errno;
  const std::string parent = ParentDirectory(path);
  if (error == ENOENT && !IsDirectory(parent)) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: the directory %s does not exist; create it or give another path", subject, parent));
  }
  if (error == ENOTDIR) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: a part of the path is not a directory (%s (errno %d)); give a path in an existing "
        "directory",
        subject, std::strerror(error), error));
  }
  if (error == EISDIR) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: is a directory; give the name of a file", subject));
  }
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrFormat("%s: cannot create the file: %s (errno %d); %s", subject,
                                      std::strerror(error), error, Remedy(error)));
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : flag_(std::move(other.flag_)), path_(std::move(other.path_)), file_(other.file_) {
  other.file_ = nullptr;
}

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    if (file_ != nullptr) std::fclose(file_);
    flag_ = std::move(other.flag_);
    path_ = std::move(other.path_);
    file_ = other.file_;
    other.file_ = nullptr;
  }
  return *this;
}

OutputFile::~OutputFile() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status OutputFile::Error(absl::string_view what, int error_number) const {
  return absl::Status(
      absl::ErrnoToStatusCode(error_number),
      absl::StrFormat("%s: %s failed: %s (errno %d); %s", Subject(flag_, path_), what,
                      std::strerror(error_number), error_number, Remedy(error_number)));
}

absl::Status OutputFile::Write(absl::string_view text) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(Subject(flag_, path_), ": written after Close"));
  }
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size()) {
    return Error("writing", errno != 0 ? errno : EIO);
  }
  return absl::OkStatus();
}

absl::Status OutputFile::Flush() {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(Subject(flag_, path_), ": flushed after Close"));
  }
  if (std::fflush(file_) != 0) return Error("writing", errno);
  return absl::OkStatus();
}

absl::Status OutputFile::Close() {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(Subject(flag_, path_), ": closed twice"));
  }
  std::FILE* file = file_;
  file_ = nullptr;
  absl::Status status = absl::OkStatus();
  if (std::fflush(file) != 0) status = Error("writing", errno);
  struct stat st {};
  // Only a regular file holds data to sync (a pipe or /dev/stdout has none
  // and refuses fsync with EINVAL).
  if (status.ok() && fstat(fileno(file), &st) == 0 && S_ISREG(st.st_mode) &&
      fsync(fileno(file)) != 0) {
    status = Error("fsync", errno);
  }
  if (std::fclose(file) != 0 && status.ok()) status = Error("closing", errno);
  return status;
}

absl::Status WriteOutputFile(absl::string_view flag, const std::string& path,
                             absl::string_view text) {
  absl::StatusOr<OutputFile> file = OutputFile::Open(flag, path);
  if (!file.ok()) return file.status();
  if (absl::Status written = file->Write(text); !written.ok()) return written;
  return file->Close();
}

absl::Status FlushStandardOutput() {
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (flushed && !std::ferror(stdout) && std::cout.good()) return absl::OkStatus();
  if (flushed || error == 0) {
    // An earlier write failed (the stream keeps only that it did, not why).
    return absl::DataLossError(
        "standard output: an earlier write to it failed, so what was printed is incomplete; "
        "check where it goes (a full disk, a closed pipe)");
  }
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrFormat("standard output: writing failed: %s (errno %d); %s",
                                      std::strerror(error), error, Remedy(error)));
}

}  // namespace cli
}  // namespace zeroshard
