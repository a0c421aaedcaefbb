// The `mpi` backend's batches of small collectives (collective_batch.h).
//
// Run one at a time, a small collective costs a descriptor all-to-all and
// one or two data rounds, and every round waits until the progress threads
// of both ends have polled; when they share their cores with a busy trainer
// a poll can be a scheduler slice away. A batch pays for its descriptors and
// data in three rounds whatever its length: the exchange of the offers (also
// the barrier), one round for the messages that need nothing from another
// collective (the reduce-scatter parts of the all-reduces and
// reduce-scatters, the all-gathers, the broadcasts), then, after the sums,
// one round for the all-gather halves of the all-reduces.
//
// Same bits as one at a time: each element of a sum is added in rank order
// by the same routine (SumInRankOrder) from the same blocks, and each
// collective's messages keep their own tag (Tag), so they never meet another
// collective's; between two ranks, messages of one tag match in the order
// they were posted, which keeps an all-reduce's two rounds apart as in
// MoveData.
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/comm/collective_batch.h"
#include "engine/src/comm/mpi_communicator.h"
#include "engine/src/comm/reduce.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {

bool IsReduction(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
}

// One collective of a batch: its blocks in elements (all-reduce: the pieces
// each rank sums, PieceRange; reduce-scatter and all-gather: one block of
// `count` per rank) and, for a reduction, where the peers' contributions to
// this rank's block land in scratch_.
struct BatchedCollective {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;
  int64_t element_bytes = 0;
  size_t scratch_offset = 0;  // size() - 1 slots of lengths[rank()] elements
};

}  // namespace

absl::StatusOr<int> MpiCommunicator::RunBatch(absl::Span<const CollectiveArgs> offered,
                                              absl::Time deadline) {
  // Every rank agrees on n before data moves: the shortest offer.
  ZS_ASSIGN_OR_RETURN(const int n, ExchangeDescriptors(offered, deadline));
  const absl::Span<const CollectiveArgs> ops = offered.subspan(0, n);
  // A batch of one moves as RunCollective moves it: a rank that offered one
  // collective ran it through RunCollective, and the hierarchical path
  // (MoveData across nodes) sends other messages than a flat batch.
  if (n == 1) {
    ZS_RETURN_IF_ERROR(MoveData(ops[0], deadline));
    return n;
  }
  ZS_RETURN_IF_ERROR(MoveBatch(ops, deadline));
  return n;
}

