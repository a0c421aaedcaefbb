#include "engine/src/comm/async_communicator.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/comm/collective_batch.h"
#include "engine/src/comm/reduce.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {

bool Overlap(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a);
  const uintptr_t b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace

AsyncCommunicator::AsyncCommunicator(int rank, int size, CommOptions options)
    : rank_(rank), size_(size), options_(options) {}

AsyncCommunicator::~AsyncCommunicator() {
  // The derived destructor must have called Shutdown(); doing it here would
  // let the thread call a pure virtual on a half-destroyed object.
  if (thread_.joinable()) thread_.join();
}

void AsyncCommunicator::StartProgressThread() {
  thread_ = std::thread([this] { ProgressLoop(); });
}

void AsyncCommunicator::Shutdown() {
  std::deque<PendingOp> never_started;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    never_started.swap(queue_);
  }
  cv_.notify_all();
  for (PendingOp& op : never_started) {
    if (op.state == nullptr) continue;
    op.state->Complete(absl::CancelledError(absl::StrFormat(
        "%s: %s never ran: the communicator was destroyed first", ErrorPrefix(), Describe(op))));
  }
  RequestAbort();
  if (thread_.joinable()) thread_.join();
}

std::string AsyncCommunicator::ErrorPrefix() const {
  return absl::StrFormat("%s comm rank %d%s", backend(), rank_, group_name_);
}

// The issuing entry points: describe the collective, queue it.
CommHandle AsyncCommunicator::AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                                        uint64_t tag) {
  return Issue({CollectiveKind::kAllReduce, send, recv, count, dtype, /*root=*/0, tag});
}

CommHandle AsyncCommunicator::ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                            DType dtype, uint64_t tag) {
  return Issue({CollectiveKind::kReduceScatter, send, recv, recv_count, dtype, /*root=*/0, tag});
}

CommHandle AsyncCommunicator::AllGather(const void* send, void* recv, int64_t send_count,
                                        DType dtype, uint64_t tag) {
  return Issue({CollectiveKind::kAllGather, send, recv, send_count, dtype, /*root=*/0, tag});
}

CommHandle AsyncCommunicator::Broadcast(void* buf, int64_t count, DType dtype, int root,
                                        uint64_t tag) {
  return Issue({CollectiveKind::kBroadcast, buf, buf, count, dtype, root, tag});
}

CommHandle AsyncCommunicator::Barrier() { return Issue({CollectiveKind::kBarrier}); }

CommHandle AsyncCommunicator::AllReduceAfter(std::shared_ptr<Event> ready, const void* send,
                                             void* recv, int64_t count, DType dtype, uint64_t tag) {
  return Issue({CollectiveKind::kAllReduce, send, recv, count, dtype, /*root=*/0, tag},
               std::move(ready));
}

CommHandle AsyncCommunicator::ReduceScatterAfter(std::shared_ptr<Event> ready, const void* send,
                                                 void* recv, int64_t recv_count, DType dtype,
                                                 uint64_t tag) {
  return Issue({CollectiveKind::kReduceScatter, send, recv, recv_count, dtype, /*root=*/0, tag},
               std::move(ready));
}

absl::Duration AsyncCommunicator::busy_time() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

uint64_t AsyncCommunicator::issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_ - 1;
}

uint64_t AsyncCommunicator::batched_collectives() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batched_;
}

