#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/comm/comm_op.h"
#include "zeroshard/communicator.h"

namespace zeroshard {
namespace internal {

void CommOpState::Complete(absl::Status result) {
  {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(result);
    done = true;
  }
  cv.notify_all();
}

absl::Status CommOpState::Wait() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [this] { return done; });
  return status;
}

bool CommOpState::Ready() {
  std::lock_guard<std::mutex> lock(mu);
  return done;
}

// A handle that has already failed with `status`.
CommHandle FailedHandle(absl::Status status) {
  auto state = std::make_shared<CommOpState>();
  state->Complete(std::move(status));
  return CommHandle(std::move(state));
}

CollectiveDescriptor ToDescriptor(const CollectiveArgs& args, uint64_t instance) {
  return CollectiveDescriptor{static_cast<int64_t>(args.kind),
                              args.count,
                              static_cast<int64_t>(args.dtype),
                              args.root,
                              static_cast<int64_t>(args.seq),
                              static_cast<int64_t>(instance),
                              args.tag};
}

CollectiveArgs FromDescriptor(const CollectiveDescriptor& d) {
  CollectiveArgs args;
  args.kind = static_cast<CollectiveKind>(d.kind);
  args.count = d.count;
  args.dtype = static_cast<DType>(d.dtype);
  args.root = static_cast<int>(d.root);
  args.seq = static_cast<uint64_t>(d.seq);
  args.tag = d.tag;
  return args;
}

const char* CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "AllReduce";
    case CollectiveKind::kReduceScatter:
      return "ReduceScatter";
    case CollectiveKind::kAllGather:
      return "AllGather";
    case CollectiveKind::kBroadcast:
      return "Broadcast";
    case CollectiveKind::kBarrier:
      return "Barrier";
  }
  return "?";
}

std::string DescribeCollective(const CollectiveArgs& args) {
  const std::string tag = args.tag != 0 ? absl::StrFormat(", tag %d", args.tag) : "";
  switch (args.kind) {
    case CollectiveKind::kBarrier:
      return absl::StrFormat("Barrier #%d", args.seq);
    case CollectiveKind::kBroadcast:
      return absl::StrFormat("Broadcast #%d (count %d, %s, root %d%s)", args.seq, args.count,
                             DTypeName(args.dtype), args.root, tag);
    default:
      return absl::StrFormat("%s #%d (count %d, %s%s)", CollectiveName(args.kind), args.seq,
                             args.count, DTypeName(args.dtype), tag);
  }
}

std::string DescribeMismatch(const CollectiveArgs& mine, const CollectiveArgs& theirs) {
  if (mine.kind != theirs.kind) {
    return absl::StrFormat("collective kind %s vs %s", CollectiveName(mine.kind),
                           CollectiveName(theirs.kind));
  }
  if (mine.kind == CollectiveKind::kBarrier) return "";
  if (mine.count != theirs.count) {
    return absl::StrFormat("count %d vs %d", mine.count, theirs.count);
  }
  if (mine.dtype != theirs.dtype) {
    return absl::StrFormat("dtype %s vs %s", DTypeName(mine.dtype), DTypeName(theirs.dtype));
  }
  if (mine.kind == CollectiveKind::kBroadcast && mine.root != theirs.root) {
    return absl::StrFormat("root %d vs %d", mine.root, theirs.root);
  }
  if (mine.tag != theirs.tag) {
    return absl::StrFormat("tag %d vs %d: the ranks move different data", mine.tag, theirs.tag);
  }
  return "";
}

std::string DescribePointToPoint(const PointToPointArgs& args) {
  const std::string tag = args.tag != 0 ? absl::StrFormat(", tag %d", args.tag) : "";
  return absl::StrFormat("%s #%d %s rank %d (count %d, %s%s)", args.is_send ? "Send" : "Recv",
                         args.index, args.is_send ? "to" : "from", args.peer, args.count,
                         DTypeName(args.dtype), tag);
}

std::string DescribePointToPointMismatch(const PointToPointArgs& mine,
                                         const PointToPointArgs& theirs) {
  if (mine.count != theirs.count) {
    return absl::StrFormat("count %d vs %d", mine.count, theirs.count);
  }
  if (mine.dtype != theirs.dtype) {
    return absl::StrFormat("dtype %s vs %s", DTypeName(mine.dtype), DTypeName(theirs.dtype));
  }
  return "";
}

}  // namespace internal

