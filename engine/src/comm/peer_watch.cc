#include "engine/src/comm/peer_watch.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace zeroshard {
namespace internal {

PeerWatch::PeerWatch(int self, std::vector<ProcessIdentity> processes)
    : self_(self), size_(static_cast<int>(processes.size())), processes_(std::move(processes)) {}

PeerWatch::PeerWatch(int self, int size, std::shared_ptr<ThreadTable> table)
    : self_(self), size_(size), table_(std::move(table)) {}

PeerWatch PeerWatch::Subset(const std::vector<int>& members, int self) const {
  PeerWatch sub(self, static_cast<int>(members.size()));
  for (int member : members) {
    if (!processes_.empty()) sub.processes_.push_back(processes_[member]);
    if (table_ != nullptr) {
      sub.table_rows_.push_back(table_rows_.empty() ? member : table_rows_[member]);
    }
  }
  sub.table_ = table_;
  return sub;
}

std::string PeerWatch::DescribeRank(int peer) const {
  if (processes_.empty()) return absl::StrFormat("rank %d", peer);
  return DescribePeer(peer, processes_[peer]);
}

absl::Status PeerWatch::CheckPeers(const std::string& where) {
  if (table_ != nullptr) {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != self_ && Failed(peer)) {
        return absl::AbortedError(absl::StrFormat(
            "%s: rank %d left the group: its work failed (see its error); the collective cannot "
            "complete",
            where, peer));
      }
    }
  }
  if (processes_.empty()) return absl::OkStatus();
  const absl::Time now = absl::Now();
  if (now < next_probe_) return absl::OkStatus();
  next_probe_ = now + kInterval;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == self_) continue;
    if (ProbeProcess(processes_[peer], processes_[self_]) == ProcessState::kGone) {
      return absl::AbortedError(absl::StrFormat("%s: %s %s; the job cannot continue", where,
                                                DescribeRank(peer),
                                                DescribeState(ProcessState::kGone)));
    }
  }
  return absl::OkStatus();
}

std::string PeerWatch::DescribePeers() const {
  std::vector<std::string> known;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == self_) continue;
    if (table_ != nullptr) {
      known.push_back(absl::StrFormat("rank %d %s", peer,
                                      Failed(peer) ? "failed"
                                                   : "is a thread of this "
                                                     "process, still running"));
    } else if (!processes_.empty()) {
      known.push_back(
          absl::StrFormat("%s %s", DescribeRank(peer),
                          DescribeState(ProbeProcess(processes_[peer], processes_[self_]))));
    }
  }
  return absl::StrJoin(known, "; ");
}

}  // namespace internal
}  // namespace zeroshard
