// Reading files that zeroshard did not write (a spec, an HF config, a
// machine profile, a checkpoint's `latest` and manifest) without trusting
// them: only regular files, never more than a stated number of bytes, and
// messages that quote at most a short, printable prefix of what was read.
#ifndef ZEROSHARD_COMMON_BOUNDED_READ_H_
#define ZEROSHARD_COMMON_BOUNDED_READ_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/quote.h"

namespace zeroshard::internal {

// The whole of `path`, which must be a regular file (or a symlink to one) of
// at most `max_bytes` bytes. Anything else is refused before a byte is read
// and without blocking: a FIFO, a socket or a device (/dev/zero) is never
// opened for reading, so a reader cannot hang on one or allocate without
// bound. `what` names the file's role in messages ("the checkpoint's
// `latest` file"). Errors name the path:
//   NotFound           the path does not exist;
//   FailedPrecondition not a regular file (says what it is);
//   OutOfRange         larger than `max_bytes` (says both sizes), also when
//                      the file grows past it while it is read;
//   PermissionDenied / Internal for the system's errors (errno named).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes,
                                            absl::string_view what);

// QuoteForMessage (zeroshard/quote.h): how every message quotes what was read.
using ::zeroshard::QuoteForMessage;

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_COMMON_BOUNDED_READ_H_
