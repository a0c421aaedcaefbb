#include "engine/src/comm/collective_batch.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"

namespace zeroshard {
namespace internal {
namespace {

struct Range {
  uintptr_t begin = 0;
  uintptr_t end = 0;  // exclusive; begin == end: empty
};

bool Overlap(const Range& a, const Range& b) {
  return a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end;
}

Range RangeOf(const void* p, uint64_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  return {begin, begin + static_cast<uintptr_t>(bytes)};
}

// The bytes a collective reads (send) and writes (recv) on this rank.
void Footprint(const CollectiveArgs& args, int size, Range* reads, Range* writes) {
  const uint64_t block = static_cast<uint64_t>(args.count) * DTypeSize(args.dtype);
  const uint64_t whole = block * static_cast<uint64_t>(size);
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
      *reads = RangeOf(args.send, block);
      *writes = RangeOf(args.recv, block);
      return;
    case CollectiveKind::kReduceScatter:
      *reads = RangeOf(args.send, whole);
      *writes = RangeOf(args.recv, block);
      return;
    case CollectiveKind::kAllGather:
      *reads = RangeOf(args.send, block);
      *writes = RangeOf(args.recv, whole);
      return;
    case CollectiveKind::kBroadcast:  // the root reads it, the others write it
      *reads = RangeOf(args.send, block);
      *writes = RangeOf(args.recv, block);
      return;
    case CollectiveKind::kBarrier:
      *reads = *writes = Range{};
      return;
  }
}

bool IsDataCollective(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter ||
         kind == CollectiveKind::kAllGather || kind == CollectiveKind::kBroadcast;
}

bool Small(const CollectiveArgs& args, int size) {
  return IsDataCollective(args.kind) && args.count > 0 &&
         CollectiveBytes(args, size) <= kMaxBatchOpBytes;
}

}  // namespace

uint64_t CollectiveBytes(const CollectiveArgs& args, int size) {
  const uint64_t block =
      static_cast<uint64_t>(std::max<int64_t>(args.count, 0)) * DTypeSize(args.dtype);
  const bool whole =
      args.kind == CollectiveKind::kReduceScatter || args.kind == CollectiveKind::kAllGather;
  return whole ? block * static_cast<uint64_t>(size) : block;
}

int BatchablePrefix(absl::Span<const CollectiveArgs> ops, int size, int max_ops) {
  if (ops.empty()) return 0;
  const int limit = std::min<int>(static_cast<int>(ops.size()), std::max(max_ops, 1));
  if (!Small(ops[0], size)) return 1;
  std::vector<Range> reads, writes;
  int n = 0;
  for (; n < limit; ++n) {
    const CollectiveArgs& op = ops[n];
    if (!Small(op, size)) break;
    Range r, w;
    Footprint(op, size, &r, &w);
    bool conflict = false;
    for (size_t j = 0; j < reads.size() && !conflict; ++j) {
      // Read-after-write, write-after-write, write-after-read.
      conflict = Overlap(r, writes[j]) || Overlap(w, writes[j]) || Overlap(w, reads[j]);
    }
    if (conflict) break;
    reads.push_back(r);
    writes.push_back(w);
  }
  return std::max(n, 1);
}

void PackBatchOffer(absl::Span<const CollectiveArgs> ops, CollectiveDescriptor* slots,
                    uint64_t instance) {
  const int n = std::min<int>(static_cast<int>(ops.size()), kMaxBatchOps);
  const auto number = static_cast<int64_t>(instance);
  slots[0] = CollectiveDescriptor{-1, n, 0, 0, 0, number, 0};
  for (int i = 0; i < kMaxBatchOps; ++i) {
    slots[1 + i] =
        i < n ? ToDescriptor(ops[i], instance) : CollectiveDescriptor{-1, 0, 0, 0, 0, number, 0};
  }
}

absl::StatusOr<int> AgreeOnBatch(const CollectiveDescriptor* all_slots, int size, int self,
                                 absl::Span<const CollectiveArgs> mine, const std::string& where) {
  int n = static_cast<int>(mine.size());
  for (int peer = 0; peer < size; ++peer) {
    const CollectiveDescriptor& header = all_slots[static_cast<size_t>(peer) * kBatchSlots];
    // A header that is not one (a peer that issued a plain collective, or
    // garbage) offers one collective: its first slot is then compared.
    const int offered = header.kind == -1 && header.count >= 1 && header.count <= kMaxBatchOps
                            ? static_cast<int>(header.count)
                            : 1;
    n = std::min(n, offered);
  }
  n = std::max(n, 1);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == self) continue;
    for (int i = 0; i < n; ++i) {
      const CollectiveArgs theirs =
          FromDescriptor(all_slots[static_cast<size_t>(peer) * kBatchSlots + 1 + i]);
      std::string mismatch = DescribeMismatch(mine[i], theirs);
      if (mismatch.empty() && theirs.seq != mine[i].seq) {
        mismatch = absl::StrFormat("sequence number %d vs %d", mine[i].seq, theirs.seq);
      }
      if (!mismatch.empty()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "%s: %s does not match rank %d's collective #%d, %s (%s); every rank must issue "
            "the same collectives in the same order",
            where, DescribeCollective(mine[i]), peer, theirs.seq, DescribeCollective(theirs),
            mismatch));
      }
    }
  }
  return n;
}

}  // namespace internal
}  // namespace zeroshard
