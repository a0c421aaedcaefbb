#include "engine/src/comm/mpi_point_to_point.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/src/comm/mpi_heartbeat.h"
#include "engine/src/comm/mpi_runtime.h"

namespace zeroshard::internal {
namespace {

// MPI tags on the point-to-point communicator: the headers of Sends, of
// Recvs, then the data (one tag per message a rank sends a peer, cycling).
constexpr int kSendHeaderTag = 0;
constexpr int kRecvHeaderTag = 1;
constexpr int kFirstDataTag = 2;
constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;
// As for the collectives (mpi_communicator.cc).
constexpr absl::Duration kLivenessInterval = absl::Milliseconds(20);

}  // namespace

MpiPointToPoint::MpiPointToPoint(MPI_Comm comm, int rank, std::vector<ProcessIdentity> processes,
                                 absl::Duration timeout, std::string prefix,
                                 std::function<void(CommOpState&, absl::Status)> finish,
                                 std::function<void(int, int64_t)> count_sent)
    : comm_(comm),
      rank_(rank),
      size_(static_cast<int>(processes.size())),
      processes_(std::move(processes)),
      timeout_(timeout),
      prefix_(std::move(prefix)),
      heartbeat_limit_(HeartbeatLimit(timeout)),
      finish_(std::move(finish)),
      count_sent_(std::move(count_sent)) {
  int64_t tag_space = 32768;
  void* tag_ub = nullptr;
  int found = 0;
  MpiCallLock lock;
  if (MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found) == MPI_SUCCESS && found) {
    tag_space = static_cast<int64_t>(*static_cast<int*>(tag_ub)) + 1;
  }
  data_tags_ = tag_space - kFirstDataTag;
}

MpiPointToPoint::~MpiPointToPoint() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (OpPtr& op : inbox_) {
    op->state->Complete(absl::CancelledError(
        absl::StrFormat("%s: %s never started: the communicator was destroyed first", prefix_,
                        DescribePointToPoint(op->args))));
  }
  // As MpiCommunicator's destructor: after requests were given up on, a
  // late message may still arrive, so the context id stays taken.
  if (requests_abandoned_) return;
  MpiCallLock lock;
  MPI_Comm comm = comm_;
  MPI_Comm_free(&comm);
}

void MpiPointToPoint::Post(const PointToPointArgs& args, std::shared_ptr<CommOpState> state) {
  auto op = std::make_shared<Op>();
  op->args = args;
  op->state = std::move(state);
  op->deadline = absl::Now() + timeout_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(op));
    if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { Run(); });
  }
  cv_.notify_all();
}

std::string MpiPointToPoint::DescribeRank(int peer) const {
  return DescribePeer(peer, processes_[peer]);
}

absl::Status MpiPointToPoint::Check(int rc, const char* call, const Op* op) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  return MpiError(
      op != nullptr ? absl::StrCat(prefix_, ": ", DescribePointToPoint(op->args)) : prefix_, call,
      rc);
}

void MpiPointToPoint::Run() {
  // One header receive per peer and kind stays posted while the thread runs.
  header_in_.assign(2 * size_, Header{});
  header_requests_.assign(2 * size_, MPI_REQUEST_NULL);
  unmatched_headers_.assign(2 * size_, {});
  unmatched_ops_.assign(2 * size_, {});
  sends_to_.assign(size_, 0);
  {
    MpiCallLock lock;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      for (int kind = 0; kind < 2; ++kind) {
        MPI_Irecv(&header_in_[2 * p + kind], sizeof(Header), MPI_BYTE, p,
                  kind == 0 ? kSendHeaderTag : kRecvHeaderTag, comm_,
                  &header_requests_[2 * p + kind]);
      }
    }
  }
  next_liveness_check_ = absl::Now() + kLivenessInterval;
  int idle_polls = 0;
  while (true) {
    std::vector<OpPtr> started;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (ops_.empty() && retired_.empty()) {
        cv_.wait(lock, [this] { return stop_ || !inbox_.empty(); });
      }
      if (stop_) break;
      started.swap(inbox_);
    }
    for (const OpPtr& op : started) Start(op);
    const bool progressed = Poll();
    CheckDeadlinesAndPeers();
    if (progressed || !started.empty()) {
      idle_polls = 0;
    } else if (++idle_polls < 2000) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Destroyed: fail what is left, cancel the header receives.
  while (!ops_.empty()) {
    Fail(ops_.front(),
         absl::CancelledError(absl::StrFormat(
             "%s: %s failed: the communicator was destroyed while it waited for rank %d", prefix_,
             DescribePointToPoint(ops_.front()->args), ops_.front()->args.peer)));
  }
  Op headers;  // receives: cancelled
  headers.data = header_requests_;
  Abandon(headers);
  if (in_limbo_) {
    // MPI may still write into them: keep them for the life of the process.
    static auto* graveyard = new std::vector<std::vector<Header>>();
    static auto* op_graveyard = new std::list<OpPtr>();
    std::lock_guard<std::mutex> lock(MpiInitMutex());
    graveyard->push_back(std::move(header_in_));
    op_graveyard->splice(op_graveyard->end(), retired_);
  }
}

