// Communicator: the collectives the engine issues between ranks.
//
// Every collective is asynchronous: it returns a CommHandle at once and runs
// in issue order on the communicator's progress thread. Buffers must stay
// valid and untouched (send) / unread (recv) until the handle's Wait()
// returns. Every wait has a timeout: a peer that never arrives, or that
// left the group, becomes an error naming the rank, never a hang. Where the
// transport can tell, a dead peer fails the collective at once and is told
// apart from a stuck one (local: always; mpi: peers on the same machine, see
// docs/communicator.md). After an error the communicator is poisoned: every
// later call fails fast. A failed job should end with AbortJob(), not with
// an orderly shutdown that a dead or stuck peer would block; on MPI the
// transport may still read or write the buffers of the failed collective
// (a transfer from a stopped peer cannot always be cancelled), so they must
// not be freed or reused before the process ends.
//
// Status codes of a collective (CommHandle::Wait):
//   InvalidArgument     bad arguments (negative count, null buffer, overlap)
//   FailedPrecondition  the ranks issued different collectives (kind, count,
//                       dtype, root or tag), naming both ranks
//   DeadlineExceeded    a peer did not arrive within the timeout, naming it
//                       and what is known of it (stuck, stopped, running)
//   Aborted             a peer left the group, failed or died, naming it
//   Cancelled           the communicator was destroyed while waiting
//   Internal            the transport (MPI, NCCL, CUDA) returned an error code
//
// Reductions are sums. They are deterministic and bit-reproducible on every
// backend: element i of the result is ((x_0[i] + x_1[i]) + x_2[i]) + ...
// in rank order, accumulated in fp32 for fp32/bf16/fp16 (rounded once, to
// nearest even, for the 16-bit types), in fp64 for fp64 and int64 for int64.
#ifndef ZEROSHARD_COMMUNICATOR_H_
#define ZEROSHARD_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"

namespace zeroshard {

class Device;

namespace internal {
struct CommOpState;
}  // namespace internal

// Completion of one asynchronous collective. Movable, not copyable. A
// default-constructed handle is already complete and OK.
class CommHandle {
 public:
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<internal::CommOpState> state);
  CommHandle(CommHandle&&) noexcept = default;
  CommHandle& operator=(CommHandle&&) noexcept = default;
  ~CommHandle();

  // Blocks until the collective completed (OK) or failed (its error: peer
  // timeout, peer left, bad arguments, transport failure). Idempotent.
  absl::Status Wait();
  // True once Wait() would not block.
  bool Ready() const;
  // True when this handle refers to an issued collective not yet waited on.
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<internal::CommOpState> state_;
  // The result of the first Wait(), kept so later Wait() calls return it
  // after state_ was released.
  absl::Status waited_status_;
};

// The environment variable that sets the collective timeout when
// CommOptions::timeout is left at zero: seconds ("30", "2.5") or a duration
// with a unit ("90s", "2m").
inline constexpr char kCommTimeoutEnvVar[] = "ZS_COMM_TIMEOUT";
// The timeout when neither CommOptions::timeout nor ZS_COMM_TIMEOUT says.
inline constexpr absl::Duration kDefaultCommTimeout = absl::Seconds(120);
// The range of a collective timeout, wherever it comes from
// (CommOptions::timeout, ZS_COMM_TIMEOUT, mlp_demo --comm-timeout).
// At least 100 ms: a healthy collective on a loaded machine waits tens of
// milliseconds for a peer that the scheduler has not run (4 ranks on 2
// cores, the mpi backend's progress thread sharing the trainer's core; the
// peer probe alone looks every 20 ms), so a shorter timeout fails healthy
// runs, and 1 ns failed every collective at once. The tests wait 0.3 s and
// more. At most 10^6 s (11.6 days): longer is no timeout at all.
inline constexpr absl::Duration kMinCommTimeout = absl::Milliseconds(100);
inline constexpr absl::Duration kMaxCommTimeout = absl::Seconds(1000000);

// How the mpi backend moves the data of a large reduce-scatter, all-gather
// or all-reduce in a group that spans nodes (docs/multinode.md). Every
// choice gives the same bits; they differ in how many bytes cross nodes.
enum class CollectiveTopology {
  // Hierarchical where it pays: the group spans nodes, some node has more
  // than one of its ranks, and each node's ranks are consecutive. Else flat.
  kAuto,
  // Rank to rank: every rank sends each other rank its part directly.
  kFlat,
  // Hierarchical whenever the group spans nodes whose ranks are
  // consecutive, one rank per node included (for tests and benchmarks).
  kHierarchical,
};

// "auto", "flat", "hierarchical".
const char* CollectiveTopologyName(CollectiveTopology topology);

