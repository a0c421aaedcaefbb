// Internal pieces of the `mpi` backend shared by the communicator
// (mpi_communicator.cc) and MPI set-up and tear-down (mpi_runtime.cc).
#ifndef ZEROSHARD_ENGINE_SRC_COMM_MPI_RUNTIME_H_
#define ZEROSHARD_ENGINE_SRC_COMM_MPI_RUNTIME_H_

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/src/comm/process_probe.h"
#include "zeroshard/communicator.h"

namespace zeroshard {
namespace internal {

// Guards MPI initialisation and the per-process communicator count.
std::mutex& MpiInitMutex();
// The thread level MPI provides (set once by EnsureMpiInitialized).
int MpiThreadLevel();

// Serialises MPI calls across communicators when MPI is not
// MPI_THREAD_MULTIPLE; a no-op otherwise. Hold it around every MPI call.
class MpiCallLock {
 public:
  MpiCallLock();

 private:
  std::unique_lock<std::mutex> lock_;
};

// InternalError "<where>: <call> failed: <MPI's text> (MPI error <code>)".
absl::Status MpiError(const std::string& where, const char* call, int code);

// Initialises MPI (asking for MPI_THREAD_MULTIPLE) unless it already is;
// FailedPrecondition when it was finalized or provides less than
// MPI_THREAD_SERIALIZED.
absl::Status EnsureMpiInitialized();

// The communicator over `comm` (an MPI_Comm_idup of MPI_COMM_WORLD that it
// then owns), with every rank's process identity in rank order.
std::unique_ptr<Communicator> NewMpiCommunicator(MPI_Comm comm, int rank, int size,
                                                 int64_t tag_space, uint64_t instance,
                                                 std::vector<ProcessIdentity> processes,
                                                 CommOptions options);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_MPI_RUNTIME_H_