void MpiPointToPoint::Start(const OpPtr& op) {
  const PointToPointArgs& args = op->args;
  const int peer = args.peer;
  op->mine.count = args.count;
  op->mine.dtype = static_cast<int64_t>(args.dtype);
  op->mine.index = static_cast<int64_t>(args.index);
  op->mine.tag = args.tag;
  if (args.is_send) op->mine.data_tag = kFirstDataTag + sends_to_[peer]++ % data_tags_;
  ops_.push_back(op);
  int rc;
  {
    MpiCallLock lock;
    rc = MPI_Isend(&op->mine, sizeof(Header), MPI_BYTE, peer,
                   args.is_send ? kSendHeaderTag : kRecvHeaderTag, comm_, &op->header_request);
  }
  if (rc == MPI_SUCCESS && count_sent_) count_sent_(peer, sizeof(Header));
  if (rc != MPI_SUCCESS) {
    Fail(op, Check(rc, "MPI_Isend(header)", op.get()));
    return;
  }
  // A Send meets the peer's Recv headers, a Recv the peer's Send headers.
  std::deque<Header>& waiting = unmatched_headers_[2 * peer + (args.is_send ? 1 : 0)];
  for (auto it = waiting.begin(); it != waiting.end(); ++it) {
    if (it->tag == args.tag) {
      const Header theirs = *it;
      waiting.erase(it);
      Match(op, theirs);
      return;
    }
  }
  unmatched_ops_[2 * peer + (args.is_send ? 0 : 1)].push_back(op);
}

void MpiPointToPoint::OnHeader(int peer, bool from_send, const Header& header) {
  std::deque<OpPtr>& mine = unmatched_ops_[2 * peer + (from_send ? 1 : 0)];
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    if ((*it)->args.tag == header.tag) {
      const OpPtr op = *it;
      mine.erase(it);
      Match(op, header);
      return;
    }
  }
  unmatched_headers_[2 * peer + (from_send ? 0 : 1)].push_back(header);
}

void MpiPointToPoint::Match(const OpPtr& op, const Header& theirs) {
  op->matched = true;
  PointToPointArgs other;
  other.is_send = !op->args.is_send;
  other.count = theirs.count;
  other.dtype = static_cast<DType>(theirs.dtype);
  other.peer = rank_;
  other.tag = theirs.tag;
  other.index = static_cast<uint64_t>(theirs.index);
  const std::string diff = DescribePointToPointMismatch(op->args, other);
  if (!diff.empty()) {
    Fail(op, absl::FailedPreconditionError(absl::StrFormat(
                 "%s: %s does not match rank %d's %s (%s); the k-th Send from one rank to another "
                 "with a tag must meet the k-th Recv of the same count and dtype",
                 prefix_, DescribePointToPoint(op->args), op->args.peer,
                 DescribePointToPoint(other), diff)));
    return;
  }
  const int data_tag = static_cast<int>(op->args.is_send ? op->mine.data_tag : theirs.data_tag);
  const int64_t bytes = op->args.count * static_cast<int64_t>(DTypeSize(op->args.dtype));
  char* data = op->args.is_send ? const_cast<char*>(static_cast<const char*>(op->args.send))
                                : static_cast<char*>(op->args.recv);
  // MPI counts are int: larger messages go as several with the same tag,
  // which MPI delivers in order.
  for (int64_t done = 0; done < bytes; done += kMaxMessageBytes) {
    const int n = static_cast<int>(std::min(bytes - done, kMaxMessageBytes));
    MPI_Request request;
    int rc;
    {
      MpiCallLock lock;
      rc = op->args.is_send
               ? MPI_Isend(data + done, n, MPI_BYTE, op->args.peer, data_tag, comm_, &request)
               : MPI_Irecv(data + done, n, MPI_BYTE, op->args.peer, data_tag, comm_, &request);
    }
    if (rc == MPI_SUCCESS && op->args.is_send && count_sent_) count_sent_(op->args.peer, n);
    if (rc != MPI_SUCCESS) {
      Fail(op, Check(rc, op->args.is_send ? "MPI_Isend" : "MPI_Irecv", op.get()));
      return;
    }
    op->data.push_back(request);
  }
}

