// Builds without MPI: the backend exists but says so.
#include <cstdio>
#include <cstdlib>

#include "zeroshard/communicator.h"

namespace zeroshard {

bool HaveMpi() { return false; }

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(CommOptions options) {
  return absl::UnimplementedError(
      "built without MPI; reconfigure with -DZS_MPI=ON on a machine with an MPI implementation "
      "(e.g. Debian's libopenmpi-dev)");
}

void FinalizeMpi() {}

void AbortJob(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(exit_code);
}

}  // namespace zeroshard
