// The `local` backend: N ranks as N threads of one process. The ranks of a
// group share a LocalHub; for every collective each rank posts its buffer
// pointers, and once all have posted, each rank computes its own part of the
// result by reading its peers' buffers directly. No data is staged. Sends and
// receives go through a LocalMailbox of the group (local_mailbox.h), served
// by a second thread per rank that starts with the rank's first Send or Recv.
// Split makes fresh groups (hub and mailbox) of the same kind.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/src/comm/async_communicator.h"
#include "engine/src/comm/collective_memory.h"
#include "engine/src/comm/comm_op.h"
#include "engine/src/comm/local_mailbox.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {

// Shared state of one local group. Protocol for the collective with sequence
// number s on rank r:
//   1. post: slot r holds r's CollectiveArgs for s.
//   2. commit: wait until every rank posted s. The first rank that sees all
//      posts, all matching and nobody gone marks s committed; from then on the
//      collective runs to completion on every rank (a rank never abandons a
//      committed collective, since peers may be reading its buffers).
//      Before commit, a timeout, a mismatch, a departed peer or destruction
//      fails the collective, and the failing rank marks itself gone under the
//      same lock so that nobody can commit with it afterwards.
//   3. compute: rank r reads its peers' posted buffers and writes its part.
//   4. done: wait until every rank finished step 3 of s (peers read our
//      buffers and write our recv). This wait needs no deadline: every rank
//      is past commit and only copies memory.
// A rank cannot post s+1 before all ranks are done with s, so one slot per
// rank is enough.
//
// A rank leaves in one of two ways: gone (it failed, or its communicator was
// destroyed), which fails every uncommitted collective at once; or left
// after collective n (its function returned normally), which lets the
// collectives it issued complete and fails only those after n. Either way
// its peers never wait out the timeout for it.
class LocalHub {
 public:
  explicit LocalHub(int world_size) : slots_(world_size) {}

  absl::Status Run(int rank, const CollectiveArgs& args, absl::Time deadline,
                   absl::Duration timeout, const std::string& prefix, CollectiveMemory& memory) {
    const uint64_t seq = args.seq;
    const int world = static_cast<int>(slots_.size());
    std::unique_lock<std::mutex> lock(mu_);
    slots_[rank].posted = args;
    cv_.notify_all();
    const auto chrono_deadline = absl::ToChronoTime(deadline);
    while (committed_seq_ < seq) {
      absl::Status failure = CheckBeforeCommit(rank, args, timeout, prefix);
      if (failure.ok() && committed_seq_ < seq && absl::Now() >= deadline) {
        failure = TimeoutError(rank, args, timeout, prefix);
      }
      if (!failure.ok()) {
        MarkGoneLocked(rank, std::string(failure.message()));
        return failure;
      }
      if (committed_seq_ >= seq) break;
      cv_.wait_until(lock, chrono_deadline);
    }
    // Step 3: the posted slots of seq stay untouched until everyone is done.
    std::vector<CollectiveArgs> posts(world);
    for (int p = 0; p < world; ++p) posts[p] = slots_[p].posted;
    lock.unlock();
    absl::Status computed = Compute(rank, posts, memory);
    // Always drain this rank's queued copies and sums, even after a failure:
    // once it reports done, its peers may reuse the buffers they read.
    const absl::Status finished = memory.Finish();
    if (computed.ok()) computed = finished;
    lock.lock();
    // Done even after a failure, so that the peers do not wait for this
    // rank's part; it is marked gone, and its error poisons it.
    slots_[rank].done_seq = seq;
    if (!computed.ok()) {
      computed = absl::Status(computed.code(),
                              absl::StrFormat("%s: moving the data of %s failed: %s", prefix,
                                              DescribeCollective(args), computed.message()));
      MarkGoneLocked(rank, std::string(computed.message()));
    }
    cv_.notify_all();
    cv_.wait(lock, [&] {
      return std::all_of(slots_.begin(), slots_.end(),
                         [&](const Slot& slot) { return slot.done_seq >= seq; });
    });
    return computed;
  }

  // Marks `rank` as gone: collectives not yet committed fail at once on
  // every rank instead of waiting out their timeout.
  void MarkGone(int rank, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    MarkGoneLocked(rank, reason);
  }

  // `rank` will issue nothing after its collective `last_seq`: later
  // collectives of its peers fail at once.
  void MarkLeft(int rank, uint64_t last_seq, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& slot = slots_[rank];
    if (slot.gone || slot.left) return;
    slot.left = true;
    slot.left_after_seq = last_seq;
    slot.gone_reason = reason;
    cv_.notify_all();
  }