absl::Status MpiCommunicator::MoveBatch(absl::Span<const CollectiveArgs> ops, absl::Time deadline) {
  const int world = size();
  const int me = rank();
  // The progress loop offers only what BatchablePrefix admits; MoveBatch
  // relies on it (one message per transfer, independent buffers).
  if (BatchablePrefix(ops, world, kMaxBatchOps) != static_cast<int>(ops.size())) {
    return absl::InternalError(absl::StrFormat(
        "%s: a batch of %d collectives holds one that cannot be batched (a bug in the "
        "communicator)",
        Where(ops[0]), ops.size()));
  }
  std::vector<BatchedCollective> batch(ops.size());
  constexpr size_t kSlotAlign = 64;
  size_t scratch_bytes = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveArgs& args = ops[i];
    BatchedCollective& c = batch[i];
    c.offsets.resize(world);
    c.lengths.resize(world);
    c.element_bytes = static_cast<int64_t>(DTypeSize(args.dtype));
    for (int p = 0; p < world; ++p) {
      if (args.kind == CollectiveKind::kAllReduce) {
        PieceRange(args.count, world, p, &c.offsets[p], &c.lengths[p]);
      } else {
        c.offsets[p] = p * args.count;
        c.lengths[p] = args.count;
      }
    }
    if (IsReduction(args.kind)) {
      // Each collective's slots start on a cache line: a batch mixes dtypes,
      // and a 2-byte block of odd length would leave the next fp32 or fp64
      // slot misaligned (UBSan in CI). scratch_'s own storage comes from
      // operator new (16-byte aligned).
      scratch_bytes = (scratch_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
      c.scratch_offset = scratch_bytes;
      scratch_bytes += static_cast<size_t>(world - 1) * c.lengths[me] * c.element_bytes;
    }
  }
  // Before any receive is posted: scratch_ must not move while MPI writes it.
  if (scratch_.size() < scratch_bytes) scratch_.resize(scratch_bytes);
  auto slot = [&](const BatchedCollective& c, int peer) {
    const int index = peer < me ? peer : peer - 1;  // no slot for this rank
    return scratch_.data() + c.scratch_offset +
           static_cast<size_t>(index) * c.lengths[me] * c.element_bytes;
  };

  // Round 1: every message that needs nothing from another collective.
  // Receives first, so that early messages land in place.
  Requests requests;
  absl::Status posted;
  for (size_t i = 0; i < ops.size() && posted.ok(); ++i) {
    const CollectiveArgs& args = ops[i];
    const BatchedCollective& c = batch[i];
    const int tag = Tag(args);
    char* recv = static_cast<char*>(args.recv);
    for (int p = 0; p < world && posted.ok(); ++p) {
      if (p == me) continue;
      switch (args.kind) {
        case CollectiveKind::kAllReduce:
        case CollectiveKind::kReduceScatter:
          if (c.lengths[me] == 0) break;
          posted = PostRecv(requests, slot(c, p), c.lengths[me] * c.element_bytes, p, tag, args);
          break;
        case CollectiveKind::kAllGather:
          if (c.lengths[p] == 0) break;
          posted = PostRecv(requests, recv + c.offsets[p] * c.element_bytes,
                            c.lengths[p] * c.element_bytes, p, tag, args);
          break;
        case CollectiveKind::kBroadcast:
          if (p != args.root) break;
          posted = PostRecv(requests, recv, args.count * c.element_bytes, p, tag, args);
          break;
        case CollectiveKind::kBarrier:
          break;
      }
    }
  }
  for (size_t i = 0; i < ops.size() && posted.ok(); ++i) {
    const CollectiveArgs& args = ops[i];
    const BatchedCollective& c = batch[i];
    const int tag = Tag(args);
    const char* send = static_cast<const char*>(args.send);
    for (int p = 0; p < world && posted.ok(); ++p) {
      if (p == me) continue;
      switch (args.kind) {
        case CollectiveKind::kAllReduce:
        case CollectiveKind::kReduceScatter:
          if (c.lengths[p] == 0) break;
          posted = PostSend(requests, send + c.offsets[p] * c.element_bytes,
                            c.lengths[p] * c.element_bytes, p, tag, args);
          break;
        case CollectiveKind::kAllGather:
          posted = PostSend(requests, send, args.count * c.element_bytes, p, tag, args);
          break;
        case CollectiveKind::kBroadcast:
          if (me != args.root) break;
          posted = PostSend(requests, send, args.count * c.element_bytes, p, tag, args);
          break;
        case CollectiveKind::kBarrier:
          break;
      }
    }
    if (args.kind == CollectiveKind::kAllGather) {
      char* own = static_cast<char*>(args.recv) + c.offsets[me] * c.element_bytes;
      if (own != send) std::memcpy(own, send, args.count * c.element_bytes);
    }
  }
  if (!posted.ok()) {
    Abandon(requests);
    return posted;
  }
  ZS_RETURN_IF_ERROR(Complete(requests, ops[0], deadline, Phase::kData));

  // The sums, each in rank order. Every send of round 1 has completed, so
  // writing an all-reduce's piece in place (send == recv) is safe; a
  // reduce-scatter in place reads its own block before writing it
  // (SumInRankOrder).
  std::vector<const void*> inputs(world);
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveArgs& args = ops[i];
    const BatchedCollective& c = batch[i];
    if (!IsReduction(args.kind) || c.lengths[me] == 0) continue;
    const char* send = static_cast<const char*>(args.send);
    for (int p = 0; p < world; ++p) {
      inputs[p] = p == me ? send + c.offsets[me] * c.element_bytes : slot(c, p);
    }
    char* recv = static_cast<char*>(args.recv);
    void* destination =
        args.kind == CollectiveKind::kAllReduce ? recv + c.offsets[me] * c.element_bytes : recv;
    SumInRankOrder(inputs.data(), world, &destination, 1, c.lengths[me], args.dtype);
  }

  // Round 2: the all-gather halves of the all-reduces.
  Requests gather;
  for (size_t i = 0; i < ops.size() && posted.ok(); ++i) {
    const CollectiveArgs& args = ops[i];
    if (args.kind != CollectiveKind::kAllReduce) continue;
    const BatchedCollective& c = batch[i];
    char* recv = static_cast<char*>(args.recv);
    for (int p = 0; p < world && posted.ok(); ++p) {
      if (p == me || c.lengths[p] == 0) continue;
      posted = PostRecv(gather, recv + c.offsets[p] * c.element_bytes,
                        c.lengths[p] * c.element_bytes, p, Tag(args), args);
    }
  }
  for (size_t i = 0; i < ops.size() && posted.ok(); ++i) {
    const CollectiveArgs& args = ops[i];
    if (args.kind != CollectiveKind::kAllReduce) continue;
    const BatchedCollective& c = batch[i];
    if (c.lengths[me] == 0) continue;
    const char* mine = static_cast<const char*>(args.recv) + c.offsets[me] * c.element_bytes;
    for (int p = 0; p < world && posted.ok(); ++p) {
      if (p == me) continue;
      posted = PostSend(gather, mine, c.lengths[me] * c.element_bytes, p, Tag(args), args);
    }
  }
  if (!posted.ok()) {
    Abandon(gather);
    return posted;
  }
  return Complete(gather, ops[0], deadline, Phase::kData);
}

}  // namespace internal
}  // namespace zeroshard
