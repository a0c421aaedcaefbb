// QuantizedReduceScatter: ZeRO++'s qgZ (TrainSpec::zeropp.quantized_grad_bits;
// docs/multinode.md, "ZeRO++"). A reduce-scatter of gradients whose data
// moves as blockwise int8 or int4 packs (kernels/common/quant_int8.h)
// through a hierarchical all-to-all, with every sum taken in fp32 after
// dequantization:
//
//   1. within the node: rank (node n, slot j) quantizes, for every slot k of
//      its node, the blocks owned by slot k's ranks on every node, and sends
//      them to its node's slot-k rank (all-to-all among the node's ranks);
//   2. each rank sums what its node sent it for every node's slot-j rank in
//      fp32, slot order, and quantizes the sums again;
//   3. across nodes: it sends node m's sum to node m's slot-j rank (all-to-
//      all among the ranks of one slot), and sums what it receives in fp32,
//      node order, rounded once to the gradient dtype.
//
// A rank's own contribution goes through the same quantization as the
// others'. Per rank, (nodes - 1) packs of one block cross nodes: with int4,
// about an eighth of an fp32 block each. One node: only step 1, then the sum.
// One rank per node: only step 3. The ranks of a node must be consecutive
// (rank = node * ranks_per_node + slot); QgzRanksPerNode falls back to one
// "node" of every rank (a flat all-to-all) when they are not.
//
// The data moves through the communicator's Send and Recv (host memory: the
// local and mpi backends), so a reduction is a short state machine: Start
// issues step 1; Advance waits for the current step's transfers and runs
// the next step; done() after the last. QuantizedReduceWorker drives reductions to their
// end on a thread of its own, in submission order, so that a rank's later
// steps never wait for its trainer thread (which may be waiting for a
// peer's collective). Deterministic: the same inputs give the same bits on
// every run and backend.
#ifndef ZEROSHARD_RUNTIME_QUANTIZED_REDUCE_SCATTER_H_
#define ZEROSHARD_RUNTIME_QUANTIZED_REDUCE_SCATTER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "zeroshard/communicator.h"
#include "zeroshard/dtype.h"

namespace zeroshard::internal {

// Host kernels, block by block over kernels::kQuantBlock elements, fp32 sums
// in argument order. `bits` is 8 or 4; dtype fp32, bf16 or fp16.
// Quantizes n elements of `x` into the pack `pack` (QuantPackedBytes(n, bits)).
void QuantizePack(const void* x, int64_t n, DType dtype, int bits, void* pack);
// `out` (a pack) = the quantized fp32 sum of the dequantized `packs`.
void RequantizeSum(const void* const* packs, int num, int64_t n, int bits, void* out);
// `out` (n elements of dtype) = the fp32 sum of the dequantized `packs`,
// rounded once to dtype.
void DequantizeSum(const void* const* packs, int num, int64_t n, int bits, DType dtype, void* out);

// The ranks per node the hierarchy uses for `layout`: its ranks per node
// when every node has that many consecutive ranks, else the group's size
// (one node: a flat all-to-all).
int QgzRanksPerNode(const NodeLayout& layout);

// Scratch bytes of one reduction of `count` elements per rank over `world`
// ranks: two regions of `world` packs of `count` elements.
int64_t QgzScratchBytes(int world, int64_t count, int bits);

class QuantizedReduceScatter {
 public:
  // Reduce-scatter of `send` (world * count elements of dtype) into `recv`
  // (count elements; may alias block rank() of `send`) over `comm`, whose
  // ranks sit ranks_per_node to a node. Quantizes on this thread, then
  // issues step 1. `send` may be reused once Start returns; `recv` and
  // `scratch` (QgzScratchBytes) must stay until done(). Send and Recv carry
  // `tag` (the step in its top byte).
  absl::Status Start(Communicator& comm, int ranks_per_node, int bits, const void* send, void* recv,
                     int64_t count, DType dtype, uint64_t tag, char* scratch);
  // Waits for the pending transfers (their first error), then runs the next
  // step.
  absl::Status Advance();
  bool done() const { return step_ == kDone; }

 private:
  enum Step { kIdle, kWithinNode, kAcrossNodes, kDone };

  char* PackAt(char* region, int64_t index) const { return region + index * pack_bytes_; }
  absl::Status WaitPending();
  void IssueAcrossNodes();
  void FinishAcrossNodes();

  Communicator* comm_ = nullptr;
  int bits_ = 8;
  int ranks_per_node_ = 1;  // R
  int nodes_ = 1;           // N
  int node_ = 0;
  int slot_ = 0;
  void* recv_ = nullptr;
  int64_t count_ = 0;
  DType dtype_ = DType::kFloat32;
  uint64_t tag_ = 0;
  int64_t pack_bytes_ = 0;
  char* send_packs_ = nullptr;  // [slot][node] packs to the node's ranks, then step 3's sends
  char* recv_packs_ = nullptr;  // [slot][node] packs from the node's ranks, then step 3's
  Step step_ = kIdle;
  std::vector<CommHandle> pending_;
};

struct CommOpState;

// Runs started reductions to their end, one at a time in submission order,
// on a thread it starts with the first.
class QuantizedReduceWorker {
 public:
  QuantizedReduceWorker() = default;
  // Finishes what was submitted (each step's transfers time out with the
  // communicator's timeout), then joins the thread.
  ~QuantizedReduceWorker();
  QuantizedReduceWorker(const QuantizedReduceWorker&) = delete;
  QuantizedReduceWorker& operator=(const QuantizedReduceWorker&) = delete;

  // `op` must be started. The handle completes when it is done, with the
  // first error of its transfers.
  CommHandle Submit(std::unique_ptr<QuantizedReduceScatter> op);

 private:
  struct Job {
    std::unique_ptr<QuantizedReduceScatter> op;
    std::shared_ptr<CommOpState> state;
  };
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_QUANTIZED_REDUCE_SCATTER_H_
