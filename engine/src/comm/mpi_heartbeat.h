// Heartbeats between ranks on different nodes (the `mpi` backend). A rank
// cannot see another node's processes (process_probe.h works on one
// machine only), so without them a peer that waits in a collective cannot
// tell a rank that is slow from one whose node is gone, stopped or cut off,
// and learns nothing before the collective's timeout. Once per process, on
// the first CreateMpiCommunicator of a job that spans nodes, a thread starts
// that sends every rank on another node a small message every
// kHeartbeatInterval over a communicator of its own and notes when each such
// rank's last arrived. A communicator waiting for a peer asks how long that
// peer has been silent (SilenceOf) and fails, naming it and its node, once
// the silence passes its limit (HeartbeatLimit): a stopped process, a dead
// node and a link that went down all fall silent; a rank that is merely busy
// keeps beating (the thread does not wait for the trainer).
#ifndef ZEROSHARD_ENGINE_SRC_COMM_MPI_HEARTBEAT_H_
#define ZEROSHARD_ENGINE_SRC_COMM_MPI_HEARTBEAT_H_

#include <mpi.h>

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace zeroshard {
namespace internal {

inline constexpr absl::Duration kHeartbeatInterval = absl::Milliseconds(250);

// How long a peer on another node may stay silent before a communicator
// with collective timeout `timeout` gives up on it: half the timeout,
// within [2 s, 10 s] (8 to 40 missed beats), so a busy machine's scheduling
// hiccup is not a lost node and a lost node is named well before the
// timeout.
absl::Duration HeartbeatLimit(absl::Duration timeout);

// Starts the heartbeat thread (idempotent: only the first call in a process
// starts it) over a dup of `world`, watching the world ranks `watched`.
// Collective over `world`: every rank calls it once with its own list (the
// ranks on other nodes), or none does.
absl::Status StartHeartbeats(MPI_Comm world, std::vector<int> watched, absl::Time deadline,
                             absl::Duration timeout);

// How long world rank `world_rank` has been silent: since its last beat
// arrived (or since the heartbeats started). nullopt when it is not watched
// (same node, or no heartbeats in this job).
std::optional<absl::Duration> SilenceOf(int world_rank);

// Stops the thread, waits for every rank to stop (a nonblocking barrier,
// receiving the beats of ranks not there yet; no time limit, like the
// MPI_Finalize that follows) and frees its requests (FinalizeMpi; not
// needed before AbortJob).
void StopHeartbeats();

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_MPI_HEARTBEAT_H_
