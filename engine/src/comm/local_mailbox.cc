#include "engine/src/comm/local_mailbox.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace zeroshard::internal {

LocalMailbox::LocalMailbox(int world_size, absl::Duration timeout) : timeout_(timeout) {
  ranks_.reserve(world_size);
  for (int r = 0; r < world_size; ++r) ranks_.push_back(std::make_unique<RankState>());
}

LocalMailbox::Key LocalMailbox::KeyOf(const Op& op) {
  return op.args.is_send ? Key{op.owner, op.args.peer, op.args.tag}
                         : Key{op.args.peer, op.owner, op.args.tag};
}

void LocalMailbox::Decide(const OpPtr& op, absl::Status result) {
  if (op->decided) return;
  op->decided = true;
  op->result = std::move(result);
  ranks_[op->owner]->cv.notify_all();
}

void LocalMailbox::Unqueue(const OpPtr& op) {
  auto& queues = op->args.is_send ? sends_ : recvs_;
  auto it = queues.find(KeyOf(*op));
  if (it == queues.end()) return;
  std::deque<OpPtr>& queue = it->second;
  for (auto q = queue.begin(); q != queue.end(); ++q) {
    if (*q == op) {
      queue.erase(q);
      break;
    }
  }
  if (queue.empty()) queues.erase(it);
}

void LocalMailbox::Match(const OpPtr& send, const OpPtr& recv) {
  const std::string diff = DescribePointToPointMismatch(send->args, recv->args);
  if (!diff.empty()) {
    // Both sides get the same verdict, each in its own words.
    constexpr char kRule[] =
        "the k-th Send from one rank to another with a tag must meet the k-th Recv of the same "
        "count and dtype";
    Decide(send, absl::FailedPreconditionError(
                     absl::StrFormat("%s: %s does not match rank %d's %s (%s); %s", send->prefix,
                                     DescribePointToPoint(send->args), recv->owner,
                                     DescribePointToPoint(recv->args), diff, kRule)));
    Decide(recv,
           absl::FailedPreconditionError(absl::StrFormat(
               "%s: %s does not match rank %d's %s (%s); %s", recv->prefix,
               DescribePointToPoint(recv->args), send->owner, DescribePointToPoint(send->args),
               DescribePointToPointMismatch(recv->args, send->args), kRule)));
    return;
  }
  send->matched = true;
  recv->matched = true;
  recv->partner = send;
  ranks_[recv->owner]->cv.notify_all();  // its worker copies
}

absl::Status LocalMailbox::PeerGoneError(const Op& op) const {
  const RankState& peer = *ranks_[op.args.peer];
  if (peer.gone) {
    return absl::AbortedError(
        absl::StrFormat("%s: %s failed: rank %d left the group (its error: %s)", op.prefix,
                        DescribePointToPoint(op.args), op.args.peer, peer.reason));
  }
  return absl::AbortedError(absl::StrFormat(
      "%s: %s failed: rank %d left the group (%s) without issuing the matching %s", op.prefix,
      DescribePointToPoint(op.args), op.args.peer, peer.reason, op.args.is_send ? "Recv" : "Send"));
}

absl::Status LocalMailbox::TimeoutError(const Op& op) const {
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s: timed out after %s in %s waiting for rank %d; that rank never issued the matching %s "
      "and is still running: stuck (blocked, deadlocked) or slower than the timeout",
      op.prefix, absl::FormatDuration(timeout_), DescribePointToPoint(op.args), op.args.peer,
      op.args.is_send ? "Recv" : "Send"));
}

void LocalMailbox::Post(int rank, const PointToPointArgs& args, std::shared_ptr<CommOpState> state,
                        absl::Time deadline, const std::string& prefix) {
  auto op = std::make_shared<Op>();
  op->args = args;
  op->owner = rank;
  op->state = std::move(state);
  op->deadline = deadline;
  op->prefix = prefix;
  std::lock_guard<std::mutex> lock(mu_);
  RankState& me = *ranks_[rank];
  me.open.push_back(op);
  me.cv.notify_all();
  if (me.gone) {
    Decide(op, absl::AbortedError(absl::StrFormat("%s: %s failed: this rank already left the "
                                                  "group (%s)",
                                                  prefix, DescribePointToPoint(args), me.reason)));
    return;
  }
  const Key key = KeyOf(*op);
  auto& counterparts = args.is_send ? recvs_ : sends_;
  auto it = counterparts.find(key);
  if (it != counterparts.end()) {
    OpPtr other = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) counterparts.erase(it);
    if (args.is_send) {
      Match(op, other);
    } else {
      Match(other, op);
    }
    return;
  }
  const RankState& peer = *ranks_[args.peer];
  if (peer.gone || peer.left) {
    Decide(op, PeerGoneError(*op));
    return;
  }
  (args.is_send ? sends_ : recvs_)[key].push_back(op);
}