  // The group made by the split with number `split` (every rank numbers its
  // Split calls alike) for `color`: the first member to ask makes it (of
  // `size` ranks), the others get the same; forgotten once all `size` took it.
  struct SplitGroup {
    std::shared_ptr<LocalHub> hub;
    std::shared_ptr<LocalMailbox> mailbox;
  };
  SplitGroup TakeSplitGroup(uint64_t split, int color, int size, absl::Duration timeout) {
    std::lock_guard<std::mutex> lock(mu_);
    PendingSplit& pending = splits_[{split, color}];
    if (pending.group.hub == nullptr) {
      pending.group.hub = std::make_shared<LocalHub>(size);
      pending.group.mailbox = std::make_shared<LocalMailbox>(size, timeout);
    }
    SplitGroup group = pending.group;
    if (++pending.taken == size) splits_.erase({split, color});
    return group;
  }

  // The communicator of `rank` is being destroyed: its waiting collective
  // (if not committed) fails now.
  void Abort(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[rank].aborted = true;
    cv_.notify_all();
  }

 private:
  struct Slot {
    CollectiveArgs posted;  // posted.seq == 0: nothing posted yet.
    uint64_t done_seq = 0;
    bool gone = false;
    bool left = false;            // left normally: issues nothing after left_after_seq
    uint64_t left_after_seq = 0;  // its last collective
    std::string gone_reason;      // why it is gone or left
    bool aborted = false;
  };

  void MarkGoneLocked(int rank, const std::string& reason) {
    if (slots_[rank].gone) return;
    slots_[rank].gone = true;
    slots_[rank].gone_reason = reason;
    cv_.notify_all();
  }

  std::vector<int> MissingRanks(uint64_t seq) const {
    std::vector<int> missing;
    for (int p = 0; p < static_cast<int>(slots_.size()); ++p) {
      if (slots_[p].posted.seq < seq) missing.push_back(p);
    }
    return missing;
  }

