// LocalMailbox: Send and Recv between the ranks (threads) of one local group.
//
// Matching happens when an operation is posted, under the mailbox's lock: a
// Send from a to b with tag t meets the oldest unmatched Recv of b from a
// with tag t, and the other way round, so the k-th Send meets the k-th Recv
// of the same (sender, receiver, tag). No data is staged: an unmatched Send
// waits with the sender's own buffer (rendezvous), and once matched the
// receiver's point-to-point thread copies straight from the sender's buffer
// into its own. The mailbox holds only bookkeeping (one small record per
// unmatched operation), never message data.
//
// Each rank's operations are reported (their CommOpState completed) by that
// rank's point-to-point thread, RunWorker, which also copies the data of its
// matched receives and times out its unmatched operations. Sends and
// receives therefore wait neither for the collectives (another thread) nor
// for one another (matching is bookkeeping, copies never wait for a peer).
#ifndef ZEROSHARD_ENGINE_SRC_COMM_LOCAL_MAILBOX_H_
#define ZEROSHARD_ENGINE_SRC_COMM_LOCAL_MAILBOX_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/src/comm/collective_memory.h"
#include "engine/src/comm/comm_op.h"

namespace zeroshard::internal {

class LocalMailbox {
 public:
  // `timeout`: the group's (resolved) timeout, for messages.
  LocalMailbox(int world_size, absl::Duration timeout);

  // Queues a Send or Recv of `rank` (arguments checked) and matches it at
  // once when its counterpart is queued. `prefix` names the rank in errors.
  // The rank's worker must be running (or start later) to report it.
  void Post(int rank, const PointToPointArgs& args, std::shared_ptr<CommOpState> state,
            absl::Time deadline, const std::string& prefix);

  // The point-to-point thread of `rank`: until Stop(rank), copies the data of
  // the rank's matched receives (with `memory`, used by this thread only),
  // fails its operations whose deadline passed, and reports every decided
  // operation through `finish` (called without the mailbox's lock held).
  void RunWorker(int rank, CollectiveMemory& memory,
                 const std::function<void(CommOpState&, absl::Status)>& finish);
  // Makes RunWorker(rank) return soon.
  void Stop(int rank);
  // Once the worker of `rank` returned (or never ran): fails what is left of
  // its operations (Cancelled; a Send matched with one of them Aborted) and
  // completes them, and marks the rank gone.
  void Drain(int rank, const std::string& reason);

  // `rank` failed or its communicator is going away: its unmatched
  // operations fail, and so do its peers' that wait for it (Aborted, naming
  // it), now and when posted later.
  void MarkGone(int rank, const std::string& reason);
  // `rank` will post nothing more (its function returned): its queued Sends
  // and Recvs may still be matched, but its peers' operations that no queued
  // one of it matches fail at once (Aborted, naming it), now and later.
  void MarkLeft(int rank, const std::string& reason);

 private:
  struct Op {
    PointToPointArgs args;
    int owner = 0;
    std::shared_ptr<CommOpState> state;
    absl::Time deadline;
    std::string prefix;
    bool matched = false;
    // A matched Recv: the Send it copies from (only this direction, so no
    // reference cycle keeps the pair alive).
    std::shared_ptr<Op> partner;
    bool copying = false;  // a matched Recv whose data the worker is copying
    bool decided = false;  // result is final; the owner's worker reports it
    absl::Status result;
  };
  using OpPtr = std::shared_ptr<Op>;
  // (sender, receiver, tag)
  using Key = std::tuple<int, int, uint64_t>;
  struct RankState {
    std::list<OpPtr> open;  // posted, not yet reported
    std::condition_variable cv;
    bool stop = false;
    bool gone = false;
    bool left = false;
    std::string reason;  // why it is gone or left
  };

  static Key KeyOf(const Op& op);
  void Match(const OpPtr& send, const OpPtr& recv);
  void Decide(const OpPtr& op, absl::Status result);
  // Removes an unmatched op from its queue.
  void Unqueue(const OpPtr& op);
  // Fails the unmatched ops for which `fail(op)` returns an error.
  void FailQueued(const std::function<absl::Status(const Op&)>& fail);
  absl::Status PeerGoneError(const Op& op) const;
  absl::Status TimeoutError(const Op& op) const;

  const absl::Duration timeout_;
  std::mutex mu_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::map<Key, std::deque<OpPtr>> sends_;
  std::map<Key, std::deque<OpPtr>> recvs_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_ENGINE_SRC_COMM_LOCAL_MAILBOX_H_
