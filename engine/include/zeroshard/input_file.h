// Files that a user names as input (a --data corpus, a --config, a machine
// profile, a spec, a safetensors file, a checkpoint's `latest` and
// manifest), opened by one rule for every tool, example and the engine:
// only a regular file (or a symlink to one) is opened, anything else is
// refused before a byte is read and without blocking, and no read goes past
// a size the caller states. A FIFO, a socket or a device (/dev/zero,
// /dev/urandom) is never opened for reading, so a reader can neither hang on
// one nor allocate without bound; a directory is refused as well.
//
// Every error message names the path and the file's role (`what`, e.g.
// "the --machine profile"), and says what the file is when it is not regular:
//   NotFound           no such path (a dangling symlink says where it points);
//   PermissionDenied   the file may not be opened;
//   FailedPrecondition not a regular file: "PATH: a FIFO (named pipe), where
//                      WHAT must be a regular file; it is not read";
//   OutOfRange         larger than `max_bytes` (both sizes), also when the
//                      file grows past it while it is read;
//   DataLoss           the file shrank while it was read;
//   Internal           the system's other errors (the call and errno named).
#ifndef ZEROSHARD_INPUT_FILE_H_
#define ZEROSHARD_INPUT_FILE_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard {

// `max_bytes` for a file read at offsets, never whole (a safetensors file of
// many GB): no cap on its size, reads bounded by the size it has.
inline constexpr int64_t kNoInputSizeCap = std::numeric_limits<int64_t>::max();

// An open regular file, read at offsets (pread: the object may be shared by
// readers on several threads). Move-only; closes its descriptor.
class InputFile {
 public:
  // Opens `path` for reading after checking, without opening it, that it is
  // a regular file of at most `max_bytes` bytes; checks the opened
  // descriptor again (a path swapped for a FIFO in between is refused, not
  // waited on). Errors as the file comment says.
  static absl::StatusOr<InputFile> Open(const std::string& path, absl::string_view what,
                                        int64_t max_bytes);

  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  const std::string& path() const { return path_; }
  // The file's role in messages, as given to Open.
  const std::string& what() const { return what_; }
  // The size when it was opened; ReadAt reads within it.
  int64_t size() const { return size_; }

  // Exactly `bytes` bytes at `offset` into `dst`. OutOfRange for a range
  // outside [0, size()); DataLoss when the file ends before it (it shrank
  // since it was opened); Internal for a failed read.
  absl::Status ReadAt(int64_t offset, void* dst, int64_t bytes) const;

  // The whole file: size() bytes, or more when it grew since it was opened
  // (up to the `max_bytes` of Open: OutOfRange past it).
  absl::StatusOr<std::string> ReadAll() const;

 private:
  InputFile(int fd, std::string path, std::string what, int64_t size, int64_t max_bytes);

  int fd_ = -1;
  std::string path_;
  std::string what_;
  int64_t size_ = 0;
  int64_t max_bytes_ = 0;
};

// InputFile::Open(path, what, max_bytes), then ReadAll: the whole of a small
// input (a config, a profile, a spec).
absl::StatusOr<std::string> ReadInputFile(const std::string& path, absl::string_view what,
                                          int64_t max_bytes);

}  // namespace zeroshard

#endif  // ZEROSHARD_INPUT_FILE_H_