// Bytes this rank has sent so far (collectives, Send and Recv), split by
// where the peer is (Communicator::traffic).
struct CommTraffic {
  int64_t intra_node_bytes = 0;  // to ranks on this rank's node
  int64_t inter_node_bytes = 0;  // to ranks on other nodes
};

struct CommOptions {
  // How long one collective may wait for its peers before it fails. Zero:
  // $ZS_COMM_TIMEOUT when set, else kDefaultCommTimeout (120 s).
  absl::Duration timeout = absl::ZeroDuration();
  // RunLocalRanks only: once one rank has failed, how long the other ranks
  // may take to return before RunLocalRanks stops waiting for them.
  absl::Duration local_grace = absl::Seconds(2);
  // Local groups only: the device whose memory the collectives' buffers are
  // (every rank's buffers on this one device: ranks as threads on one GPU).
  // Null or a CPU device: host memory. A CUDA device: copies and rank-order
  // sums run on the GPU, with the same bits as on the host, for at most 8
  // ranks. Must outlive the group. The mpi backend refuses a CUDA device.
  Device* device = nullptr;
  // mpi only: flat or hierarchical collectives across nodes (see
  // CollectiveTopology); Split groups inherit it.
  CollectiveTopology topology = CollectiveTopology::kAuto;
};

// The timeout `options` resolves to (see CommOptions::timeout).
// InvalidArgument for a timeout outside [kMinCommTimeout, kMaxCommTimeout]
// (negative included), or for a ZS_COMM_TIMEOUT that ParseCommTimeout
// refuses (the message names the variable).
absl::StatusOr<absl::Duration> ResolveCommTimeout(const CommOptions& options);

// A timeout as a person writes it: seconds ("30", "2.5") or a duration
// with a unit ("90s", "2m", "500ms"), within [kMinCommTimeout,
// kMaxCommTimeout]. `what` says where the text came from ("environment
// variable ZS_COMM_TIMEOUT", "flag --comm-timeout"). InvalidArgument
// quoting the text: too short or too long (with the range and why), or not
// a timeout at all. ZS_COMM_TIMEOUT and mlp_demo --comm-timeout both go
// through it.
absl::StatusOr<absl::Duration> ParseCommTimeout(absl::string_view text, absl::string_view what);

// Which ranks of a communicator share a node: a machine, as the backend
// knows it (docs/multinode.md). Nodes are numbered 0, 1, ... in the order of
// their lowest rank.
struct NodeLayout {
  std::vector<int> node_of_rank;        // [rank] -> node
  std::vector<std::string> node_names;  // [node] -> its host name, for messages
  std::string source;                   // how the backend learned it

  int num_nodes() const { return static_cast<int>(node_names.size()); }
  // The ranks on `node`, in rank order (empty for a node out of range).
  std::vector<int> RanksOn(int node) const;
  // Ranks on the fullest node.
  int max_ranks_per_node() const;
  // "2 nodes x 2 ranks (MPI_COMM_TYPE_SHARED): zsc-node0 ranks 0-1;
  // zsc-node1 ranks 2-3" ("1 node x 4 ranks ...", "3 nodes, 1-2 ranks
  // each ..." when they differ).
  std::string Describe() const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local", "mpi" or "nccl".
  virtual std::string backend() const = 0;
  // The memory its collectives' buffers must be: host memory (kCpu) for
  // local and mpi, the GPU's (kCuda) for nccl. The engine refuses a device
  // of another kind.
  virtual DeviceKind memory_kind() const { return DeviceKind::kCpu; }
  // The device whose memory the collectives move, when the group was made
  // for one (a local group with CommOptions::device); null otherwise. The
  // engine refuses a device of the same kind with another name (another
  // GPU: the sum kernels could not read it).
  virtual const Device* memory_device() const { return nullptr; }
  // Wall time this rank's collectives have been running so far, summed over
  // collectives: from the moment one starts on the progress thread (its
  // predecessors done) to its completion, waits for peers included. With
  // the engine's exposed wait it splits communication into exposed and
  // hidden (StepTimes::comm_busy). Zero for a backend that does not count.
  virtual absl::Duration busy_time() const { return absl::ZeroDuration(); }

  // Every collective takes an optional `tag`: a label of what the data is
  // (the engine passes 1 + the unit index), compared across ranks like the
  // kind, count and dtype, so two ranks that move different data of the same
  // size fail with FailedPrecondition instead of mixing it. 0 = no label.

