// MpiPointToPoint: Send and Recv of the `mpi` backend, on an MPI
// communicator of their own (so their tags never meet a collective's) and a
// thread of their own, which starts with the first Send or Recv. The
// collectives' progress thread never waits for them, nor they for it: both
// threads post nonblocking MPI requests and poll them (under MpiCallLock,
// which serialises MPI calls below MPI_THREAD_MULTIPLE).
//
// Protocol, per Send from a to b with tag t: a sends b a small header (count,
// dtype, tag, a's operation number, the data's MPI tag) and b sends a the
// header of its Recv. Each side matches the headers it receives with its own
// operations in issue order per (peer, tag), the same pairing on both sides,
// so a count or dtype mismatch fails both with FailedPrecondition before any
// data moves. Once matched, a posts MPI_Isend and b MPI_Irecv of the data
// (at most 1 GiB per message). Headers are eager; the data goes
// rendezvous-sized without extra buffering. Neither side blocks on the other,
// so two ranks that each Send then Recv cannot deadlock. Unmatched headers
// from peers are kept (a few dozen bytes per Send or Recv a peer issued
// ahead of this rank).
#ifndef ZEROSHARD_ENGINE_SRC_COMM_MPI_POINT_TO_POINT_H_
#define ZEROSHARD_ENGINE_SRC_COMM_MPI_POINT_TO_POINT_H_

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/src/comm/comm_op.h"
#include "engine/src/comm/process_probe.h"

namespace zeroshard::internal {

class MpiPointToPoint {
 public:
  // Takes ownership of `comm` (a communicator used for nothing else).
  // `finish` completes an operation (and poisons on an error); it is called
  // on the point-to-point thread. `count_sent(peer, bytes)`, when set, is
  // told of every message posted to a peer (headers and data), for
  // Communicator::traffic.
  MpiPointToPoint(MPI_Comm comm, int rank, std::vector<ProcessIdentity> processes,
                  absl::Duration timeout, std::string prefix,
                  std::function<void(CommOpState&, absl::Status)> finish,
                  std::function<void(int peer, int64_t bytes)> count_sent = nullptr);
  // Stops the thread, fails what is left (Cancelled) and frees the MPI
  // communicator.
  ~MpiPointToPoint();

  // Takes an operation whose arguments were checked.
  void Post(const PointToPointArgs& args, std::shared_ptr<CommOpState> state);

 private:
  struct Header {
    int64_t count = 0;
    int64_t dtype = 0;
    int64_t index = 0;
    int64_t data_tag = 0;
    uint64_t tag = 0;
  };
  struct Op {
    PointToPointArgs args;
    std::shared_ptr<CommOpState> state;
    absl::Time deadline;
    Header mine;  // the header sent to the peer; must outlive header_request
    MPI_Request header_request = MPI_REQUEST_NULL;
    bool matched = false;
    std::vector<MPI_Request> data;
  };
  using OpPtr = std::shared_ptr<Op>;

  void Run();
  void Start(const OpPtr& op);
  // Pairs `op` with the peer's header `theirs`; posts the data, or fails it.
  void Match(const OpPtr& op, const Header& theirs);
  void OnHeader(int peer, bool from_send, const Header& header);
  // Polls every request once; returns whether anything completed.
  bool Poll();
  void CheckDeadlinesAndPeers();
  void Fail(const OpPtr& op, absl::Status error);
  // Gives up on the requests of `op` still open, without blocking.
  void Abandon(Op& op);
  std::string DescribeRank(int peer) const;
  absl::Status Check(int rc, const char* call, const Op* op);

  const MPI_Comm comm_;
  const int rank_;
  const int size_;
  const std::vector<ProcessIdentity> processes_;
  const absl::Duration timeout_;
  const std::string prefix_;
  const absl::Duration heartbeat_limit_;  // a peer on another node silent longer fails
  const std::function<void(CommOpState&, absl::Status)> finish_;
  const std::function<void(int, int64_t)> count_sent_;
  int64_t data_tags_ = 0;  // data tags are 2 .. 2 + data_tags_ - 1

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<OpPtr> inbox_;
  bool stop_ = false;
  std::thread thread_;

  // The point-to-point thread's own state.
  std::list<OpPtr> ops_;  // started, not finished
  // Failed or mismatched ops whose header send had not completed: their
  // header must outlive the request.
  std::list<OpPtr> retired_;
  std::vector<Header> header_in_;  // per peer: [2p] from its Sends, [2p+1] its Recvs
  std::vector<MPI_Request> header_requests_;
  std::vector<std::deque<Header>> unmatched_headers_;  // same layout
  std::vector<std::deque<OpPtr>> unmatched_ops_;       // [2p] Sends to p, [2p+1] Recvs from p
  std::vector<int64_t> sends_to_;                      // per peer, for data tags
  absl::Time next_liveness_check_;
  bool in_limbo_ = false;  // a request could not be cancelled: leak its buffers
  // Requests were given up on (Abandon): the destructor keeps comm_.
  bool requests_abandoned_ = false;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_ENGINE_SRC_COMM_MPI_POINT_TO_POINT_H_
