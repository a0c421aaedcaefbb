// Batching small collectives: a backend whose per-collective cost is mostly
// latency (nccl: a descriptor exchange, a host round trip and kernel
// launches per collective) runs several queued small collectives as one
// batch — one descriptor exchange and one NCCL group — when the caller has
// issued them without waiting in between.
//
// Every rank must cut the same batches, but each rank's queue holds what
// that rank has issued so far. So each rank offers the batchable prefix of
// its queue (BatchablePrefix), the ranks exchange their offers, and the
// batch is the shortest offer (AgreeOnBatch); what a rank offered beyond it
// stays queued for the next batch. The result is that of running the
// collectives one by one in issue order: a batch never holds a collective
// that reads or writes memory an earlier one of the batch writes.
#ifndef ZEROSHARD_ENGINE_SRC_COMM_COLLECTIVE_BATCH_H_
#define ZEROSHARD_ENGINE_SRC_COMM_COLLECTIVE_BATCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/src/comm/comm_op.h"

namespace zeroshard {
namespace internal {

// At most this many collectives in one batch.
inline constexpr int kMaxBatchOps = 16;
// A collective moving more bytes than this (its whole buffer: size() blocks
// for reduce-scatter and all-gather) is not small: it runs alone.
inline constexpr uint64_t kMaxBatchOpBytes = uint64_t{1} << 20;
// Descriptors each rank sends in a batch exchange: a header (kind -1, count
// = collectives offered) and one per collective offered.
inline constexpr int kBatchSlots = 1 + kMaxBatchOps;

// Bytes of the largest buffer `args` touches on a group of `size` ranks.
uint64_t CollectiveBytes(const CollectiveArgs& args, int size);

// How many of `ops` (this rank's queue, in issue order) may run as one
// batch on a group of `size` ranks: 1 when ops[0] is not small or not a
// data collective; else the longest prefix of at most `max_ops` small
// all-reduces, reduce-scatters, all-gathers and broadcasts in which no
// collective reads or writes memory that an earlier one writes, nor writes
// memory an earlier one reads. 0 only for an empty `ops`.
int BatchablePrefix(absl::Span<const CollectiveArgs> ops, int size, int max_ops);

// Fills the kBatchSlots descriptors this rank sends for `ops`
// (ops.size() <= kMaxBatchOps); every slot carries `instance` (the
// communicator's number where the backend has one: ToDescriptor).
void PackBatchOffer(absl::Span<const CollectiveArgs> ops, CollectiveDescriptor* slots,
                    uint64_t instance = 0);

// `all_slots`: every rank's kBatchSlots descriptors, rank after rank;
// `mine`: what this rank (`self`) offered. Returns the number of collectives
// every rank runs now (the shortest offer, >= 1), or FailedPrecondition when
// a rank's collective at a position below that differs from this rank's
// (kind, count, dtype, root, tag or sequence number), naming the rank, both
// collectives and `where` (the error prefix, "nccl comm rank 0"), in the
// words of the local and mpi backends' check of a single collective.
absl::StatusOr<int> AgreeOnBatch(const CollectiveDescriptor* all_slots, int size, int self,
                                 absl::Span<const CollectiveArgs> mine, const std::string& where);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_COLLECTIVE_BATCH_H_
