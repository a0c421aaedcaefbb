// The `mpi` backend: one rank per process over a dup of MPI_COMM_WORLD.
//
// Every collective is built from nonblocking point-to-point messages polled
// against the deadline, so a timeout can say which peers' messages never
// came. Each collective starts with a small all-to-all of descriptors (kind,
// count, dtype, root, sequence number): it checks that all ranks issued the
// same collective and doubles as the barrier. All MPI calls are made from the
// progress thread (or before it starts / after it stops), so MPI needs only
// MPI_THREAD_SERIALIZED; with less than MULTIPLE a process-wide mutex keeps
// several communicators from calling MPI at the same time. Creation, MPI
// initialisation and AbortJob live in mpi_runtime.cc; Send and Recv, which
// run beside the collectives on a communicator and thread of their own, in
// mpi_point_to_point.cc. Only the backend's own files include this header;
// everyone else makes one with CreateMpiCommunicator (NewMpiCommunicator).
//
// Small collectives issued back to back run as batches (collective_batch.h,
// mpi_collective_batch.cc): one descriptor exchange for up to kMaxBatchOps
// of them, then one round of messages for all their reduce-scatter parts,
// all-gathers and broadcasts, the sums, and one round for the all-gather
// halves of the all-reduces. So that every rank can take any rank's offer,
// the descriptor exchange always carries a batch offer (a header, then a
// descriptor per collective offered; each receive has room for a whole
// batch), for a collective that runs alone too.
#ifndef ZEROSHARD_ENGINE_SRC_COMM_MPI_COMMUNICATOR_H_
#define ZEROSHARD_ENGINE_SRC_COMM_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/src/comm/async_communicator.h"
#include "engine/src/comm/collective_batch.h"
#include "engine/src/comm/comm_op.h"
#include "engine/src/comm/mpi_point_to_point.h"
#include "engine/src/comm/process_probe.h"
#include "zeroshard/communicator.h"

namespace zeroshard {
namespace internal {

class MpiCommunicator final : public AsyncCommunicator {
 public:
  // Owns `comm` (the collectives) and `p2p_comm` (Send and Recv) from now
  // on; `processes` is every rank's process, in rank order.
  MpiCommunicator(MPI_Comm comm, MPI_Comm p2p_comm, int rank, int size, int64_t tag_space,
                  uint64_t instance, std::vector<ProcessIdentity> processes, CommOptions options,
                  std::string group_name);
  ~MpiCommunicator() override;

  std::string backend() const override { return "mpi"; }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;
  NodeLayout node_layout() const override;
  CommTraffic traffic() const override {
    return {intra_node_bytes_.load(), inter_node_bytes_.load()};
  }
  std::string collective_path() const override { return hierarchy_.path; }

 protected:
  void StartPointToPoint(const PointToPointArgs& args,
                         std::shared_ptr<CommOpState> state) override {
    p2p_->Post(args, std::move(state));
  }
  absl::Status RunCollective(const CollectiveArgs& args, absl::Time deadline) override;
  int max_batch() const override { return kMaxBatchOps; }
  // One descriptor exchange for the offer, then the agreed collectives'
  // data in two rounds (MoveBatch; a batch of one through MoveData, as a
  // peer that offered only it moves it); mpi_collective_batch.cc.
  absl::StatusOr<int> RunBatch(absl::Span<const CollectiveArgs> offered,
                               absl::Time deadline) override;
  void RequestAbort() override { abort_.store(true); }

 private:
  // Which part of a collective a set of requests belongs to (for errors).
  enum class Phase { kDescriptors, kData };
  using Descriptor = CollectiveDescriptor;

  // Outstanding nonblocking requests of one step, with their peer and the
  // collective they belong to (a batch's requests belong to several).
  struct Requests {
    std::vector<MPI_Request> handles;
    std::vector<int> peers;
    std::vector<bool> is_recv;
    std::vector<const CollectiveArgs*> ops;
  };

  // The low bits of a tag are the collective's sequence number, the high bits
  // (when MPI allows tags that large) the communicator instance. After a
  // timeout, messages of the abandoned communicator may still arrive and MPI
  // may give its context id to the next communicator; distinct tags keep them
  // from ever matching that communicator's receives.
  int Tag(const CollectiveArgs& args) const {
    const uint64_t seq_part = args.seq & ((uint64_t{1} << seq_bits_) - 1);
    const uint64_t instance_part = instance_ & ((uint64_t{1} << instance_bits_) - 1);
    return static_cast<int>((instance_part << seq_bits_) | seq_part);
  }
  std::string Where(const CollectiveArgs& args) const {
    return absl::StrFormat("%s: %s", ErrorPrefix(), DescribeCollective(args));
  }

  absl::Status PostSend(Requests& requests, const void* data, int64_t bytes, int peer, int tag,
                        const CollectiveArgs& args);
  absl::Status PostRecv(Requests& requests, void* data, int64_t bytes, int peer, int tag,
                        const CollectiveArgs& args);
  // `args` must outlive `requests` (errors name it).
  absl::Status Post(Requests& requests, void* data, int64_t bytes, int peer, int tag,
                    const CollectiveArgs& args, bool is_recv);
  // Polls until every request completed, the deadline passed or the
  // communicator is being destroyed. On failure cancels what is left; a
  // timeout or a dead peer is reported for the collective of the first
  // request still open (`args` when none is).
  absl::Status Complete(Requests& requests, const CollectiveArgs& args, absl::Time deadline,
                        Phase phase);
  // Gives up on the requests still open without blocking (see the body).
  void Abandon(Requests& requests);

