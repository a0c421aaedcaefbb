// What one process can learn about a peer process of the same job without
// the transport: whether it still exists, and whether it is stopped. Only
// possible for peers on the same machine (same kernel boot and pid
// namespace); the MPI backend uses it to tell a dead peer from a stuck one.
#ifndef ZEROSHARD_ENGINE_SRC_COMM_PROCESS_PROBE_H_
#define ZEROSHARD_ENGINE_SRC_COMM_PROCESS_PROBE_H_

#include <cstdint>
#include <string>

namespace zeroshard {
namespace internal {

// A process, identified so that another process can find it again: the pid
// alone may be reused, so the kernel's start time goes with it. Trivially
// copyable (exchanged as bytes between ranks).
struct ProcessIdentity {
  int64_t pid = 0;
  uint64_t start_ticks = 0;  // /proc/<pid>/stat field 22 (clock ticks after boot)
  // Hash of the kernel boot id and the pid namespace: pids of two processes
  // are comparable iff their `machine` values are equal and non-zero.
  uint64_t machine = 0;
  char host[64] = {};  // host name, for messages
  // The rank's node: its shared-memory group's lowest rank in the world
  // communicator (mpi: MPI_COMM_TYPE_SHARED), -1 while unknown. Filled after
  // the identities are exchanged; a Split group keeps it.
  int32_t node_leader = -1;
  // The rank in MPI_COMM_WORLD (mpi; -1 elsewhere), for the heartbeats
  // (mpi_heartbeat.h). Filled like node_leader; a Split group keeps it.
  int32_t world_rank = -1;
};

// This process (machine = 0 when /proc cannot say).
ProcessIdentity ThisProcess();

enum class ProcessState {
  kRunning,  // exists and is not stopped (running, sleeping, waiting on I/O)
  kStopped,  // stopped by a signal (SIGSTOP, SIGTSTP) or a tracer
  kGone,     // exited, killed or a zombie (or its pid now belongs to another process)
  kUnknown,  // on another machine, or /proc could not be read
};

// The state of `peer` as seen from the process `self` (compare machines
// first: a peer elsewhere is kUnknown).
ProcessState ProbeProcess(const ProcessIdentity& peer, const ProcessIdentity& self);

// "pid 4242 on node7".
std::string DescribeProcess(const ProcessIdentity& process);
// "rank 2 (pid 4242 on node7)" for `peer` of a communicator; a rank of a
// Split group whose world rank differs says it too: "rank 0 (world rank 2,
// pid 4242 on node7)", so a message names the process the job knows.
std::string DescribePeer(int peer, const ProcessIdentity& process);
// "is stopped (SIGSTOP, a debugger or job control)", "died: its process is
// gone (killed or crashed)", ... — completes "rank 2 (pid 4242 on node7) ".
std::string DescribeState(ProcessState state);

// Parses the text of /proc/<pid>/stat into the state letter and start time.
// False when the text is malformed. (Exposed for tests.)
bool ParseProcStat(const std::string& text, char* state, uint64_t* start_ticks);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_PROCESS_PROBE_H_
