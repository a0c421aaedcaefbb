// How a benchmark runs on a communicator backend, with one error policy:
// `--backend local` runs the benchmark body on each requested rank count, as
// threads of this process (RunLocalRanks); `--backend mpi` runs it once on
// mpirun's world. The body is the same function either way.
#ifndef ZEROSHARD_PERF_BENCH_BACKEND_H_
#define ZEROSHARD_PERF_BENCH_BACKEND_H_

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "perf/bench_main.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard::perf {

// Where a benchmark runs.
struct BackendOptions {
  bool mpi = false;
  std::vector<int> local_ranks;  // local: one run per rank count; mpi: mpirun's world instead
};

// Registers --backend local|mpi (into backend->mpi).
inline void AddBackendFlag(cli::FlagSet& flags, BackendOptions* backend) {
  flags.Custom("backend", [backend](const std::string& value) -> absl::Status {
    ZS_ASSIGN_OR_RETURN(const int choice,
                        cli::ParseChoiceFlag("--backend", value, {"local", "mpi"}));
    backend->mpi = choice == 1;
    return absl::OkStatus();
  });
}

// Runs `per_rank(comm)` on every rank: for local, once per entry of
// backend.local_ranks (a fresh group of that many threads each time); for
// mpi, once on the world. `per_rank` is collective over `comm` and keeps what
// rank 0 should report. Then, on rank 0 only, `report(backend_name, world)`
// prints the results and returns the exit code ("local" or "mpi"; world: the
// size of the last group). Returns the exit code.
//
// The error policy: a failed rank's status is printed as "<bench>: run
// failed: <status>" on stderr and the benchmark exits 1 with nothing
// reported. Under mpi the failing process ends the whole job (AbortJob):
// its peers may be waiting for it inside a collective, and MPI_Finalize
// would wait for them.
inline int RunOnBackend(const char* bench, const BackendOptions& backend,
                        const std::function<absl::Status(Communicator& comm)>& per_rank,
                        const std::function<int(const std::string& backend, int world)>& report) {
  auto fail = [bench](const absl::Status& status) {
    std::fprintf(stderr, "%s: run failed: %s\n", bench, status.ToString().c_str());
    return 1;
  };
  if (!backend.mpi) {
    int world = 0;
    for (int ranks : backend.local_ranks) {
      const absl::Status status =
          RunLocalRanks(ranks, [&](int, Communicator& comm) { return per_rank(comm); });
      if (!status.ok()) return fail(status);
      world = ranks;
    }
    return report("local", world);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateMpiCommunicator();
  if (!comm.ok()) return fail(comm.status());
  const absl::Status status = per_rank(**comm);
  if (!status.ok()) {
    fail(status);
    AbortJob(1);
  }
  const int code = (*comm)->rank() == 0 ? report("mpi", (*comm)->size()) : 0;
  comm->reset();
  FinalizeMpi();
  return code;
}

// The main() of a benchmark that runs on a backend: BenchMain's flags, help
// and exit 2 on a bad flag, then RunOnBackend(bench, options.backend, ...)
// with `per_rank(options, comm, &results)` on every rank and
// `report(options, backend_name, world, results)` on rank 0, where results
// are what rank 0's per_rank kept.
template <typename Options, typename Result>
int BackendBenchMain(const char* bench, int argc, char** argv,
                     absl::StatusOr<Options> (*parse)(int argc, char** argv, bool* help),
                     void (*usage)(),
                     absl::Status (*per_rank)(const Options& options, Communicator& comm,
                                              std::vector<Result>* results),
                     int (*report)(const Options& options, const std::string& backend, int world,
                                   const std::vector<Result>& results)) {
  return BenchMain<Options>(bench, argc, argv, parse, usage, [&](const Options& options) {
    std::vector<Result> results;
    return RunOnBackend(
        bench, options.backend,
        [&](Communicator& comm) { return per_rank(options, comm, &results); },
        [&](const std::string& backend, int world) {
          return report(options, backend, world, results);
        });
  });
}

}  // namespace zeroshard::perf

#endif  // ZEROSHARD_PERF_BENCH_BACKEND_H_
