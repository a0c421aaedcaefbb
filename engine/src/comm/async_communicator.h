// AsyncCommunicator: the issue/queue/progress machinery shared by every
// backend. A backend only says how to run one collective synchronously
// against a deadline; this class checks arguments, numbers the collectives,
// runs them one at a time in issue order on a single progress thread and
// poisons the communicator on the first failure.
#ifndef ZEROSHARD_ENGINE_SRC_COMM_ASYNC_COMMUNICATOR_H_
#define ZEROSHARD_ENGINE_SRC_COMM_ASYNC_COMMUNICATOR_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/src/comm/comm_op.h"
#include "zeroshard/communicator.h"

namespace zeroshard {
namespace internal {

class AsyncCommunicator : public Communicator {
 public:
  ~AsyncCommunicator() override;

  int rank() const final { return rank_; }
  int size() const final { return size_; }

  // Issuing is thread-safe (a mutex orders concurrent callers), but the issue
  // order is what matches collectives across ranks, so one rank should issue
  // from one thread (or order its threads itself).
  using Communicator::AllGather;
  using Communicator::AllReduce;
  using Communicator::Broadcast;
  using Communicator::ReduceScatter;
  CommHandle AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                       uint64_t tag) final;
  CommHandle ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                           uint64_t tag) final;
  CommHandle AllGather(const void* send, void* recv, int64_t send_count, DType dtype,
                       uint64_t tag) final;
  CommHandle Broadcast(void* buf, int64_t count, DType dtype, int root, uint64_t tag) final;
  CommHandle Barrier() final;
  // The progress thread waits for `ready` before running the collective.
  CommHandle AllReduceAfter(std::shared_ptr<Event> ready, const void* send, void* recv,
                            int64_t count, DType dtype, uint64_t tag) final;
  CommHandle ReduceScatterAfter(std::shared_ptr<Event> ready, const void* send, void* recv,
                                int64_t recv_count, DType dtype, uint64_t tag) final;

  // Checks the arguments (InvalidArgument, which poisons once the
  // collectives issued before have run, as for a collective) and the
  // poison, numbers the operation and hands it to StartPointToPoint; never
  // queued behind the collectives.
  CommHandle Send(const void* buf, int64_t count, DType dtype, int peer, uint64_t tag) final;
  CommHandle Recv(void* buf, int64_t count, DType dtype, int peer, uint64_t tag) final;

  // How many collectives this rank has issued so far (the sequence number of
  // the last one).
  uint64_t issued() const;
  // How many collectives have completed as part of a batch of two or more
  // (RunBatch) so far; 0 on a backend that does not batch. A diagnostic:
  // tests and benchmarks read it to see that batching happens.
  uint64_t batched_collectives() const;
  absl::Duration busy_time() const override;

 protected:
  // `options.timeout` must already be resolved (ResolveCommTimeout).
  AsyncCommunicator(int rank, int size, CommOptions options);

  // Starts the progress thread; the derived constructor calls it last.
  void StartProgressThread();
  // Fails every queued collective that has not started, asks the running one
  // to stop (RequestAbort) and joins the progress thread. The derived
  // destructor must call it first, while RunCollective is still callable.
  void Shutdown();

  // Runs one collective now, on the progress thread, giving up at `deadline`.
  // Arguments were already checked.
  virtual absl::Status RunCollective(const CollectiveArgs& args, absl::Time deadline) = 0;
  // Batching (collective_batch.h): the most queued collectives RunBatch may
  // be offered at once; 1 (the default) turns batching off.
  virtual int max_batch() const { return 1; }
  // Runs a prefix of `ops` (issued in this order, all queued, arguments
  // checked, buffers pairwise independent: BatchablePrefix) as one batch and
  // returns its length, at least 1 and the same on every rank; the others
  // stay queued. On an error every collective offered is reported failed.
  // The default runs ops[0] alone through RunCollective.
  virtual absl::StatusOr<int> RunBatch(absl::Span<const CollectiveArgs> ops, absl::Time deadline);
  // Called (on the progress thread) once, with the first error.
  virtual void OnPoisoned(const absl::Status& error) {}
  // Called from Shutdown(), on any thread: a running RunCollective should
  // return an error soon instead of waiting out its deadline.
  virtual void RequestAbort() {}