  // Sum of `count` elements over all ranks into `recv` on every rank.
  // `send == recv` (in place) is allowed.
  virtual CommHandle AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                               uint64_t tag) = 0;
  // `send` holds size()*recv_count elements; rank r receives the sum of every
  // rank's block r. `recv` may alias block rank() of `send` (in place).
  virtual CommHandle ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                                   uint64_t tag) = 0;
  // Every rank contributes send_count elements; `recv` (size()*send_count)
  // gets them in rank order. `send` may alias block rank() of `recv`.
  virtual CommHandle AllGather(const void* send, void* recv, int64_t send_count, DType dtype,
                               uint64_t tag) = 0;
  // `root`'s buffer is copied to every rank's `buf`.
  virtual CommHandle Broadcast(void* buf, int64_t count, DType dtype, int root, uint64_t tag) = 0;
  virtual CommHandle Barrier() = 0;

  // AllReduce / ReduceScatter that start only once the device work recorded
  // in `ready` has finished (the accumulation that wrote `send`, say): the
  // caller does not wait, the communicator does, before the collective runs,
  // so the device and the communicator overlap with the caller's thread.
  // `ready` null: no wait. Backends with a progress thread (local, mpi,
  // nccl) wait there; this default waits on the caller's thread.
  virtual CommHandle AllReduceAfter(std::shared_ptr<Event> ready, const void* send, void* recv,
                                    int64_t count, DType dtype, uint64_t tag);
  virtual CommHandle ReduceScatterAfter(std::shared_ptr<Event> ready, const void* send, void* recv,
                                        int64_t recv_count, DType dtype, uint64_t tag);

  // Point-to-point (docs/communicator.md, "Send, Recv and Split"). Send
  // `count` elements of `buf` to rank `peer`; Recv `count` elements from
  // `peer` into `buf`. Messages are matched by (sender, receiver, tag) in
  // issue order: the k-th Send from a to b with tag t meets b's k-th Recv
  // from a with tag t; a count or dtype that differs fails both with
  // FailedPrecondition naming both ranks. Both are asynchronous and neither
  // waits for the other operations this rank issued (collectives or
  // point-to-point) to complete, so two ranks may each Send to the other and
  // then Recv without deadlock (a pipeline's send-forward/recv-backward).
  // `buf` must stay valid and untouched (Send) / unread (Recv) until Wait()
  // returns. Same timeouts and named-rank errors as the collectives (counted
  // from the call); a failure poisons the communicator. peer == rank(), a
  // peer out of range, a negative count or a null buffer with count > 0 is
  // InvalidArgument. Sends and receives are numbered apart from the
  // collectives ("Send #3 to rank 2 ..."). The nccl backend runs them in
  // issue order with its collectives, which keeps the matching but not the
  // no-deadlock promise (docs/communicator.md). Backends without
  // point-to-point return a handle that fails with Unimplemented.
  virtual CommHandle Send(const void* buf, int64_t count, DType dtype, int peer, uint64_t tag);
  virtual CommHandle Recv(void* buf, int64_t count, DType dtype, int peer, uint64_t tag);

  // Collective (like MPI_Comm_split): every rank calls it; ranks that pass
  // the same `color` (>= 0) form a new communicator, ordered by `key`, ties
  // by their rank here. The new group has this communicator's backend,
  // options and memory, its own progress thread and sequence numbers, and
  // must not outlive this one. A rank that passes color < 0 joins no group
  // and gets null. Errors as for a collective (timeout naming the ranks that
  // did not arrive); Unimplemented for a backend without it. Errors of the
  // new group name it: "local comm rank 1 of group 3 (parent rank 5)".
  // Blocks until the group exists.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key);

  // Which ranks share a node. mpi: MPI's shared-memory split
  // (MPI_COMM_TYPE_SHARED, learned at creation; a Split group keeps its
  // members' nodes); local: one node; nccl: one node, assumed (the source
  // says so).
  virtual NodeLayout node_layout() const;
  // The bytes this rank has sent since creation, to ranks on its node and
  // to ranks on other nodes (node_layout's nodes): its collectives' and its
  // Sends' data, headers and the descriptor exchange included (a Recv sends
  // its header too). mpi counts; the other backends return zeros.
  virtual CommTraffic traffic() const { return {}; }
  // Whether large collectives run hierarchically over this group's nodes
  // (CommOptions::topology), and why: "hierarchical: 2 nodes x 2 ranks",
  // "flat: one node". Every backend but mpi: flat.
  virtual std::string collective_path() const { return "flat: " + backend() + " backend"; }

  // The same without a tag.
  CommHandle AllReduce(const void* send, void* recv, int64_t count, DType dtype) {
    return AllReduce(send, recv, count, dtype, 0);
  }
  CommHandle ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype) {
    return ReduceScatter(send, recv, recv_count, dtype, 0);
  }
  CommHandle AllGather(const void* send, void* recv, int64_t send_count, DType dtype) {
    return AllGather(send, recv, send_count, dtype, 0);
  }
  CommHandle Broadcast(void* buf, int64_t count, DType dtype, int root) {
    return Broadcast(buf, count, dtype, root, 0);
  }

  // Blocking conveniences: issue, then Wait().
  absl::Status AllReduceSync(const void* send, void* recv, int64_t count, DType dtype) {
    return AllReduce(send, recv, count, dtype).Wait();
  }
  absl::Status AllGatherSync(const void* send, void* recv, int64_t count, DType dtype) {
    return AllGather(send, recv, count, dtype).Wait();
  }
  absl::Status BarrierSync() { return Barrier().Wait(); }
};

