// PeerWatch: what a rank can learn about its peers beside the transport,
// for a backend whose transport cannot say which peer is missing (nccl: a
// collective that does not finish only says "not done").
//
// Two sources: peer processes on this machine, probed through /proc
// (process_probe.h: gone or stopped), and ranks that are threads of this
// process, which mark themselves in a shared table when they fail. Either
// lets a waiting rank fail at once with an error naming the dead rank,
// instead of waiting out the timeout, and lets a timeout say what each peer
// is doing.
#ifndef ZEROSHARD_ENGINE_SRC_COMM_PEER_WATCH_H_
#define ZEROSHARD_ENGINE_SRC_COMM_PEER_WATCH_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/src/comm/process_probe.h"

namespace zeroshard {
namespace internal {

class PeerWatch {
 public:
  // Ranks as threads of one process: rank r's thread calls MarkFailed(r)
  // when its work failed (thread-safe).
  class ThreadTable {
   public:
    explicit ThreadTable(int size) : failed_(size) {}
    void MarkFailed(int rank) { failed_[rank].store(true); }
    bool failed(int rank) const { return failed_[rank].load(); }

   private:
    std::vector<std::atomic<bool>> failed_;
  };

  // How often the processes are probed at most (each probe reads /proc).
  static constexpr absl::Duration kInterval = absl::Milliseconds(20);

  // Nothing known about the peers.
  PeerWatch(int self, int size) : self_(self), size_(size) {}
  // Processes, one per rank (processes[self] is this process).
  PeerWatch(int self, std::vector<ProcessIdentity> processes);
  // Threads of this process sharing `table`.
  PeerWatch(int self, int size, std::shared_ptr<ThreadTable> table);

  // The watch of a sub-group (Communicator::Split): `members` are the ranks
  // here that form it, in its rank order; `self` is this rank's rank there.
  PeerWatch Subset(const std::vector<int>& members, int self) const;

  // Aborted when a peer is known to be gone (its process exited or was
  // killed; its thread failed): "<where>: rank 2 (pid 4242 on node7) died:
  // its process is gone (killed or crashed); the job cannot continue". The
  // processes are probed at most once per kInterval (OK in between).
  absl::Status CheckPeers(const std::string& where);
  // For a timeout: what is known of each peer, "rank 1 (pid 17 on n1) is
  // running; rank 2 (pid 18 on n1) is stopped (...)", or "" when nothing is.
  std::string DescribePeers() const;

 private:
  std::string DescribeRank(int peer) const;
  bool Failed(int peer) const {
    return table_->failed(table_rows_.empty() ? peer : table_rows_[peer]);
  }

  int self_;
  int size_;
  std::vector<ProcessIdentity> processes_;
  std::shared_ptr<ThreadTable> table_;
  // Rank here -> row of table_ (empty: the same number).
  std::vector<int> table_rows_;
  absl::Time next_probe_ = absl::InfinitePast();
};

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_PEER_WATCH_H_