absl::Status AsyncCommunicator::CheckArguments(const CollectiveArgs& args) const {
  const std::string where = absl::StrFormat("%s: %s", ErrorPrefix(), DescribeCollective(args));
  if (args.kind == CollectiveKind::kBarrier) return absl::OkStatus();
  if (args.count < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: element count %d is negative", where, args.count));
  }
  const bool is_sum =
      args.kind == CollectiveKind::kAllReduce || args.kind == CollectiveKind::kReduceScatter;
  if (is_sum && !IsSummable(args.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: dtype %s cannot be summed; use fp32, bf16, fp16, fp64 or int64", where,
                        DTypeName(args.dtype)));
  }
  if (args.kind == CollectiveKind::kBroadcast && (args.root < 0 || args.root >= size_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: root %d is out of range; the group has ranks 0..%d", where, args.root, size_ - 1));
  }
  const uint64_t element_bytes = DTypeSize(args.dtype);
  const uint64_t max_count =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / element_bytes / size_;
  if (static_cast<uint64_t>(args.count) > max_count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d elements per rank times %d ranks overflows a byte count", where,
                        args.count, size_));
  }
  if (args.count == 0) return absl::OkStatus();
  if (args.send == nullptr || args.recv == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s buffer is null but count is %d", where,
        args.kind == CollectiveKind::kBroadcast ? "the" : (args.send == nullptr ? "send" : "recv"),
        args.count));
  }
  const uint64_t block = element_bytes * static_cast<uint64_t>(args.count);
  const uint64_t whole = block * static_cast<uint64_t>(size_);
  const char* send = static_cast<const char*>(args.send);
  const char* recv = static_cast<const char*>(args.recv);
  bool bad_overlap = false;
  const char* rule = "";
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
      bad_overlap = send != recv && Overlap(send, block, recv, block);
      rule = "send and recv must be identical (in place) or disjoint";
      break;
    case CollectiveKind::kReduceScatter:
      bad_overlap = recv != send + block * rank_ && Overlap(send, whole, recv, block);
      rule = "recv must be block rank() of send (in place) or disjoint from send";
      break;
    case CollectiveKind::kAllGather:
      bad_overlap = send != recv + block * rank_ && Overlap(send, block, recv, whole);
      rule = "send must be block rank() of recv (in place) or disjoint from recv";
      break;
    default:
      break;
  }
  if (bad_overlap) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: buffers overlap in an unsupported way; %s", where, rule));
  }
  return absl::OkStatus();
}

CommHandle AsyncCommunicator::Issue(CollectiveArgs args, std::shared_ptr<Event> ready) {
  auto state = std::make_shared<CommOpState>();
  absl::Status poisoned;
  absl::Status argument_error;
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    args.seq = next_seq_++;
    poisoned = poison_;
    stopping = stopping_;
    if (poisoned.ok() && !stopping) {
      argument_error = CheckArguments(args);
      if (argument_error.ok()) {
        queue_.push_back(PendingOp{args, absl::OkStatus(), state, std::move(ready)});
      } else {
        // The handle fails now; a marker poisons the communicator once the
        // collectives issued before this one have run.
        queue_.push_back(PendingOp{args, argument_error, nullptr, nullptr});
      }
    }
  }
  if (!poisoned.ok()) {
    state->Complete(
        absl::Status(poisoned.code(),
                     absl::StrFormat("%s: %s not run: an earlier collective failed: %s",
                                     ErrorPrefix(), DescribeCollective(args), poisoned.message())));
  } else if (!argument_error.ok()) {
    state->Complete(argument_error);
  } else if (stopping) {
    state->Complete(absl::FailedPreconditionError(
        absl::StrFormat("%s: %s issued while the communicator is being destroyed", ErrorPrefix(),
                        DescribeCollective(args))));
  } else {
    cv_.notify_one();
  }
  return CommHandle(std::move(state));
}

absl::StatusOr<int> AsyncCommunicator::RunBatch(absl::Span<const CollectiveArgs> ops,
                                                absl::Time deadline) {
  ZS_RETURN_IF_ERROR(RunCollective(ops[0], deadline));
  return 1;
}