// Creates a group of `world_size` in-process ranks (one communicator each,
// meant to be driven by one thread each) that share memory. The returned
// vector owns them; element r has rank r.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLocalGroup(
    int world_size, CommOptions options = {});

// Runs `fn(rank, comm)` on one thread per rank of a fresh local group and
// returns the first error any rank returned, prefixed with "rank R: ".
//
// A rank whose `fn` returns leaves the group at once: an error marks it gone,
// so every collective its peers have not yet committed fails now (Aborted,
// naming it) instead of waiting out the timeout; an OK return lets its peers
// finish the collectives it issued, and fails the later ones the same way.
// Once a rank has failed, the others get `options.local_grace` to return;
// ranks still running after that (blocked outside the communicator) are
// named in the returned error and their threads are detached: they keep
// running with whatever `fn` captured, so the caller must then end the
// process (AbortJob) rather than free what `fn` uses. Without a failure
// RunLocalRanks waits for every rank.
absl::Status RunLocalRanks(int world_size,
                           const std::function<absl::Status(int rank, Communicator& comm)>& fn,
                           CommOptions options = {});

// True when this build has the MPI backend.
bool HaveMpi();
// Initialises MPI (thread level at least SERIALIZED) if needed and returns a
// communicator over MPI_COMM_WORLD. Unimplemented in builds without MPI.
absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(CommOptions options = {});
// Finalises MPI if this process initialised it. Call once at the end of a
// successful main; after a failure call AbortJob instead (MPI_Finalize waits
// for every peer, and a dead or stuck one never comes).
void FinalizeMpi();

// True when this build has the nccl backend (CUDA and NCCL were found).
bool HaveNccl();

// The `nccl` backend: collectives between GPUs through NCCL, one GPU per rank
// (docs/communicator.md, "The nccl backend"). Every buffer passed to its
// collectives must be CUDA device memory of `device`'s GPU (InvalidArgument
// otherwise), written completely before the collective is issued (the
// communicator works on a CUDA stream of its own, which does not wait for
// the caller's streams); after Wait() returns OK the result is in device
// memory and any stream may read it. Sums are computed by zeroshard's own
// kernel, not by NCCL's reductions, so they have the bits of the local and
// mpi backends (the rank-order contract above). NCCL cannot say which peer
// is missing: a timeout names the ranks it waited for and what is known of
// each; a peer process on this machine that died fails the wait at once,
// naming it (as on the mpi backend).
//
// CreateNcclCommunicator: one rank per process over MPI_COMM_WORLD (rank 0
// makes the NCCL id and broadcasts it over MPI, which it initialises if
// needed), launched as `mpirun -np N` with one GPU per rank. Collective:
// every rank must call it. `device` must be a CUDA device (InvalidArgument
// for another kind, NotFound for a GPU this machine lacks); Unimplemented in
// builds without NCCL, or without MPI; DeadlineExceeded when not every rank
// joined within the timeout. The device must outlive the communicator.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Device& device,
                                                                     CommOptions options = {});

// Runs `fn(rank, comm)` on one thread per GPU of `devices` (rank r on
// devices[r]; distinct CUDA devices, as NCCL needs one GPU per rank) and
// returns the error of the rank that failed first, prefixed with "rank R: ".
// Waits for every rank: a rank whose `fn` fails marks itself, so its peers'
// waiting collectives fail at once (Aborted, naming it); collectives it never
// issued after an OK return time out (CommOptions::timeout).
// InvalidArgument for an empty list, a null, non-CUDA or repeated device;
// NotFound for a GPU this machine lacks; Unimplemented without NCCL.
absl::Status RunNcclLocalRanks(const std::vector<Device*>& devices,
                               const std::function<absl::Status(int rank, Communicator& comm)>& fn,
                               CommOptions options = {});

// Ends the whole job after a failure, once the caller has printed its error:
// flushes stdout and stderr, then MPI_Abort on MPI_COMM_WORLD when MPI is
// initialised (the launcher then ends every rank and exits non-zero), else
// std::_Exit. For main() in tools and examples only: a library never ends
// its host process.
[[noreturn]] void AbortJob(int exit_code);

}  // namespace zeroshard

#endif  // ZEROSHARD_COMMUNICATOR_H_
