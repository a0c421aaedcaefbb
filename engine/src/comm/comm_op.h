// Internal pieces shared by every communicator backend: the completion state
// behind a CommHandle and the description of one issued collective.
#ifndef ZEROSHARD_ENGINE_SRC_COMM_COMM_OP_H_
#define ZEROSHARD_ENGINE_SRC_COMM_COMM_OP_H_

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "zeroshard/dtype.h"

namespace zeroshard {
namespace internal {

// Completion of one collective, shared by the issuing CommHandle and the
// progress thread that runs it. Complete() is called exactly once.
struct CommOpState {
  void Complete(absl::Status result);
  absl::Status Wait();
  bool Ready();

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
};

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier
};

// "AllReduce", "ReduceScatter", ...
const char* CollectiveName(CollectiveKind kind);

// One issued collective, as the rank that issued it described it. `count` is
// the per-call element count of the public API (AllReduce: count;
// ReduceScatter: recv_count; AllGather: send_count; Broadcast: count).
struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::kUInt8;
  int root = 0;
  // The caller's label of the data (Communicator: `tag`); 0 = none.
  uint64_t tag = 0;
  // 1-based position of this collective among those issued by this rank.
  uint64_t seq = 0;
};

// What a rank sends its peers at the start of a collective (mpi, nccl) so
// that they compare their views of it: plain words, to travel as bytes.
// `instance` tells communicators apart (mpi; 0 where unused).
struct CollectiveDescriptor {
  int64_t kind;
  int64_t count;
  int64_t dtype;
  int64_t root;
  int64_t seq;
  int64_t instance;
  uint64_t tag;
};
CollectiveDescriptor ToDescriptor(const CollectiveArgs& args, uint64_t instance = 0);
CollectiveArgs FromDescriptor(const CollectiveDescriptor& d);

// "AllReduce #17 (count 1009, fp32)", "AllGather #3 (count 128, bf16, tag 4)"
// — for error messages.
std::string DescribeCollective(const CollectiveArgs& args);

// Describes what differs between two ranks' views of the same collective, or
// returns "" when they match (kind, count, dtype, tag and, for Broadcast,
// root).
std::string DescribeMismatch(const CollectiveArgs& mine, const CollectiveArgs& theirs);

// One issued Send or Recv, as the rank that issued it described it.
struct PointToPointArgs {
  bool is_send = false;
  const void* send = nullptr;  // Send: the data
  void* recv = nullptr;        // Recv: where it goes
  int64_t count = 0;
  DType dtype = DType::kUInt8;
  int peer = 0;  // the receiver of a Send, the sender of a Recv
  uint64_t tag = 0;
  // 1-based position among the sends and receives of this rank (numbered
  // apart from the collectives, whose numbers must agree across ranks).
  uint64_t index = 0;
};

// "Send #3 to rank 2 (count 7, fp32, tag 5)", "Recv #1 from rank 0 (count
// 0, bf16)" — for error messages.
std::string DescribePointToPoint(const PointToPointArgs& args);

// "count 7 vs 8" / "dtype fp32 vs bf16" when a Send and the Recv it met
// disagree, "" when they agree; `mine` first.
std::string DescribePointToPointMismatch(const PointToPointArgs& mine,
                                         const PointToPointArgs& theirs);

// Element range [*offset, *offset + *length) of piece `index` when `count`
// elements are split into `pieces` nearly equal pieces (the first
// count % pieces pieces get one element more). AllReduce is built from these
// pieces on every backend.
inline void PieceRange(int64_t count, int pieces, int index, int64_t* offset, int64_t* length) {
  const int64_t base = count / pieces;
  const int64_t extra = count % pieces;
  *offset = base * index + std::min<int64_t>(index, extra);
  *length = base + (index < extra ? 1 : 0);
}

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_COMM_OP_H_