  // Returns an error when the collective must fail now, OK when it must keep
  // waiting, and marks it committed (OK) when every rank is ready.
  absl::Status CheckBeforeCommit(int rank, const CollectiveArgs& args, absl::Duration timeout,
                                 const std::string& prefix) {
    const std::string what = DescribeCollective(args);
    const std::vector<int> missing = MissingRanks(args.seq);
    if (missing.empty()) {
      // Everyone posted: a mismatch is the same verdict on every rank.
      for (int p = 0; p < static_cast<int>(slots_.size()); ++p) {
        const std::string diff = DescribeMismatch(args, slots_[p].posted);
        if (!diff.empty()) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "%s: %s does not match rank %d's collective #%d, %s (%s); every rank must issue "
              "the same collectives in the same order",
              prefix, what, p, args.seq, DescribeCollective(slots_[p].posted), diff));
        }
      }
    }
    for (int p = 0; p < static_cast<int>(slots_.size()); ++p) {
      const Slot& peer = slots_[p];
      if (peer.left && !peer.gone && peer.left_after_seq < args.seq) {
        return absl::AbortedError(absl::StrFormat(
            "%s: %s failed: rank %d left the group after its collective #%d (%s) and will issue "
            "no more; every rank must issue the same collectives",
            prefix, what, p, peer.left_after_seq, peer.gone_reason));
      }
      if (!peer.gone) continue;
      std::string still_missing;
      if (!missing.empty()) {
        still_missing =
            absl::StrFormat("; rank(s) %s had not issued it yet", absl::StrJoin(missing, ", "));
      }
      if (p == rank) {
        return absl::AbortedError(
            absl::StrFormat("%s: %s failed: this rank already left the group (%s)", prefix, what,
                            slots_[p].gone_reason));
      }
      return absl::AbortedError(
          absl::StrFormat("%s: %s failed: rank %d left the group (its error: %s)%s", prefix, what,
                          p, slots_[p].gone_reason, still_missing));
    }
    if (missing.empty()) {
      committed_seq_ = args.seq;
      cv_.notify_all();
      return absl::OkStatus();
    }
    if (slots_[rank].aborted) {
      return absl::CancelledError(absl::StrFormat(
          "%s: %s failed: the communicator was destroyed while waiting for rank(s) %s", prefix,
          what, absl::StrJoin(missing, ", ")));
    }
    return absl::OkStatus();
  }

  absl::Status TimeoutError(int rank, const CollectiveArgs& args, absl::Duration timeout,
                            const std::string& prefix) const {
    const std::vector<int> missing = MissingRanks(args.seq);
    std::vector<std::string> last;
    for (int p : missing) {
      const uint64_t reached = slots_[p].posted.seq;
      last.push_back(reached == 0
                         ? absl::StrFormat("rank %d has not run any collective", p)
                         : absl::StrFormat("rank %d's last collective was #%d", p, reached));
    }
    // Missing ranks are neither gone nor left (that fails at once): their
    // threads are still running, blocked or busy outside the communicator.
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s: timed out after %s in %s waiting for rank(s) %s; %s never issued this collective "
        "and %s still running: stuck (blocked, deadlocked) or slower than the timeout (%s)",
        prefix, absl::FormatDuration(timeout), DescribeCollective(args),
        absl::StrJoin(missing, ", "), missing.size() == 1 ? "that rank" : "those ranks",
        missing.size() == 1 ? "is" : "are", absl::StrJoin(last, ", ")));
  }

  // Step 3 for `rank`: every rank computes a disjoint part of the outputs.
  static absl::Status Compute(int rank, const std::vector<CollectiveArgs>& posts,
                              CollectiveMemory& memory) {
    const CollectiveArgs& mine = posts[rank];
    const int world = static_cast<int>(posts.size());
    const size_t element_bytes = DTypeSize(mine.dtype);
    const int64_t count = mine.count;
    if (count == 0) return absl::OkStatus();
    std::vector<const void*> inputs(world);
    std::vector<void*> outputs(world);
    switch (mine.kind) {
      case CollectiveKind::kAllReduce: {
        // Rank r reduces piece r of everyone's send and writes it into
        // everyone's recv. Only rank r touches piece r of any buffer, so in
        // place is safe (SumInRankOrder reads a block before writing it).
        int64_t offset, length;
        PieceRange(count, world, rank, &offset, &length);
        if (length == 0) return absl::OkStatus();
        for (int p = 0; p < world; ++p) {
          inputs[p] = static_cast<const char*>(posts[p].send) + offset * element_bytes;
          outputs[p] = static_cast<char*>(posts[p].recv) + offset * element_bytes;
        }
        return memory.Sum(inputs.data(), world, outputs.data(), world, length, mine.dtype);
      }
      case CollectiveKind::kReduceScatter: {
        // Block r of every send is read only by rank r, so recv may alias it.
        for (int p = 0; p < world; ++p) {
          inputs[p] = static_cast<const char*>(posts[p].send) + rank * count * element_bytes;
        }
        void* out = mine.recv;
        return memory.Sum(inputs.data(), world, &out, 1, count, mine.dtype);
      }
      case CollectiveKind::kAllGather: {
        // Peers read only our send (block rank() of recv when in place), and
        // we write only the other blocks of our recv.
        for (int p = 0; p < world; ++p) {
          char* dst = static_cast<char*>(mine.recv) + p * count * element_bytes;
          if (dst != posts[p].send || p != rank) {
            ZS_RETURN_IF_ERROR(memory.Copy(dst, posts[p].send, count * element_bytes));
          }
        }
        return absl::OkStatus();
      }
      case CollectiveKind::kBroadcast:
        if (rank != mine.root) {
          return memory.Copy(mine.recv, posts[mine.root].send, count * element_bytes);
        }
        return absl::OkStatus();
      case CollectiveKind::kBarrier:
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  struct PendingSplit {
    SplitGroup group;
    int taken = 0;
  };

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  uint64_t committed_seq_ = 0;
  std::map<std::pair<uint64_t, int>, PendingSplit> splits_;
};

class LocalCommunicator final : public AsyncCommunicator {
 public:
  // `group_name`: empty for a group of CreateLocalGroup, " of group C
  // (parent rank P)" for one made by Split.
  LocalCommunicator(std::shared_ptr<LocalHub> hub, std::shared_ptr<LocalMailbox> mailbox, int rank,
                    int size, CommOptions options, std::unique_ptr<CollectiveMemory> memory,
                    std::unique_ptr<CollectiveMemory> p2p_memory, std::string group_name = "")
      : AsyncCommunicator(rank, size, options),
        hub_(std::move(hub)),
        mailbox_(std::move(mailbox)),
        memory_(std::move(memory)),
        p2p_memory_(std::move(p2p_memory)),
        memory_kind_(options.device != nullptr ? options.device->kind() : DeviceKind::kCpu) {
    SetGroupName(std::move(group_name));
    StartProgressThread();
  }

  ~LocalCommunicator() override {
    Shutdown();
    mailbox_->Stop(rank());
    {
      std::lock_guard<std::mutex> lock(p2p_mu_);
      if (p2p_thread_.joinable()) p2p_thread_.join();
    }
    mailbox_->Drain(rank(), "its communicator was destroyed");
    hub_->MarkGone(rank(), "its communicator was destroyed");
  }

  std::string backend() const override { return "local"; }
  DeviceKind memory_kind() const override { return memory_kind_; }
  const Device* memory_device() const override { return options().device; }

  // This rank issues nothing more: peers' later collectives, and their sends
  // and receives that none of this rank's matches, fail at once.
  void Leave(const std::string& reason) {
    hub_->MarkLeft(rank(), issued(), reason);
    mailbox_->MarkLeft(rank(), reason);
  }
  // This rank failed: its peers' uncommitted collectives and unmatched sends
  // and receives with it fail at once.
  void MarkGone(const std::string& reason) {
    hub_->MarkGone(rank(), reason);
    mailbox_->MarkGone(rank(), reason);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

 protected:
  absl::Status RunCollective(const CollectiveArgs& args, absl::Time deadline) override {
    return hub_->Run(rank(), args, deadline, options().timeout, ErrorPrefix(), *memory_);
  }
  void StartPointToPoint(const PointToPointArgs& args,
                         std::shared_ptr<CommOpState> state) override {
    {
      std::lock_guard<std::mutex> lock(p2p_mu_);
      if (!p2p_thread_.joinable()) {
        p2p_thread_ = std::thread([this] {
          mailbox_->RunWorker(rank(), *p2p_memory_, [this](CommOpState& op, absl::Status result) {
            FinishPointToPoint(op, std::move(result));
          });
        });
      }
    }
    mailbox_->Post(rank(), args, std::move(state), absl::Now() + options().timeout, ErrorPrefix());
  }
  void OnPoisoned(const absl::Status& error) override { MarkGone(std::string(error.message())); }
  void RequestAbort() override { hub_->Abort(rank()); }

 private:
  std::shared_ptr<LocalHub> hub_;
  std::shared_ptr<LocalMailbox> mailbox_;
  std::unique_ptr<CollectiveMemory> memory_;
  std::unique_ptr<CollectiveMemory> p2p_memory_;  // the point-to-point thread's
  DeviceKind memory_kind_;
  std::mutex p2p_mu_;
  std::thread p2p_thread_;  // started by the first Send or Recv
  uint64_t splits_ = 0;     // Split calls so far
};

absl::StatusOr<std::unique_ptr<Communicator>> LocalCommunicator::Split(int color, int key) {
  // Every rank passes the agreement (a collective: timeouts and departed
  // ranks are named as for any collective), so all number this split alike.
  const uint64_t split = ++splits_;
  ZS_ASSIGN_OR_RETURN(const std::vector<int> members, AgreeOnSplit(color, key));
  if (color < 0) return std::unique_ptr<Communicator>();
  const int size = static_cast<int>(members.size());
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  auto memory = CreateCollectiveMemory(options().device);
  if (!memory.ok()) return memory.status();
  auto p2p_memory = CreateCollectiveMemory(options().device);
  if (!p2p_memory.ok()) return p2p_memory.status();
  LocalHub::SplitGroup group = hub_->TakeSplitGroup(split, color, size, options().timeout);
  return std::unique_ptr<Communicator>(new LocalCommunicator(
      group.hub, group.mailbox, new_rank, size, options(), std::move(*memory),
      std::move(*p2p_memory),
      absl::StrFormat(" of group %d (parent rank %d%s)", color, rank(), group_name())));
}

}  // namespace
}  // namespace internal

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLocalGroup(int world_size,
                                                                            CommOptions options) {
  constexpr int kMaxLocalRanks = 1024;
  if (world_size < 1 || world_size > kMaxLocalRanks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CreateLocalGroup: world size %d is out of range; use 1..%d (one thread per rank)",
        world_size, kMaxLocalRanks));
  }
  absl::StatusOr<absl::Duration> timeout = ResolveCommTimeout(options);
  if (!timeout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateLocalGroup: ", timeout.status().message()));
  }
  options.timeout = *timeout;
  if (options.device != nullptr && options.device->kind() != DeviceKind::kCpu &&
      world_size > internal::kMaxDeviceLocalRanks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CreateLocalGroup: %d ranks on %s; a local group on one GPU takes at most %d", world_size,
        options.device->name(), internal::kMaxDeviceLocalRanks));
  }
  auto hub = std::make_shared<internal::LocalHub>(world_size);
  auto mailbox = std::make_shared<internal::LocalMailbox>(world_size, options.timeout);
  std::vector<std::unique_ptr<Communicator>> group;
  group.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    auto memory = internal::CreateCollectiveMemory(options.device);
    if (!memory.ok()) {
      return absl::Status(memory.status().code(),
                          absl::StrCat("CreateLocalGroup: ", memory.status().message()));
    }
    auto p2p_memory = internal::CreateCollectiveMemory(options.device);
    if (!p2p_memory.ok()) {
      return absl::Status(p2p_memory.status().code(),
                          absl::StrCat("CreateLocalGroup: ", p2p_memory.status().message()));
    }
    group.push_back(std::make_unique<internal::LocalCommunicator>(
        hub, mailbox, r, world_size, options, std::move(*memory), std::move(*p2p_memory)));
  }
  return group;
}

