// Internal pieces of the `mpi` backend shared by the communicator
// (mpi_communicator.cc) and MPI set-up and tear-down (mpi_runtime.cc).
#ifndef ZEROSHARD_ENGINE_SRC_COMM_MPI_RUNTIME_H_
#define ZEROSHARD_ENGINE_SRC_COMM_MPI_RUNTIME_H_

#include <mpi.h>

#include <cstdint>
#include <functional>
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

// Gives up on requests of a failed operation: receives (is_recv(i)) are
// cancelled, sends freed (MPI cannot cancel them reliably). A cancelled
// receive that had not matched completes at once; one mid-transfer from a
// stopped or dead peer may never, and waiting for it (MPI_Wait) would hang
// this rank for good, so this polls 50 ms, then lets go. Returns true when a
// receive was let go unfinished: MPI may still write its buffer, which must
// stay alive until the process ends. Every request is MPI_REQUEST_NULL
// afterwards. Call with the MpiCallLock held.
bool AbandonRequests(std::vector<MPI_Request>& requests,
                     const std::function<bool(size_t)>& is_recv);

// The number of the next MPI communicator this process creates (or, for a
// rank that joins no group of a Split, would have created): every rank
// numbers its communicators alike.
uint64_t NextMpiInstance();

// The communicator over `comm` (its collectives) and `p2p_comm` (its Send
// and Recv), both owned from now on, with every rank's process identity in
// rank order. `group_name` as for AsyncCommunicator::SetGroupName.
std::unique_ptr<Communicator> NewMpiCommunicator(MPI_Comm comm, MPI_Comm p2p_comm, int rank,
                                                 int size, int64_t tag_space, uint64_t instance,
                                                 std::vector<ProcessIdentity> processes,
                                                 CommOptions options, std::string group_name = "");

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_MPI_RUNTIME_H_
