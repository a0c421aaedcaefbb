// A file a tool, an example or a benchmark writes its results into
// (--result-json, --log-json, --svg, a benchmark's JSON): every step of the
// write is checked, the last ones (flush, fsync, close) included, so a full
// disk or a vanished directory ends the program with an error naming the flag
// and the file instead of a silently truncated result. Not part of the
// installed library (cli/ is built for tools/, examples/ and perf/ only).
//
//   ZS_ASSIGN_OR_RETURN(cli::OutputFile log, cli::OutputFile::Open("--log-json", path));
//   ZS_RETURN_IF_ERROR(log.Write(line));
//   ZS_RETURN_IF_ERROR(log.Close());
//
// Errors carry the code of the cause (absl::ErrnoToStatusCode: NotFound,
// PermissionDenied, ResourceExhausted for a full disk, ...) and read
// "<flag> <path>: <what failed>: <strerror> (errno N); <what to do>".
#ifndef ZEROSHARD_CLI_OUTPUT_FILE_H_
#define ZEROSHARD_CLI_OUTPUT_FILE_H_

#include <cstdio>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard {
namespace cli {

class OutputFile {
 public:
  enum class Mode {
    kTruncate,  // a fresh file: what was there is replaced
    kAppend,    // keep what is there and write after it
  };

  // Opens (creates) `path` for writing. `flag` names it in messages
  // ("--result-json"; empty for a file no flag names). NotFound "the
  // directory D does not exist" when the parent directory is missing,
  // FailedPrecondition when a part of the path is not a directory or the
  // path is a directory, else the cause's code (PermissionDenied, ...).
  static absl::StatusOr<OutputFile> Open(absl::string_view flag, const std::string& path,
                                         Mode mode = Mode::kTruncate);

  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  // Closes a file not closed by Close(), unchecked: only on a path that
  // already returns another error.
  ~OutputFile();

  // Writes `text` (buffered); the cause's code when the write fails.
  absl::Status Write(absl::string_view text);
  // Hands what is buffered to the system (a log read while the run goes on).
  absl::Status Flush();
  // Flushes, syncs (a regular file: the data is on disk when it returns OK;
  // a pipe or a device is not synced) and closes. Call it once; after it
  // (whatever it returned) the file is closed.
  absl::Status Close();

  const std::string& path() const { return path_; }

 private:
  OutputFile(std::string flag, std::string path, std::FILE* file)
      : flag_(std::move(flag)), path_(std::move(path)), file_(file) {}
  absl::Status Error(absl::string_view what, int error_number) const;

  std::string flag_;
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Open, Write(text) and Close: the whole of a results file at once.
absl::Status WriteOutputFile(absl::string_view flag, const std::string& path,
                             absl::string_view text);

// Flushes the standard output and reports whether everything written to it
// (printf and std::cout alike) reached its destination: the cause's code and
// "standard output: ..." otherwise (`zeroshard estimate --json > /dev/full`).
absl::Status FlushStandardOutput();

}  // namespace cli
}  // namespace zeroshard

#endif  // ZEROSHARD_CLI_OUTPUT_FILE_H_
