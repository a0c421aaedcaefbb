// The main() of the benchmarks that take flags: --help prints the usage, a
// bad flag is one line naming the benchmark (exit 2), else the benchmark
// runs and its return value is the exit status.
#ifndef ZEROSHARD_PERF_BENCH_MAIN_H_
#define ZEROSHARD_PERF_BENCH_MAIN_H_

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"

namespace zeroshard::perf {

// `parse(argc, argv, &help)` returns the options (or the flag error);
// `usage()` prints the usage to stdout; `run(options)` runs the benchmark.
template <typename Options, typename Parse, typename Usage, typename Run>
int BenchMain(const char* name, int argc, char** argv, Parse parse, Usage usage, Run run) {
  bool help = false;
  absl::StatusOr<Options> options = parse(argc, argv, &help);
  if (help) {
    usage();
    return 0;
  }
  if (!options.ok()) {
    std::fprintf(stderr, "%s: %s (see --help)\n", name,
                 std::string(options.status().message()).c_str());
    return 2;
  }
  return run(*options);
}

}  // namespace zeroshard::perf

#endif  // ZEROSHARD_PERF_BENCH_MAIN_H_