void AsyncCommunicator::ProgressLoop() {
  // Reused across iterations: no allocation per collective. Empty between
  // iterations.
  std::vector<PendingOp> ops;
  while (true) {
    // The front of the queue, and with batching the batchable collectives
    // queued behind it (plain collectives that need no device wait and have
    // no argument error; never point-to-point work); what the batch does not
    // take goes back to the front.
    absl::Status poisoned;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // Stopping and drained.
      ops.push_back(std::move(queue_.front()));
      queue_.pop_front();
      poisoned = poison_;
      const int limit = std::min(max_batch(), kMaxBatchOps);
      if (limit > 1 && poisoned.ok() && ops[0].argument_error.ok() && !ops[0].run) {
        std::vector<CollectiveArgs> candidates = {ops[0].args};
        for (size_t i = 0; i < queue_.size() && static_cast<int>(candidates.size()) < limit; ++i) {
          const PendingOp& next = queue_[i];
          if (!next.argument_error.ok() || next.ready != nullptr || next.run) break;
          candidates.push_back(next.args);
        }
        const int take = BatchablePrefix(candidates, size_, limit);
        for (int i = 1; i < take; ++i) {
          ops.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
    }
    PendingOp& op = ops[0];
    absl::Status result;
    int ran = static_cast<int>(ops.size());
    if (!op.argument_error.ok()) {
      result = op.argument_error;
    } else if (!poisoned.ok()) {
      result = absl::Status(poisoned.code(),
                            absl::StrFormat("%s: %s not run: an earlier collective failed: %s",
                                            ErrorPrefix(), Describe(op), poisoned.message()));
    } else {
      // The device work that produces the send buffer first (AllReduceAfter):
      // not part of the collective's run time.
      if (op.ready != nullptr) {
        const absl::Status waited = op.ready->Synchronize();
        if (!waited.ok()) {
          result = absl::Status(
              waited.code(),
              absl::StrFormat("%s: %s not run: the device work it waits for failed: %s",
                              ErrorPrefix(), DescribeCollective(op.args), waited.message()));
        }
      }
      const absl::Time begin = absl::Now();
      if (result.ok()) {
        if (ops.size() == 1) {
          result = op.run ? op.run(begin + options_.timeout)
                          : RunCollective(op.args, begin + options_.timeout);
        } else {
          std::vector<CollectiveArgs> args;
          for (const PendingOp& o : ops) args.push_back(o.args);
          absl::StatusOr<int> n = RunBatch(args, begin + options_.timeout);
          if (n.ok()) {
            ran = std::clamp(*n, 1, static_cast<int>(ops.size()));
          } else {
            result = n.status();
          }
        }
      }
      const absl::Duration took = absl::Now() - begin;
      std::lock_guard<std::mutex> lock(mu_);
      busy_ += took;
      if (result.ok() && ran > 1) batched_ += ran;
    }
    if (result.ok() && ran < static_cast<int>(ops.size())) {
      // Offered but not in the batch: back to the front, in order (or, when
      // the communicator is being destroyed, failed as never run).
      std::vector<PendingOp> unrun;
      for (size_t i = ran; i < ops.size(); ++i) unrun.push_back(std::move(ops[i]));
      ops.resize(ran);
      bool stopping = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopping = stopping_;
        if (!stopping) {
          for (auto it = unrun.rbegin(); it != unrun.rend(); ++it) {
            queue_.push_front(std::move(*it));
          }
        }
      }
      if (stopping) {
        for (PendingOp& o : unrun) {
          o.state->Complete(absl::CancelledError(
              absl::StrFormat("%s: %s never ran: the communicator was destroyed first",
                              ErrorPrefix(), DescribeCollective(o.args))));
        }
      }
    }
    if (!result.ok() && poisoned.ok()) Poison(result);
    for (PendingOp& o : ops) {
      if (o.state != nullptr) o.state->Complete(result);
    }
    // Release the finished operations now (their events and callbacks may
    // refer to a device the caller frees once the handle completes); the
    // vector keeps its capacity.
    ops.clear();
  }
}

void AsyncCommunicator::Poison(const absl::Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!poison_.ok()) return;
    poison_ = error;
  }
  OnPoisoned(error);
}

absl::Status AsyncCommunicator::poison() const {
  std::lock_guard<std::mutex> lock(mu_);
  return poison_;
}

CommHandle AsyncCommunicator::Send(const void* buf, int64_t count, DType dtype, int peer,
                                   uint64_t tag) {
  PointToPointArgs args;
  args.is_send = true;
  args.send = buf;
  args.count = count;
  args.dtype = dtype;
  args.peer = peer;
  args.tag = tag;
  return IssuePointToPoint(args);
}

CommHandle AsyncCommunicator::Recv(void* buf, int64_t count, DType dtype, int peer, uint64_t tag) {
  PointToPointArgs args;
  args.recv = buf;
  args.count = count;
  args.dtype = dtype;
  args.peer = peer;
  args.tag = tag;
  return IssuePointToPoint(args);
}