namespace {

// What the rank threads of one RunLocalRanks share. Owned jointly by the
// caller and every thread, so that a thread RunLocalRanks stopped waiting
// for (and detached) still finds its communicator and function.
struct LocalRun {
  std::vector<std::unique_ptr<Communicator>> group;
  std::function<absl::Status(int rank, Communicator& comm)> fn;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> returned;
  int returned_count = 0;
  absl::Status first_error;  // In time order: later errors are usually echoes.
  absl::Time first_error_time;
};

void RunRank(const std::shared_ptr<LocalRun>& run, int rank) {
  const absl::Status status = run->fn(rank, *run->group[rank]);
  auto& comm = static_cast<internal::LocalCommunicator&>(*run->group[rank]);
  if (status.ok()) {
    comm.Leave("its function returned");
  } else {
    comm.MarkGone(std::string(status.message()));
  }
  std::lock_guard<std::mutex> lock(run->mu);
  run->returned[rank] = true;
  ++run->returned_count;
  if (!status.ok() && run->first_error.ok()) {
    run->first_error =
        absl::Status(status.code(), absl::StrFormat("rank %d: %s", rank, status.message()));
    run->first_error_time = absl::Now();
  }
  run->cv.notify_all();
}

}  // namespace

absl::Status RunLocalRanks(int world_size,
                           const std::function<absl::Status(int rank, Communicator& comm)>& fn,
                           CommOptions options) {
  if (options.local_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RunLocalRanks: local_grace %s must not be negative",
                        absl::FormatDuration(options.local_grace)));
  }
  auto group_or = CreateLocalGroup(world_size, options);
  if (!group_or.ok()) return group_or.status();
  auto run = std::make_shared<LocalRun>();
  run->group = std::move(group_or).value();
  run->fn = fn;
  run->returned.assign(world_size, false);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) threads.emplace_back([run, r] { RunRank(run, r); });

  // Every rank returns; or, after a failure, the others get the grace period.
  std::vector<int> stuck;
  absl::Status result;
  {
    std::unique_lock<std::mutex> lock(run->mu);
    while (run->returned_count < world_size) {
      if (run->first_error.ok()) {
        run->cv.wait(lock);
        continue;
      }
      const absl::Time give_up = run->first_error_time + options.local_grace;
      if (absl::Now() >= give_up) break;
      run->cv.wait_until(lock, absl::ToChronoTime(give_up));
    }
    for (int r = 0; r < world_size; ++r) {
      if (!run->returned[r]) stuck.push_back(r);
    }
    result = run->first_error;
  }
  for (int r = 0; r < world_size; ++r) {
    if (std::find(stuck.begin(), stuck.end(), r) != stuck.end()) {
      threads[r].detach();
    } else {
      threads[r].join();
    }
  }
  if (stuck.empty()) return result;
  return absl::Status(
      result.code(),
      absl::StrFormat("%s; rank(s) %s had not returned %s after that failure (blocked outside "
                      "the communicator?): their threads were detached and keep running, so end "
                      "the process (AbortJob) instead of freeing what they use",
                      result.message(), absl::StrJoin(stuck, ", "),
                      absl::FormatDuration(options.local_grace)));
}

}  // namespace zeroshard
