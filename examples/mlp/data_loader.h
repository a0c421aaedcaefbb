// MicroBatchLoader: the MLP trainers' data loader. It makes the micro-batches
// of a DistributedSampler ahead of the trainer on a background thread, into a
// bounded queue, as a real data loader does, so that the trainer only waits
// (and reports input wait) when the data are truly not ready.
#ifndef ZEROSHARD_EXAMPLES_MLP_DATA_LOADER_H_
#define ZEROSHARD_EXAMPLES_MLP_DATA_LOADER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "examples/mlp/mlp.h"

namespace zeroshard {
namespace mlp {

// The loader walks the sampler's order from a position: (step, 0),
// (step, 1), ..., (step, accum - 1), (step + 1, 0), ..., and keeps at most
// `depth` finished micro-batches queued: its thread stops when the queue is
// full and goes on when the trainer takes one. Next(step, micro) hands out
// the micro-batch at that position: the queue's head when the trainer
// follows the order, else (a resume from a checkpoint, a skip) the walk
// restarts there. A micro-batch's data are DistributedSampler::Fill's bit
// for bit, whichever thread made them, so training does not depend on the
// depth.
//
// depth 0 is the synchronous loader: no thread; Next makes the micro-batch
// on the caller's thread, and all of that time is the caller's wait.
//
// Thread-safety: one trainer thread calls Next; the loader's thread only
// touches the loader's own sampler and queue. The destructor stops the
// thread (after the micro-batch it is making, if any) and joins it.
class MicroBatchLoader {
 public:
  static constexpr int kMaxDepth = 16;

  // world, rank, accum as DistributedSampler's; first_step: the step the
  // trainer starts at (the engine's steps(): after a checkpoint resume, the
  // resumed step), where the thread starts making micro-batches at once.
  // depth in [0, kMaxDepth] (clamped).
  MicroBatchLoader(const MlpConfig& cfg, int world, int rank, int accum, int depth,
                   int64_t first_step);
  ~MicroBatchLoader();
  MicroBatchLoader(const MicroBatchLoader&) = delete;
  MicroBatchLoader& operator=(const MicroBatchLoader&) = delete;

  // Writes the inputs x and targets y (micro_batch x hidden floats each) of
  // local micro-batch `micro` of step `step`. Returns how long the call
  // blocked waiting for the loader's thread (depth 0: the whole making of
  // the micro-batch): what the trainer reports with RecordInputWait.
  // Regression mode only.
  absl::Duration Next(int64_t step, int micro, float* x, float* y);
  // The LM mode's micro-batch (DistributedSampler::FillTokens): micro_batch
  // token ids and their targets. Same queue, same wait accounting.
  absl::Duration NextTokens(int64_t step, int micro, int32_t* tokens, int32_t* targets);

  // Blocks until the loader's thread has `n` micro-batches queued ahead (n
  // clamped to [0, depth]; at depth 0 it returns at once): for a trainer
  // that wants its first micro-batches made before Start, and for tests
  // that need "made ahead" without guessing a sleep.
  void WaitQueued(int n);

  int depth() const { return depth_; }

 private:
  struct Position {
    int64_t step = 0;
    int micro = 0;
    bool operator==(const Position& o) const { return step == o.step && micro == o.micro; }
  };
  struct Batch {
    Position at;
    std::vector<float> x, y;               // regression mode
    std::vector<int32_t> tokens, targets;  // LM mode
  };

  Position After(Position p) const;
  void Produce();
  // Makes the micro-batch at `at` into *batch (sized for the mode).
  void Make(Position at, Batch* batch);
  // The micro-batch at `want`, made (depth 0) or taken from the queue;
  // `copy` reads it out; returns the wait.
  template <typename Copy>
  absl::Duration Take(Position want, Copy&& copy);

  const bool lm_;
  const size_t batch_tokens_;
  const int accum_;
  const int depth_;
  const size_t batch_numel_;
  DistributedSampler sampler_;  // the loader thread's (depth 0: the caller's)

  std::mutex mu_;
  std::condition_variable ready_;  // a batch was queued
  std::condition_variable space_;  // the queue has room, a restart, or stop
  bool stop_ = false;
  uint64_t generation_ = 0;  // bumped by a restart: older batches are dropped
  Position next_to_make_;
  Position next_expected_;  // what Next will be asked for when the trainer follows the order
  std::deque<std::unique_ptr<Batch>> queue_;
  std::vector<std::unique_ptr<Batch>> spare_;  // recycled buffers
  std::thread thread_;                         // declared last: started when the rest exists
};

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_DATA_LOADER_H_