absl::Status AsyncCommunicator::CheckPointToPointArguments(const PointToPointArgs& args) const {
  const std::string where = absl::StrFormat("%s: %s", ErrorPrefix(), DescribePointToPoint(args));
  if (args.peer == rank_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the peer is this rank; a rank cannot send to or receive from itself", where));
  }
  if (args.peer < 0 || args.peer >= size_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: peer %d is out of range; the group has ranks 0..%d", where, args.peer, size_ - 1));
  }
  if (args.count < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: element count %d is negative", where, args.count));
  }
  const uint64_t max_count =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / DTypeSize(args.dtype);
  if (static_cast<uint64_t>(args.count) > max_count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d elements overflow a byte count", where, args.count));
  }
  const void* buffer = args.is_send ? args.send : args.recv;
  if (args.count > 0 && buffer == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the buffer is null but count is %d", where, args.count));
  }
  return absl::OkStatus();
}

CommHandle AsyncCommunicator::IssuePointToPoint(PointToPointArgs args) {
  auto state = std::make_shared<CommOpState>();
  absl::Status poisoned;
  absl::Status argument_error;
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    args.index = next_point_to_point_++;
    poisoned = poison_;
    stopping = stopping_;
    if (poisoned.ok() && !stopping) {
      argument_error = CheckPointToPointArguments(args);
      // Like a collective's bad arguments: a marker poisons the
      // communicator on the progress thread once the collectives issued
      // before have run (OnPoisoned may need that thread).
      if (!argument_error.ok()) queue_.push_back(PendingOp{{}, argument_error, nullptr, nullptr});
    }
  }
  if (!poisoned.ok()) {
    state->Complete(absl::Status(
        poisoned.code(),
        absl::StrFormat("%s: %s not run: an earlier operation failed: %s", ErrorPrefix(),
                        DescribePointToPoint(args), poisoned.message())));
  } else if (stopping) {
    state->Complete(absl::FailedPreconditionError(
        absl::StrFormat("%s: %s issued while the communicator is being destroyed", ErrorPrefix(),
                        DescribePointToPoint(args))));
  } else if (!argument_error.ok()) {
    cv_.notify_one();
    state->Complete(argument_error);
  } else {
    StartPointToPoint(args, state);
  }
  return CommHandle(std::move(state));
}

void AsyncCommunicator::StartPointToPoint(const PointToPointArgs& args,
                                          std::shared_ptr<CommOpState> state) {
  state->Complete(absl::UnimplementedError(
      absl::StrFormat("%s: %s: the '%s' backend has no point-to-point transfers", ErrorPrefix(),
                      DescribePointToPoint(args), backend())));
}

void AsyncCommunicator::FinishPointToPoint(CommOpState& state, absl::Status result) {
  if (!result.ok()) Poison(result);
  state.Complete(std::move(result));
}

void AsyncCommunicator::IssueOnProgressThread(
    std::shared_ptr<CommOpState> state, std::string what,
    std::function<absl::Status(absl::Time deadline)> run) {
  absl::Status poisoned;
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    poisoned = poison_;
    stopping = stopping_;
    if (poisoned.ok() && !stopping) {
      PendingOp op;
      op.state = state;
      op.run = std::move(run);
      op.what = what;
      queue_.push_back(std::move(op));
    }
  }
  if (!poisoned.ok()) {
    state->Complete(absl::Status(poisoned.code(),
                                 absl::StrFormat("%s: %s not run: an earlier operation failed: %s",
                                                 ErrorPrefix(), what, poisoned.message())));
  } else if (stopping) {
    state->Complete(absl::FailedPreconditionError(absl::StrFormat(
        "%s: %s issued while the communicator is being destroyed", ErrorPrefix(), what)));
  } else {
    cv_.notify_one();
  }
}

// The tag of the agreement collective, so that a rank that issued another
// AllGather instead fails with a mismatch rather than mixing the data.
constexpr uint64_t kSplitAgreementTag = 0x53706c6974ull;  // "Split"

absl::StatusOr<std::vector<int>> AsyncCommunicator::AgreeOnSplit(int color, int key) {
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(size_));
  const absl::Status agreed =
      AllGather(mine, all.data(), 2, DType::kInt64, kSplitAgreementTag).Wait();
  if (!agreed.ok()) {
    return absl::Status(agreed.code(), absl::StrFormat("Split(color %d, key %d): %s", color, key,
                                                       agreed.message()));
  }
  std::vector<int> members;
  if (color < 0) return members;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  return members;
}

}  // namespace internal
}  // namespace zeroshard
