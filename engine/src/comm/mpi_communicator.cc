// The `mpi` backend's collectives (mpi_communicator.h says how they work).
#include "engine/src/comm/mpi_communicator.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/src/comm/async_communicator.h"
#include "engine/src/comm/comm_op.h"
#include "engine/src/comm/mpi_heartbeat.h"
#include "engine/src/comm/mpi_point_to_point.h"
#include "engine/src/comm/mpi_runtime.h"
#include "engine/src/comm/process_probe.h"
#include "engine/src/comm/reduce.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {
// Reduce-scatter moves at most this many bytes per peer per round, which
// bounds the scratch memory to (size() - 1) * kChunkBytes.
constexpr int64_t kChunkBytes = int64_t{4} << 20;
// MPI counts are int: larger transfers go as several messages with the same
// tag, which MPI delivers in order.
constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

// How often a rank that waits checks whether the peers it waits for still
// exist. OpenMPI's launcher ends the job 1 s after a process dies (SIGCONT,
// then SIGTERM a second later); 20 ms leaves the survivors ample time to say
// which rank died first.
constexpr absl::Duration kLivenessInterval = absl::Milliseconds(20);

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, MPI_Comm p2p_comm, int rank, int size,
                                 int64_t tag_space, uint64_t instance,
                                 std::vector<ProcessIdentity> processes, CommOptions options,
                                 std::string group_name)
    : AsyncCommunicator(rank, size, options),
      comm_(comm),
      instance_(instance),
      processes_(std::move(processes)),
      heartbeat_limit_(HeartbeatLimit(options.timeout)) {
  int tag_bits = 0;
  while (tag_bits < 62 && (int64_t{1} << (tag_bits + 1)) <= tag_space) ++tag_bits;
  seq_bits_ = std::min(tag_bits, 20);
  instance_bits_ = tag_bits - seq_bits_;
  SetGroupName(std::move(group_name));
  PlanHierarchy();
  p2p_ = std::make_unique<MpiPointToPoint>(
      p2p_comm, rank, processes_, options.timeout, ErrorPrefix(),
      [this](CommOpState& op, absl::Status result) { FinishPointToPoint(op, std::move(result)); },
      [this](int peer, int64_t bytes) {
        (hierarchy_.node_of[peer] == hierarchy_.node_of[this->rank()] ? intra_node_bytes_
                                                                      : inter_node_bytes_) += bytes;
      });
  StartProgressThread();
}