void LocalMailbox::RunWorker(int rank, CollectiveMemory& memory,
                             const std::function<void(CommOpState&, absl::Status)>& finish) {
  std::unique_lock<std::mutex> lock(mu_);
  RankState& me = *ranks_[rank];
  while (!me.stop) {
    std::vector<OpPtr> report;
    std::vector<OpPtr> copy;
    absl::Time next_deadline = absl::InfiniteFuture();
    const absl::Time now = absl::Now();
    for (auto it = me.open.begin(); it != me.open.end();) {
      const OpPtr& op = *it;
      if (!op->decided && !op->matched && now >= op->deadline) {
        Unqueue(op);
        Decide(op, TimeoutError(*op));
      }
      if (op->decided) {
        report.push_back(op);
        it = me.open.erase(it);
        continue;
      }
      if (!op->matched) {
        next_deadline = std::min(next_deadline, op->deadline);
      } else if (!op->args.is_send && !op->copying) {
        op->copying = true;
        copy.push_back(op);
      }
      ++it;
    }
    if (report.empty() && copy.empty()) {
      if (next_deadline == absl::InfiniteFuture()) {
        me.cv.wait(lock);
      } else {
        me.cv.wait_until(lock, absl::ToChronoTime(next_deadline));
      }
      continue;
    }
    lock.unlock();
    for (const OpPtr& recv : copy) {
      // Matched: the sender's buffer stays untouched until its Send is
      // reported, which happens only after this copy.
      const OpPtr& send = recv->partner;
      absl::Status copied;
      const int64_t bytes = recv->args.count * static_cast<int64_t>(DTypeSize(recv->args.dtype));
      if (bytes > 0) copied = memory.Copy(recv->args.recv, send->args.send, bytes);
      const absl::Status finished = memory.Finish();
      if (copied.ok()) copied = finished;
      std::lock_guard<std::mutex> relock(mu_);
      if (copied.ok()) {
        Decide(recv, absl::OkStatus());
        Decide(send, absl::OkStatus());
      } else {
        Decide(recv,
               absl::Status(copied.code(),
                            absl::StrFormat("%s: moving the data of %s failed: %s", recv->prefix,
                                            DescribePointToPoint(recv->args), copied.message())));
        Decide(send, absl::AbortedError(absl::StrFormat(
                         "%s: %s failed: rank %d could not receive it: %s", send->prefix,
                         DescribePointToPoint(send->args), rank, copied.message())));
      }
    }
    for (const OpPtr& op : report) finish(*op->state, op->result);
    lock.lock();
  }
}

void LocalMailbox::Stop(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  ranks_[rank]->stop = true;
  ranks_[rank]->cv.notify_all();
}

void LocalMailbox::FailQueued(const std::function<absl::Status(const Op&)>& fail) {
  for (auto* queues : {&sends_, &recvs_}) {
    for (auto it = queues->begin(); it != queues->end();) {
      std::deque<OpPtr>& queue = it->second;
      for (auto q = queue.begin(); q != queue.end();) {
        absl::Status error = fail(**q);
        if (error.ok()) {
          ++q;
          continue;
        }
        Decide(*q, std::move(error));
        q = queue.erase(q);
      }
      it = queue.empty() ? queues->erase(it) : std::next(it);
    }
  }
}

void LocalMailbox::MarkGone(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  RankState& gone = *ranks_[rank];
  if (gone.gone) return;
  gone.gone = true;
  gone.reason = reason;
  FailQueued([&](const Op& op) {
    if (op.owner == rank) {
      return absl::AbortedError(absl::StrFormat("%s: %s failed: this rank left the group (%s)",
                                                op.prefix, DescribePointToPoint(op.args), reason));
    }
    return op.args.peer == rank ? PeerGoneError(op) : absl::OkStatus();
  });
}

void LocalMailbox::MarkLeft(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  RankState& left = *ranks_[rank];
  if (left.gone || left.left) return;
  left.left = true;
  left.reason = reason;
  FailQueued([&](const Op& op) {
    return op.owner != rank && op.args.peer == rank ? PeerGoneError(op) : absl::OkStatus();
  });
}

void LocalMailbox::Drain(int rank, const std::string& reason) {
  MarkGone(rank, reason);
  std::list<OpPtr> left_over;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RankState& me = *ranks_[rank];
    for (const OpPtr& op : me.open) {
      if (!op->decided && op->matched && !op->args.is_send) {
        Decide(op->partner,
               absl::AbortedError(absl::StrFormat(
                   "%s: %s failed: rank %d's communicator was destroyed before it "
                   "received the data",
                   op->partner->prefix, DescribePointToPoint(op->partner->args), rank)));
      }
      Decide(op, absl::CancelledError(
                     absl::StrFormat("%s: %s failed: the communicator was destroyed first",
                                     op->prefix, DescribePointToPoint(op->args))));
    }
    left_over.swap(me.open);
  }
  for (const OpPtr& op : left_over) op->state->Complete(op->result);
}

}  // namespace zeroshard::internal