CommHandle::CommHandle(std::shared_ptr<internal::CommOpState> state) : state_(std::move(state)) {}

// Dropping a handle does not cancel the collective: the progress thread keeps
// the state alive and completes it; only the result is discarded.
CommHandle::~CommHandle() = default;

absl::Status CommHandle::Wait() {
  if (state_ == nullptr) return waited_status_;
  waited_status_ = state_->Wait();
  state_.reset();
  return waited_status_;
}

bool CommHandle::Ready() const { return state_ == nullptr || state_->Ready(); }

CommHandle Communicator::AllReduceAfter(std::shared_ptr<Event> ready, const void* send, void* recv,
                                        int64_t count, DType dtype, uint64_t tag) {
  if (ready != nullptr) {
    absl::Status waited = ready->Synchronize();
    if (!waited.ok()) return internal::FailedHandle(std::move(waited));
  }
  return AllReduce(send, recv, count, dtype, tag);
}

CommHandle Communicator::ReduceScatterAfter(std::shared_ptr<Event> ready, const void* send,
                                            void* recv, int64_t recv_count, DType dtype,
                                            uint64_t tag) {
  if (ready != nullptr) {
    absl::Status waited = ready->Synchronize();
    if (!waited.ok()) return internal::FailedHandle(std::move(waited));
  }
  return ReduceScatter(send, recv, recv_count, dtype, tag);
}

CommHandle Communicator::Send(const void* buf, int64_t count, DType dtype, int peer, uint64_t tag) {
  return internal::FailedHandle(absl::UnimplementedError(
      "Communicator::Send: the '" + backend() + "' backend has no point-to-point transfers"));
}

CommHandle Communicator::Recv(void* buf, int64_t count, DType dtype, int peer, uint64_t tag) {
  return internal::FailedHandle(absl::UnimplementedError(
      "Communicator::Recv: the '" + backend() + "' backend has no point-to-point transfers"));
}

std::vector<int> NodeLayout::RanksOn(int node) const {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(node_of_rank.size()); ++r) {
    if (node_of_rank[r] == node) ranks.push_back(r);
  }
  return ranks;
}

int NodeLayout::max_ranks_per_node() const {
  int most = 0;
  for (int n = 0; n < num_nodes(); ++n) most = std::max(most, static_cast<int>(RanksOn(n).size()));
  return most;
}

std::string NodeLayout::Describe() const {
  int fewest = std::numeric_limits<int>::max();
  const int most = max_ranks_per_node();
  for (int n = 0; n < num_nodes(); ++n)
    fewest = std::min(fewest, static_cast<int>(RanksOn(n).size()));
  const int nodes = num_nodes();
  std::string out = fewest == most
                        ? absl::StrFormat("%d node%s x %d rank%s", nodes, nodes == 1 ? "" : "s",
                                          most, most == 1 ? "" : "s")
                        : absl::StrFormat("%d nodes, %d-%d ranks each", nodes, fewest, most);
  absl::StrAppend(&out, " (", source, "):");
  for (int n = 0; n < nodes; ++n) {
    // Runs of consecutive ranks as "a-b".
    const std::vector<int> ranks = RanksOn(n);
    std::vector<std::string> runs;
    for (size_t i = 0; i < ranks.size();) {
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      runs.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
      i = j + 1;
    }
    absl::StrAppend(&out, n == 0 ? " " : "; ", node_names[n], " rank",
                    ranks.size() == 1 ? " " : "s ", absl::StrJoin(runs, ","));
  }
  return out;
}

NodeLayout Communicator::node_layout() const {
  NodeLayout layout;
  layout.node_of_rank.assign(size(), 0);
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "?");
  layout.node_names = {host};
  layout.source = backend() == "local"
                      ? "in-process ranks: one node"
                      : "assumed one node: the " + backend() + " backend does not report nodes";
  return layout;
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int color, int key) {
  return absl::UnimplementedError("Communicator::Split: the '" + backend() +
                                  "' backend cannot split into sub-groups");
}

}  // namespace zeroshard