bool MpiPointToPoint::Poll() {
  bool progressed = false;
  for (int i = 0; i < 2 * size_; ++i) {
    if (header_requests_[i] == MPI_REQUEST_NULL) continue;
    int done = 0;
    int rc;
    Header header;
    {
      MpiCallLock lock;
      rc = MPI_Test(&header_requests_[i], &done, MPI_STATUS_IGNORE);
      if (rc == MPI_SUCCESS && done) {
        header = header_in_[i];
        rc = MPI_Irecv(&header_in_[i], sizeof(Header), MPI_BYTE, i / 2,
                       i % 2 == 0 ? kSendHeaderTag : kRecvHeaderTag, comm_, &header_requests_[i]);
      }
    }
    if (rc != MPI_SUCCESS) {
      // The header channel of this peer is broken: fail its operations.
      const absl::Status error = Check(rc, "MPI_Test/MPI_Irecv(header)", nullptr);
      for (auto it = ops_.begin(); it != ops_.end();) {
        const OpPtr op = *it++;
        if (op->args.peer == i / 2) Fail(op, error);
      }
      header_requests_[i] = MPI_REQUEST_NULL;
      continue;
    }
    if (done) {
      progressed = true;
      OnHeader(i / 2, i % 2 == 0, header);
    }
  }
  for (auto it = ops_.begin(); it != ops_.end();) {
    const OpPtr op = *it++;
    if (!op->matched) continue;
    int done = 0;
    int rc;
    {
      MpiCallLock lock;
      rc = MPI_Testall(static_cast<int>(op->data.size()), op->data.data(), &done,
                       MPI_STATUSES_IGNORE);
      if (rc == MPI_SUCCESS && done && op->header_request != MPI_REQUEST_NULL) {
        rc = MPI_Test(&op->header_request, &done, MPI_STATUS_IGNORE);
      }
    }
    if (rc != MPI_SUCCESS) {
      Fail(op, Check(rc, "MPI_Testall", op.get()));
    } else if (done) {
      progressed = true;
      ops_.remove(op);
      finish_(*op->state, absl::OkStatus());
    }
  }
  for (auto it = retired_.begin(); it != retired_.end();) {
    int done = 0;
    {
      MpiCallLock lock;
      MPI_Test(&(*it)->header_request, &done, MPI_STATUS_IGNORE);
    }
    it = done ? retired_.erase(it) : std::next(it);
  }
  return progressed;
}

void MpiPointToPoint::CheckDeadlinesAndPeers() {
  const absl::Time now = absl::Now();
  if (now >= next_liveness_check_) {
    // A peer on this machine whose process is gone will never answer: fail
    // now, naming it, rather than at the deadline.
    next_liveness_check_ = now + kLivenessInterval;
    std::set<int> peers;
    for (const OpPtr& op : ops_) peers.insert(op->args.peer);
    for (int peer : peers) {
      std::string why;
      if (ProbeProcess(processes_[peer], processes_[rank_]) == ProcessState::kGone) {
        why = absl::StrCat(DescribeRank(peer), " ", DescribeState(ProcessState::kGone));
      } else if (const std::optional<absl::Duration> silence =
                     SilenceOf(processes_[peer].world_rank);
                 silence.has_value() && *silence > heartbeat_limit_) {
        // A peer on another node whose heartbeats stopped (as for the
        // collectives): its node is down or cut off, or it is stopped.
        why = absl::StrFormat(
            "%s has sent no heartbeat for %s (one every %s): its node %s is down or cut off from "
            "this one, or the process is stopped",
            DescribeRank(peer),
            absl::FormatDuration(absl::Trunc(*silence, absl::Milliseconds(100))),
            absl::FormatDuration(kHeartbeatInterval), processes_[peer].host);
      } else {
        continue;
      }
      for (auto it = ops_.begin(); it != ops_.end();) {
        const OpPtr op = *it++;
        if (op->args.peer != peer) continue;
        Fail(op, absl::AbortedError(absl::StrFormat("%s: %s failed: %s; the job cannot continue",
                                                    prefix_, DescribePointToPoint(op->args), why)));
      }
    }
  }
  for (auto it = ops_.begin(); it != ops_.end();) {
    const OpPtr op = *it++;
    if (now < op->deadline) continue;
    const char* other = op->args.is_send ? "Recv" : "Send";
    const std::string why =
        !op->matched       ? absl::StrFormat("that rank never issued the matching %s", other)
        : op->args.is_send ? std::string("it issued the matching Recv but never took the data")
                           : std::string("it issued the matching Send but its data never arrived");
    Fail(op, absl::DeadlineExceededError(absl::StrFormat(
                 "%s: timed out after %s in %s waiting for rank %d; %s: %s %s", prefix_,
                 absl::FormatDuration(timeout_), DescribePointToPoint(op->args), op->args.peer, why,
                 DescribeRank(op->args.peer),
                 DescribeState(ProbeProcess(processes_[op->args.peer], processes_[rank_])))));
  }
}

void MpiPointToPoint::Fail(const OpPtr& op, absl::Status error) {
  ops_.remove(op);
  for (std::deque<OpPtr>& queue : unmatched_ops_) {
    queue.erase(std::remove(queue.begin(), queue.end(), op), queue.end());
  }
  Abandon(*op);
  // The header is small and eager, but MPI may still read it: keep the op
  // until its send completed.
  if (op->header_request != MPI_REQUEST_NULL) retired_.push_back(op);
  finish_(*op->state, std::move(error));
}

void MpiPointToPoint::Abandon(Op& op) {
  requests_abandoned_ = true;
  MpiCallLock lock;
  const bool is_recv = !op.args.is_send;
  if (AbandonRequests(op.data, [&](size_t) { return is_recv; })) in_limbo_ = true;
}

}  // namespace zeroshard::internal
