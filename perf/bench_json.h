// How a benchmark writes its --json file: one format (nlohmann's dump with
// an indent of 1, then a newline) and one pair of messages, so every file
// perf/report/make_report.py reads is written the same way.
#ifndef ZEROSHARD_PERF_BENCH_JSON_H_
#define ZEROSHARD_PERF_BENCH_JSON_H_

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "cli/output_file.h"
#include "nlohmann/json.hpp"

namespace zeroshard::perf {

// Writes `j` to `path`. On success prints "<bench>: wrote <path>" on stdout
// and returns true; when the file cannot be written prints "<bench>: cannot
// write --json <path>" on stderr and returns false (the benchmark then exits
// 1).
inline bool WriteBenchJson(const char* bench, const std::string& path, const nlohmann::json& j) {
  // Every write, the fsync and the close checked (a full disk is an error).
  const absl::Status written = cli::WriteOutputFile("--json", path, j.dump(1) + "\n");
  if (!written.ok()) {
    std::fprintf(stderr, "%s: cannot write %s\n", bench, std::string(written.message()).c_str());
    return false;
  }
  std::printf("%s: wrote %s\n", bench, path.c_str());
  return true;
}

}  // namespace zeroshard::perf

#endif  // ZEROSHARD_PERF_BENCH_JSON_H_