  // Takes one Send or Recv whose arguments were checked, on a communicator
  // that was not poisoned when it was issued, and completes `state` later
  // (from any thread) through FinishPointToPoint. Must not wait for the
  // collectives or for other sends and receives. The default fails it with
  // Unimplemented.
  virtual void StartPointToPoint(const PointToPointArgs& args, std::shared_ptr<CommOpState> state);
  // Completes a Send or Recv with `result`; an error poisons the
  // communicator (Poison).
  void FinishPointToPoint(CommOpState& state, absl::Status result);
  // Records `error` as the communicator's first error unless it has one and
  // then calls OnPoisoned, on the calling thread. For the progress thread,
  // and for a backend's own point-to-point thread when its OnPoisoned is
  // thread-safe (local, mpi).
  void Poison(const absl::Status& error);
  // The first error, OK while not poisoned.
  absl::Status poison() const;
  // Queues `run` behind the collectives issued so far, to run on the
  // progress thread like one (deadline, poisoning, destruction) without
  // taking a collective sequence number: for a transport that cannot move
  // point-to-point data beside its collectives (nccl). `what` names it in
  // errors.
  // `state` is completed with run's result.
  void IssueOnProgressThread(std::shared_ptr<CommOpState> state, std::string what,
                             std::function<absl::Status(absl::Time deadline)> run);

  // Collective over this communicator: every rank passes its (color, key);
  // returns the ranks of this group that passed `color`, ordered by key,
  // ties by rank (empty for color < 0). Errors as for a collective.
  absl::StatusOr<std::vector<int>> AgreeOnSplit(int color, int key);

  const CommOptions& options() const { return options_; }
  // "local comm rank 2" / "mpi comm rank 2" (+ the group name of a split
  // communicator): the prefix of every error.
  std::string ErrorPrefix() const;
  // Names a sub-group in ErrorPrefix, e.g. " of group 3 (parent rank 5)";
  // the derived constructor calls it before StartProgressThread.
  void SetGroupName(std::string name) { group_name_ = std::move(name); }
  const std::string& group_name() const { return group_name_; }

 private:
  struct PendingOp {
    CollectiveArgs args;
    absl::Status argument_error;
    std::shared_ptr<CommOpState> state;
    std::shared_ptr<Event> ready;  // waited for before the collective runs
    // IssueOnProgressThread: runs instead of RunCollective; `what` names it.
    std::function<absl::Status(absl::Time deadline)> run = nullptr;
    std::string what = "";
  };
  std::string Describe(const PendingOp& op) const {
    return op.run ? op.what : DescribeCollective(op.args);
  }
  CommHandle IssuePointToPoint(PointToPointArgs args);
  absl::Status CheckPointToPointArguments(const PointToPointArgs& args) const;

  CommHandle Issue(CollectiveArgs args, std::shared_ptr<Event> ready = nullptr);
  absl::Status CheckArguments(const CollectiveArgs& args) const;
  void ProgressLoop();

  const int rank_;
  const int size_;
  const CommOptions options_;

  mutable std::mutex mu_;
  absl::Duration busy_;   // summed run time of completed collectives
  uint64_t batched_ = 0;  // batched_collectives()
  std::condition_variable cv_;
  std::deque<PendingOp> queue_;
  uint64_t next_seq_ = 1;
  uint64_t next_point_to_point_ = 1;  // sends and receives are numbered apart
  std::string group_name_;
  bool stopping_ = false;
  // The first error; once set every later collective fails with it.
  absl::Status poison_;
  std::thread thread_;
};

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_ASYNC_COMMUNICATOR_H_