MpiCommunicator::~MpiCommunicator() {
  Shutdown();
  p2p_.reset();
  if (receives_in_limbo_) {
    // MPI may still write into them: keep them for the life of the process
    // (which, after a communicator failure, should end soon: AbortJob).
    static auto* graveyard = new std::vector<std::vector<char>>();
    static auto* descriptor_graveyard = new std::vector<std::vector<Descriptor>>();
    std::lock_guard<std::mutex> lock(MpiInitMutex());
    graveyard->push_back(std::move(scratch_));
    descriptor_graveyard->push_back(std::move(peer_descriptors_));
  }
  if (requests_abandoned_) {
    // Messages of this communicator may still be in flight (a freed send, a
    // peer's send to a cancelled receive). Freed, its context id can go to
    // a later communicator of the same ranks, and such a message arriving
    // there late upsets Open MPI's per-peer message order (seen in the
    // tests: after a timed-out collective, a 2 MB Send on the next
    // communicator never completed). Kept, the id stays taken on this rank,
    // which keeps every group with this rank from reusing it; the process
    // should end soon anyway (AbortJob).
    return;
  }
  MpiCallLock lock;
  MPI_Comm_free(&comm_);
}

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::Split(int color, int key) {
  // The agreement is one of this communicator's collectives (timeouts name
  // the ranks that did not call Split). Only then the blocking MPI calls,
  // which every rank of the group now reaches at once; a rank that dies in
  // between would leave them hanging (MPI has no nonblocking split).
  absl::StatusOr<std::vector<int>> members = AgreeOnSplit(color, key);
  if (!members.ok()) return members.status();
  const uint64_t instance = NextMpiInstance();
  const std::string where =
      absl::StrFormat("%s: Split(color %d, key %d)", ErrorPrefix(), color, key);
  MPI_Comm child = MPI_COMM_NULL;
  MPI_Comm p2p_child = MPI_COMM_NULL;
  int child_rank = 0;
  int child_size = 0;
  int64_t tag_space = 32768;
  {
    MpiCallLock lock;
    int rc = MPI_Comm_split(comm_, color >= 0 ? color : MPI_UNDEFINED, key, &child);
    if (rc != MPI_SUCCESS) return MpiError(where, "MPI_Comm_split", rc);
    if (child == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
    rc = MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(child, &p2p_child);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(p2p_child, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(child, &child_rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(child, &child_size);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&child);
      if (p2p_child != MPI_COMM_NULL) MPI_Comm_free(&p2p_child);
      return MpiError(where, "MPI_Comm_dup/set_errhandler/rank/size", rc);
    }
    void* tag_ub = nullptr;
    int found = 0;
    if (MPI_Comm_get_attr(child, MPI_TAG_UB, &tag_ub, &found) == MPI_SUCCESS && found) {
      tag_space = static_cast<int64_t>(*static_cast<int*>(tag_ub)) + 1;
    }
  }
  // MPI orders by key, then by rank here: the order AgreeOnSplit computed.
  if (child_size != static_cast<int>(members->size()) || (*members)[child_rank] != rank()) {
    MpiCallLock lock;
    MPI_Comm_free(&child);
    MPI_Comm_free(&p2p_child);
    return absl::InternalError(absl::StrFormat(
        "%s: MPI_Comm_split made a group of %d ranks where this rank is %d, but the agreement "
        "expected %d ranks with this one at position %d",
        where, child_size, child_rank, members->size(),
        std::find(members->begin(), members->end(), rank()) - members->begin()));
  }
  std::vector<ProcessIdentity> processes;
  for (int member : *members) processes.push_back(processes_[member]);
  return std::unique_ptr<Communicator>(new MpiCommunicator(
      child, p2p_child, child_rank, child_size, tag_space, instance, std::move(processes),
      options(), absl::StrFormat(" of group %d (parent rank %d%s)", color, rank(), group_name())));
}

NodeLayout MpiCommunicator::node_layout() const {
  // Nodes in the order of their lowest rank here (a Split group renumbers);
  // named by the host of that rank.
  NodeLayout layout;
  layout.source = "MPI_COMM_TYPE_SHARED";
  std::vector<int32_t> leaders;
  for (const ProcessIdentity& p : processes_) {
    auto it = std::find(leaders.begin(), leaders.end(), p.node_leader);
    if (it == leaders.end()) {
      leaders.push_back(p.node_leader);
      layout.node_names.push_back(p.host);
      it = leaders.end() - 1;
    }
    layout.node_of_rank.push_back(static_cast<int>(it - leaders.begin()));
  }
  return layout;
}

absl::Status MpiCommunicator::PostSend(Requests& requests, const void* data, int64_t bytes,
                                       int peer, int tag, const CollectiveArgs& args) {
  return Post(requests, const_cast<void*>(data), bytes, peer, tag, args, /*is_recv=*/false);
}

absl::Status MpiCommunicator::PostRecv(Requests& requests, void* data, int64_t bytes, int peer,
                                       int tag, const CollectiveArgs& args) {
  return Post(requests, data, bytes, peer, tag, args, /*is_recv=*/true);
}

// Posts one transfer as messages of at most kMaxMessageBytes (MPI counts are
// int); a send never writes through `data`.
absl::Status MpiCommunicator::Post(Requests& requests, void* data, int64_t bytes, int peer, int tag,
                                   const CollectiveArgs& args, bool is_recv) {
  char* p = static_cast<char*>(data);
  int64_t done = 0;
  do {
    const int64_t n = std::min(bytes - done, kMaxMessageBytes);
    MPI_Request request;
    int rc;
    {
      MpiCallLock lock;
      rc = is_recv ? MPI_Irecv(p + done, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &request)
                   : MPI_Isend(p + done, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &request);
    }
    if (rc != MPI_SUCCESS) return MpiError(Where(args), is_recv ? "MPI_Irecv" : "MPI_Isend", rc);
    if (!is_recv) {
      (hierarchy_.node_of[peer] == hierarchy_.node_of[rank()] ? intra_node_bytes_
                                                              : inter_node_bytes_) += n;
    }
    requests.handles.push_back(request);
    requests.peers.push_back(peer);
    requests.is_recv.push_back(is_recv);
    requests.ops.push_back(&args);
    done += n;
  } while (done < bytes);
  return absl::OkStatus();
}

void MpiCommunicator::Abandon(Requests& requests) {
  for (MPI_Request request : requests.handles) {
    if (request != MPI_REQUEST_NULL) requests_abandoned_ = true;
  }
  MpiCallLock lock;
  // The communicator is poisoned after this, so nothing else uses the tag
  // of a freed send.
  if (AbandonRequests(requests.handles, [&](size_t i) { return requests.is_recv[i]; })) {
    receives_in_limbo_ = true;
  }
}

std::string MpiCommunicator::DescribeRank(int peer) const {
  return DescribePeer(peer, processes_[peer]);
}

std::string MpiCommunicator::PeerState(int peer) const {
  const ProcessState state = ProbeProcess(processes_[peer], processes_[rank()]);
  const std::optional<absl::Duration> silence = SilenceOf(processes_[peer].world_rank);
  if (state != ProcessState::kUnknown || !silence.has_value()) return DescribeState(state);
  return absl::StrFormat(
      "runs on another node, whose heartbeats %s: it is alive but has not done its part (stuck "
      "in other work, deadlocked, or slower than the timeout)",
      *silence < 2 * kHeartbeatInterval
          ? "arrive"
          : absl::StrFormat("last arrived %s ago",
                            absl::FormatDuration(absl::Trunc(*silence, absl::Milliseconds(100)))));
}

int MpiCommunicator::FindDeadPeer(const std::set<int>& peers) const {
  for (int peer : peers) {
    if (ProbeProcess(processes_[peer], processes_[rank()]) == ProcessState::kGone) return peer;
  }
  return -1;
}

absl::Status MpiCommunicator::Complete(Requests& requests, const CollectiveArgs& args,
                                       absl::Time deadline, Phase phase) {
  const int n = static_cast<int>(requests.handles.size());
  std::vector<int> indices(n);
  int remaining = n;
  int idle_polls = 0;
  absl::Time next_liveness_check = absl::Now() + kLivenessInterval;
  // The peers whose requests are still open.
  auto pending_peers = [&](std::set<int>* missing_from, std::set<int>* not_taken_by) {
    for (int i = 0; i < n; ++i) {
      if (requests.handles[i] == MPI_REQUEST_NULL) continue;
      (requests.is_recv[i] ? missing_from : not_taken_by)->insert(requests.peers[i]);
    }
  };
  // The collective the first open request belongs to: in a batch, the one
  // whose peer is late (the rank that never issued it, for descriptors).
  auto open_op = [&]() -> const CollectiveArgs& {
    for (int i = 0; i < n; ++i) {
      if (requests.handles[i] != MPI_REQUEST_NULL) return *requests.ops[i];
    }
    return args;
  };
  while (remaining > 0) {
    int completed = 0;
    int rc;
    {
      MpiCallLock lock;
      rc =
          MPI_Testsome(n, requests.handles.data(), &completed, indices.data(), MPI_STATUSES_IGNORE);
    }
    if (rc != MPI_SUCCESS) {
      Abandon(requests);
      return MpiError(Where(args), "MPI_Testsome", rc);
    }
    if (completed == MPI_UNDEFINED) break;  // No active request left.
    if (completed > 0) {
      remaining -= completed;
      idle_polls = 0;
      continue;
    }
    const bool aborted = abort_.load();
    const absl::Time now = absl::Now();
    if (!aborted && now < deadline && now >= next_liveness_check) {
      // A peer on this machine whose process is gone will never send: fail
      // now, naming it, rather than at the deadline.
      next_liveness_check = now + kLivenessInterval;
      std::set<int> peers;
      pending_peers(&peers, &peers);
      const int dead = FindDeadPeer(peers);
      if (dead >= 0) {
        const std::string what = DescribeCollective(open_op());
        Abandon(requests);
        return absl::AbortedError(absl::StrFormat("%s: %s failed: %s %s; the job cannot continue",
                                                  ErrorPrefix(), what, DescribeRank(dead),
                                                  DescribeState(ProcessState::kGone)));
      }
      // A peer on another node whose heartbeats stopped: its node is down
      // or cut off, or its process is stopped. Fail now, naming it.
      for (int peer : peers) {
        const std::optional<absl::Duration> silence = SilenceOf(processes_[peer].world_rank);
        if (!silence.has_value() || *silence <= heartbeat_limit_) continue;
        const std::string what = DescribeCollective(open_op());
        Abandon(requests);
        return absl::AbortedError(absl::StrFormat(
            "%s: %s failed: %s has sent no heartbeat for %s (one every %s): its node %s is down "
            "or cut off from this one, or the process is stopped; the job cannot continue",
            ErrorPrefix(), what, DescribeRank(peer),
            absl::FormatDuration(absl::Trunc(*silence, absl::Milliseconds(100))),
            absl::FormatDuration(kHeartbeatInterval), processes_[peer].host));
      }
    }
    if (aborted || now >= deadline) {
      std::set<int> missing_from;
      std::set<int> not_taken_by;
      pending_peers(&missing_from, &not_taken_by);
      const CollectiveArgs& late = open_op();
      Abandon(requests);
      const std::set<int>& waited = missing_from.empty() ? not_taken_by : missing_from;
      const std::string waiting_for = absl::StrJoin(waited, ", ");
      if (aborted) {
        return absl::CancelledError(absl::StrFormat(
            "%s failed: the communicator was destroyed while waiting for rank(s) %s", Where(late),
            waiting_for));
      }
      std::string why;
      if (phase == Phase::kDescriptors && !missing_from.empty()) {
        why = absl::StrFormat("%s never issued this collective",
                              missing_from.size() == 1 ? "that rank" : "those ranks");
      } else if (!missing_from.empty()) {
        why = "they issued this collective but their data never arrived";
      } else {
        why = "they never received our data";
      }
      // What this rank can see of each peer it waited for: stopped, running,
      // gone, or out of sight on another machine.
      std::vector<std::string> states;
      for (int peer : waited)
        states.push_back(absl::StrCat(DescribeRank(peer), " ", PeerState(peer)));
      return absl::DeadlineExceededError(
          absl::StrFormat("%s: timed out after %s in %s waiting for rank(s) %s; %s: %s",
                          ErrorPrefix(), absl::FormatDuration(options().timeout),
                          DescribeCollective(late), waiting_for, why, absl::StrJoin(states, "; ")));
    }
    // Spin politely first (MPI progresses only inside our Test calls), then
    // back off so a rank that waits for a late peer does not burn a core.
    if (++idle_polls < 2000) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> MpiCommunicator::ExchangeDescriptors(absl::Span<const CollectiveArgs> offered,
                                                         absl::Time deadline) {
  const CollectiveArgs& first = offered[0];
  const int world = size();
  // Every rank's offer in one buffer, this rank's included, as AgreeOnBatch
  // reads them. Sized before any receive is posted: it must not move.
  std::vector<Descriptor>& all = peer_descriptors_;
  all.assign(static_cast<size_t>(world) * kBatchSlots, Descriptor{});
  Descriptor* mine = all.data() + static_cast<size_t>(rank()) * kBatchSlots;
  PackBatchOffer(offered, mine, instance_);
  // A rank receives room for a whole offer but sends only its header and
  // the descriptors it offers (MPI takes a shorter message into a larger
  // receive); AgreeOnBatch reads no slot beyond a header's count.
  const int64_t room = sizeof(Descriptor) * kBatchSlots;
  const int64_t bytes = sizeof(Descriptor) * (1 + std::min<int64_t>(offered.size(), kMaxBatchOps));
  Requests requests;
  const int tag = Tag(first);
  absl::Status posted;
  for (int p = 0; p < world && posted.ok(); ++p) {
    if (p == rank()) continue;
    posted =
        PostRecv(requests, all.data() + static_cast<size_t>(p) * kBatchSlots, room, p, tag, first);
  }
  for (int p = 0; p < world && posted.ok(); ++p) {
    if (p == rank()) continue;
    posted = PostSend(requests, mine, bytes, p, tag, first);
  }
  if (!posted.ok()) {
    Abandon(requests);
    return posted;
  }
  ZS_RETURN_IF_ERROR(Complete(requests, first, deadline, Phase::kDescriptors));
  for (int p = 0; p < world; ++p) {
    if (p == rank()) continue;
    const int64_t theirs = all[static_cast<size_t>(p) * kBatchSlots].instance;
    if (static_cast<uint64_t>(theirs) != instance_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: rank %d answered from its communicator #%d but this is communicator #%d; every "
          "rank must create (and use) its MPI communicators in the same order",
          Where(first), p, theirs, instance_));
    }
  }
  return AgreeOnBatch(all.data(), world, rank(), offered, ErrorPrefix());
}

absl::Status MpiCommunicator::ReduceScatterBlocks(const CollectiveArgs& args, const char* send,
                                                  const std::vector<int64_t>& offsets,
                                                  const std::vector<int64_t>& lengths, char* out,
                                                  absl::Time deadline) {
  const int world = size();
  const int me = rank();
  const int64_t element_bytes = static_cast<int64_t>(DTypeSize(args.dtype));
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / element_bytes);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const int64_t slot_elements = std::min(chunk, longest);
  const size_t scratch_bytes = static_cast<size_t>(world) * slot_elements * element_bytes;
  if (scratch_.size() < scratch_bytes) scratch_.resize(scratch_bytes);
  const int tag = Tag(args);
  std::vector<const void*> inputs(world);
  for (int64_t begin = 0; begin < longest; begin += chunk) {
    Requests requests;
    const int64_t my_n = std::max<int64_t>(0, std::min(chunk, lengths[me] - begin));
    for (int p = 0; p < world; ++p) {
      char* slot = scratch_.data() + static_cast<size_t>(p) * slot_elements * element_bytes;
      inputs[p] = p == me ? send + (offsets[me] + begin) * element_bytes : slot;
      if (p == me || my_n == 0) continue;
      ZS_RETURN_IF_ERROR(PostRecv(requests, slot, my_n * element_bytes, p, tag, args));
    }
    for (int p = 0; p < world; ++p) {
      const int64_t n = std::max<int64_t>(0, std::min(chunk, lengths[p] - begin));
      if (p == me || n == 0) continue;
      absl::Status posted = PostSend(requests, send + (offsets[p] + begin) * element_bytes,
                                     n * element_bytes, p, tag, args);
      if (!posted.ok()) {
        Abandon(requests);
        return posted;
      }
    }
    ZS_RETURN_IF_ERROR(Complete(requests, args, deadline, Phase::kData));
    // Our own block may be `out` itself (in place): SumInRankOrder reads
    // each block of elements before writing it.
    void* destination = out + begin * element_bytes;
    SumInRankOrder(inputs.data(), world, &destination, 1, my_n, args.dtype);
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllGatherBlocks(const CollectiveArgs& args, const char* mine,
                                              char* recv, const std::vector<int64_t>& offsets,
                                              const std::vector<int64_t>& lengths,
                                              absl::Time deadline) {
  const int world = size();
  const int me = rank();
  const int64_t element_bytes = static_cast<int64_t>(DTypeSize(args.dtype));
  const int tag = Tag(args);
  Requests requests;
  for (int p = 0; p < world; ++p) {
    if (p == me || lengths[p] == 0) continue;
    ZS_RETURN_IF_ERROR(PostRecv(requests, recv + offsets[p] * element_bytes,
                                lengths[p] * element_bytes, p, tag, args));
  }
  if (lengths[me] > 0) {
    for (int p = 0; p < world; ++p) {
      if (p == me) continue;
      absl::Status posted = PostSend(requests, mine, lengths[me] * element_bytes, p, tag, args);
      if (!posted.ok()) {
        Abandon(requests);
        return posted;
      }
    }
    char* own = recv + offsets[me] * element_bytes;
    if (own != mine) std::memcpy(own, mine, lengths[me] * element_bytes);
  }
  return Complete(requests, args, deadline, Phase::kData);
}

absl::Status MpiCommunicator::RunCollective(const CollectiveArgs& args, absl::Time deadline) {
  ZS_RETURN_IF_ERROR(ExchangeDescriptors(absl::MakeConstSpan(&args, 1), deadline).status());
  return MoveData(args, deadline);
}

absl::Status MpiCommunicator::MoveData(const CollectiveArgs& args, absl::Time deadline) {
  const int world = size();
  std::vector<int64_t> offsets(world);
  std::vector<int64_t> lengths(world);
  const int64_t element_bytes = static_cast<int64_t>(DTypeSize(args.dtype));
  switch (args.kind) {
    case CollectiveKind::kBarrier:
      return absl::OkStatus();  // The descriptor all-to-all is the barrier.
    case CollectiveKind::kAllReduce: {
      if (args.count == 0) return absl::OkStatus();
      // Reduce-scatter into nearly equal pieces, then all-gather the pieces;
      // each piece is summed by one rank in rank order, exactly like
      // ReduceScatter, so both give the same bits for the same element.
      for (int p = 0; p < world; ++p) PieceRange(args.count, world, p, &offsets[p], &lengths[p]);
      char* recv = static_cast<char*>(args.recv);
      char* my_piece = recv + offsets[rank()] * element_bytes;
      if (hierarchy_.enabled && ChainPays(args.dtype, lengths)) {
        ZS_RETURN_IF_ERROR(HierarchicalReduceScatter(args, static_cast<const char*>(args.send),
                                                     offsets, lengths, my_piece, deadline));
      } else {
        ZS_RETURN_IF_ERROR(ReduceScatterBlocks(args, static_cast<const char*>(args.send), offsets,
                                               lengths, my_piece, deadline));
      }
      if (hierarchy_.enabled) {
        return HierarchicalAllGather(args, my_piece, recv, offsets, lengths, deadline);
      }
      return AllGatherBlocks(args, my_piece, recv, offsets, lengths, deadline);
    }
    case CollectiveKind::kReduceScatter: {
      if (args.count == 0) return absl::OkStatus();
      for (int p = 0; p < world; ++p) {
        offsets[p] = p * args.count;
        lengths[p] = args.count;
      }
      if (hierarchy_.enabled && ChainPays(args.dtype, lengths)) {
        return HierarchicalReduceScatter(args, static_cast<const char*>(args.send), offsets,
                                         lengths, static_cast<char*>(args.recv), deadline);
      }
      return ReduceScatterBlocks(args, static_cast<const char*>(args.send), offsets, lengths,
                                 static_cast<char*>(args.recv), deadline);
    }
    case CollectiveKind::kAllGather: {
      if (args.count == 0) return absl::OkStatus();
      for (int p = 0; p < world; ++p) {
        offsets[p] = p * args.count;
        lengths[p] = args.count;
      }
      if (hierarchy_.enabled) {
        return HierarchicalAllGather(args, static_cast<const char*>(args.send),
                                     static_cast<char*>(args.recv), offsets, lengths, deadline);
      }
      return AllGatherBlocks(args, static_cast<const char*>(args.send),
                             static_cast<char*>(args.recv), offsets, lengths, deadline);
    }
    case CollectiveKind::kBroadcast: {
      if (args.count == 0 || world == 1) return absl::OkStatus();
      Requests requests;
      const int64_t bytes = args.count * element_bytes;
      if (rank() == args.root) {
        for (int p = 0; p < world; ++p) {
          if (p == rank()) continue;
          absl::Status posted = PostSend(requests, args.send, bytes, p, Tag(args), args);
          if (!posted.ok()) {
            Abandon(requests);
            return posted;
          }
        }
      } else {
        ZS_RETURN_IF_ERROR(PostRecv(requests, args.recv, bytes, args.root, Tag(args), args));
      }
      return Complete(requests, args, deadline, Phase::kData);
    }
  }
  return absl::InternalError(absl::StrFormat("%s: unknown collective kind", Where(args)));
}

std::unique_ptr<Communicator> NewMpiCommunicator(MPI_Comm comm, MPI_Comm p2p_comm, int rank,
                                                 int size, int64_t tag_space, uint64_t instance,
                                                 std::vector<ProcessIdentity> processes,
                                                 CommOptions options, std::string group_name) {
  return std::make_unique<MpiCommunicator>(comm, p2p_comm, rank, size, tag_space, instance,
                                           std::move(processes), options, std::move(group_name));
}

}  // namespace internal
}  // namespace zeroshard