  // Sends this rank's offer (PackBatchOffer: a header and a descriptor per
  // collective of `offered`) to every peer and receives theirs, under the tag
  // of offered[0]; the exchange is also the barrier. Returns how many of
  // `offered` every rank runs now (AgreeOnBatch), or FailedPrecondition when
  // a peer answered from another communicator or issued other collectives.
  absl::StatusOr<int> ExchangeDescriptors(absl::Span<const CollectiveArgs> offered,
                                          absl::Time deadline);
  // The data of one collective whose descriptors were exchanged.
  absl::Status MoveData(const CollectiveArgs& args, absl::Time deadline);
  // The data of the agreed collectives of a batch (BatchablePrefix: small
  // data collectives with independent buffers), bitwise as MoveData one by
  // one: each collective's messages under its own tag, each fitting one
  // message (kMaxBatchOpBytes), the peers' blocks of the reductions in
  // scratch_ side by side.
  absl::Status MoveBatch(absl::Span<const CollectiveArgs> ops, absl::Time deadline);
  // Reduce-scatter over blocks: block p is [offset(p), offset(p)+length(p))
  // elements of `send`; the sum of block rank() goes to `out`.
  absl::Status ReduceScatterBlocks(const CollectiveArgs& args, const char* send,
                                   const std::vector<int64_t>& offsets,
                                   const std::vector<int64_t>& lengths, char* out,
                                   absl::Time deadline);
  // All-gather over blocks: `mine` (length(rank()) elements) goes to block
  // rank() of `recv` on every rank.
  absl::Status AllGatherBlocks(const CollectiveArgs& args, const char* mine, char* recv,
                               const std::vector<int64_t>& offsets,
                               const std::vector<int64_t>& lengths, absl::Time deadline);

  // The hierarchical versions of the two (mpi_hierarchical.cc), used for a
  // collective's data when hierarchy_.enabled: the same bits, fewer bytes
  // across nodes. Reduce-scatter: the ranks of a node send each block to
  // one rank of their node that carries it; the carriers of a block form a
  // chain over the nodes in node order, each adding its node's blocks in
  // rank order to the partial sum (in AccumulatorDType) from the node
  // before; the last node's carrier rounds and sends it to the block's
  // owner. Chunks pipeline along the chain. All-gather: a block goes once to
  // each other node (to the rank in the sender's slot there), which passes
  // it on within its node.
  absl::Status HierarchicalReduceScatter(const CollectiveArgs& args, const char* send,
                                         const std::vector<int64_t>& offsets,
                                         const std::vector<int64_t>& lengths, char* out,
                                         absl::Time deadline);
  absl::Status HierarchicalAllGather(const CollectiveArgs& args, const char* mine, char* recv,
                                     const std::vector<int64_t>& offsets,
                                     const std::vector<int64_t>& lengths, absl::Time deadline);
  // Decides hierarchy_ from processes_ and options().topology.
  void PlanHierarchy();
  // Whether a reduce-scatter over blocks of `lengths` runs hierarchically:
  // always under kHierarchical (when enabled), under kAuto only when the
  // chain sends fewer bytes across nodes than the flat path (its partial
  // sums travel unrounded: fp32 for a 16-bit dtype, so 2 nodes of 2 ranks
  // move more bf16 bytes in a chain than flat). The all-gather never sends
  // more, so it follows hierarchy_.enabled alone.
  bool ChainPays(DType dtype, const std::vector<int64_t>& lengths) const;

  // "rank 2 (pid 4242 on node7)".
  std::string DescribeRank(int peer) const;
  // What this rank can tell of `peer` at a timeout: its process state on
  // this machine (process_probe.h), else what its heartbeats say.
  std::string PeerState(int peer) const;
  // The first of `peers` whose process is gone, or -1.
  int FindDeadPeer(const std::set<int>& peers) const;

  MPI_Comm comm_;
  const uint64_t instance_;
  // Every rank's process, in rank order (exchanged at creation).
  const std::vector<ProcessIdentity> processes_;
  // How long a peer on another node may send no heartbeat before a
  // collective that waits for it fails (HeartbeatLimit of the timeout).
  const absl::Duration heartbeat_limit_;
  int seq_bits_ = 0;
  int instance_bits_ = 0;
  std::atomic<bool> abort_{false};
  // Reduce-scatter chunks from peers (a batch: the peers' blocks of all its
  // reductions).
  std::vector<char> scratch_;
  // The descriptor exchange's buffer: every rank's kBatchSlots descriptors,
  // rank after rank (this rank's are the ones sent).
  std::vector<Descriptor> peer_descriptors_;
  // A receive could not be cancelled (a transfer from a stopped or dead peer
  // was under way): MPI may still write into its buffer, so the buffers this
  // communicator owns must outlive it.
  bool receives_in_limbo_ = false;
  // Requests were given up on (Abandon): the destructor keeps comm_.
  bool requests_abandoned_ = false;
  std::unique_ptr<MpiPointToPoint> p2p_;

  // The nodes as the hierarchical collectives see them (PlanHierarchy).
  struct Hierarchy {
    bool enabled = false;
    std::string path;                        // collective_path()
    std::vector<int> node_of;                // [rank] -> node
    std::vector<int> local_index;            // [rank] -> position on its node
    std::vector<std::vector<int>> ranks_on;  // [node] -> its ranks, ascending
    // The rank of `node` in the same slot as local index `slot` (modulo the
    // node's size): where a block of that slot enters the node.
    int SlotRank(int node, int slot) const {
      const std::vector<int>& ranks = ranks_on[node];
      return ranks[slot % static_cast<int>(ranks.size())];
    }
  };
  Hierarchy hierarchy_;
  std::atomic<int64_t> intra_node_bytes_{0};
  std::atomic<int64_t> inter_node_bytes_{0};
};

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_MPI_COMMUNICATOR_H_
