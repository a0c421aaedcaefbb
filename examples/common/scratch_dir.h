// A scratch directory for an example or a benchmark: the one the user gave,
// kept as it is, or a fresh one under /tmp that is removed with its contents
// when the object is destroyed (the NVMe tier's swap files of a run given
// no --offload-dir).
#ifndef ZEROSHARD_EXAMPLES_COMMON_SCRATCH_DIR_H_
#define ZEROSHARD_EXAMPLES_COMMON_SCRATCH_DIR_H_

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace zeroshard::examples {

class ScratchDir {
 public:
  // `given` non-empty: that directory, never removed. Empty: a fresh
  // /tmp/<prefix>XXXXXX (mkdtemp). Internal error naming the pattern when
  // mkdtemp fails.
  static absl::StatusOr<ScratchDir> Create(const std::string& given, const std::string& prefix) {
    if (!given.empty()) return ScratchDir(given, false);
    std::string pattern = absl::StrCat("/tmp/", prefix, "XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", std::strerror(errno),
                                              "; give a directory (--offload-dir)"));
    }
    return ScratchDir(pattern, true);
  }
  ScratchDir() = default;
  ScratchDir(ScratchDir&& other) noexcept : path_(std::move(other.path_)), owned_(other.owned_) {
    other.owned_ = false;
  }
  ScratchDir& operator=(ScratchDir&& other) noexcept {
    if (this != &other) {
      Remove();
      path_ = std::move(other.path_);
      owned_ = other.owned_;
      other.owned_ = false;
    }
    return *this;
  }
  ~ScratchDir() { Remove(); }

  const std::string& path() const { return path_; }
  // True for a directory this object made (and removes).
  bool owned() const { return owned_; }

 private:
  ScratchDir(std::string path, bool owned) : path_(std::move(path)), owned_(owned) {}
  void Remove() {
    if (!owned_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    owned_ = false;
  }

  std::string path_;
  bool owned_ = false;
};

// The swap directory of grid position (tp, pp) under `base`: the NVMe
// tier's files are named by data-parallel rank, so each position's engines
// need a directory of their own. Created when missing; FailedPrecondition
// naming it when it cannot be.
inline absl::StatusOr<std::string> GridSwapDir(const std::string& base, int tp, int pp) {
  const std::string dir = absl::StrCat(base, "/tp", tp, "_pp", pp);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the swap directory ", dir, ": ", error.message()));
  }
  return dir;
}

}  // namespace zeroshard::examples

#endif  // ZEROSHARD_EXAMPLES_COMMON_SCRATCH_DIR_H_
