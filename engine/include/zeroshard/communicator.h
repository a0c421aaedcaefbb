// Communicator: the collectives the engine issues between ranks.
//
// Every collective is asynchronous: it returns a CommHandle at once and runs
// in issue order on the communicator's progress thread. Buffers must stay
// valid and untouched (send) / unread (recv) until the handle's Wait()
// returns. Every wait has a timeout: a peer that never arrives, or that
// left the group, becomes an error naming the rank, never a hang. After an
// error the communicator is poisoned: every later call fails fast.
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
#include "absl/time/time.h"
#include "zeroshard/dtype.h"

namespace zeroshard {

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

struct CommOptions {
  // How long one collective may wait for its peers before it fails.
  absl::Duration timeout = absl::Seconds(120);
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local" or "mpi".
  virtual std::string backend() const = 0;

  // Sum of `count` elements over all ranks into `recv` on every rank.
  // `send == recv` (in place) is allowed.
  virtual CommHandle AllReduce(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // `send` holds size()*recv_count elements; rank r receives the sum of every
  // rank's block r. `recv` may alias block rank() of `send` (in place).
  virtual CommHandle ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                   DType dtype) = 0;
  // Every rank contributes send_count elements; `recv` (size()*send_count)
  // gets them in rank order. `send` may alias block rank() of `recv`.
  virtual CommHandle AllGather(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  // `root`'s buffer is copied to every rank's `buf`.
  virtual CommHandle Broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  virtual CommHandle Barrier() = 0;

  // Blocking conveniences: issue, then Wait().
  absl::Status AllReduceSync(const void* send, void* recv, int64_t count, DType dtype) {
    return AllReduce(send, recv, count, dtype).Wait();
  }
  absl::Status AllGatherSync(const void* send, void* recv, int64_t count, DType dtype) {
    return AllGather(send, recv, count, dtype).Wait();
  }
};

// Creates a group of `world_size` in-process ranks (one communicator each,
// meant to be driven by one thread each) that share memory. The returned
// vector owns them; element r has rank r.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLocalGroup(
    int world_size, CommOptions options = {});

// Runs `fn(rank, comm)` on one thread per rank of a fresh local group and
// returns the first error any rank returned (others are joined first). A rank
// that fails marks itself gone so its peers fail fast instead of waiting out
// the timeout.
absl::Status RunLocalRanks(int world_size,
                           const std::function<absl::Status(int rank, Communicator& comm)>& fn,
                           CommOptions options = {});

// True when this build has the MPI backend.
bool HaveMpi();
// Initialises MPI (thread level at least SERIALIZED) if needed and returns a
// communicator over MPI_COMM_WORLD. Unimplemented in builds without MPI.
absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(CommOptions options = {});
// Finalises MPI if this process initialised it. Call once at the end of main.
void FinalizeMpi();

}  // namespace zeroshard

#endif  // ZEROSHARD_COMMUNICATOR_H_
