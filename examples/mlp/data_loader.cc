#include "examples/mlp/data_loader.h"

#include <algorithm>
#include <utility>

#include "examples/mlp/internal/steady_clock.h"

namespace zeroshard {
namespace mlp {
using internal::SteadyNow;

MicroBatchLoader::MicroBatchLoader(const MlpConfig& cfg, int world, int rank, int accum, int depth,
                                   int64_t first_step)
    : lm_(cfg.lm()),
      batch_tokens_(static_cast<size_t>(cfg.micro_batch)),
      accum_(accum),
      depth_(std::clamp(depth, 0, kMaxDepth)),
      batch_numel_(static_cast<size_t>(cfg.micro_batch * cfg.hidden)),
      sampler_(cfg, world, rank, accum),
      next_to_make_{first_step, 0},
      next_expected_{first_step, 0} {
  if (depth_ > 0) thread_ = std::thread([this] { Produce(); });
}

MicroBatchLoader::~MicroBatchLoader() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  space_.notify_all();
  thread_.join();
}

MicroBatchLoader::Position MicroBatchLoader::After(Position p) const {
  return ++p.micro == accum_ ? Position{p.step + 1, 0} : p;
}

void MicroBatchLoader::Produce() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    space_.wait(lock, [&] { return stop_ || queue_.size() < static_cast<size_t>(depth_); });
    if (stop_) return;
    const Position at = next_to_make_;
    const uint64_t generation = generation_;
    next_to_make_ = After(at);
    std::unique_ptr<Batch> batch;
    if (!spare_.empty()) {
      batch = std::move(spare_.back());
      spare_.pop_back();
    } else {
      batch = std::make_unique<Batch>();
    }
    // The sampler is this thread's alone; the trainer waits without the lock.
    lock.unlock();
    Make(at, batch.get());
    lock.lock();
    if (generation != generation_) {
      spare_.push_back(std::move(batch));  // made for a walk that was restarted
      continue;
    }
    queue_.push_back(std::move(batch));
    ready_.notify_all();  // Next, or a WaitQueued
  }
}

void MicroBatchLoader::Make(Position at, Batch* batch) {
  batch->at = at;
  if (lm_) {
    batch->tokens.resize(batch_tokens_);
    batch->targets.resize(batch_tokens_);
    sampler_.FillTokens(at.step, at.micro, batch->tokens.data(), batch->targets.data());
  } else {
    batch->x.resize(batch_numel_);
    batch->y.resize(batch_numel_);
    sampler_.Fill(at.step, at.micro, batch->x.data(), batch->y.data());
  }
}

template <typename Copy>
absl::Duration MicroBatchLoader::Take(Position want, Copy&& copy) {
  if (depth_ == 0) {
    const absl::Duration begin = SteadyNow();
    Batch batch;
    Make(want, &batch);
    copy(batch);
    return SteadyNow() - begin;
  }
  std::unique_ptr<Batch> batch;
  absl::Duration waited;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!(want == next_expected_)) {
      // Off the walk: drop what was made ahead and restart at `want` (a
      // batch being made now is dropped when it arrives).
      ++generation_;
      for (auto& b : queue_) spare_.push_back(std::move(b));
      queue_.clear();
      next_to_make_ = want;
      space_.notify_one();
    }
    next_expected_ = After(want);
    if (queue_.empty()) {
      const absl::Duration begin = SteadyNow();
      ready_.wait(lock, [&] { return !queue_.empty(); });
      waited = SteadyNow() - begin;
    }
    batch = std::move(queue_.front());
    queue_.pop_front();
  }
  // The queue has room again: the thread makes the next one while the
  // trainer copies and computes.
  space_.notify_one();
  copy(*batch);
  {
    std::lock_guard<std::mutex> lock(mu_);
    spare_.push_back(std::move(batch));
  }
  return waited;
}

absl::Duration MicroBatchLoader::Next(int64_t step, int micro, float* x, float* y) {
  if (depth_ == 0) {
    // Straight into the caller's arrays, as before (no copy to time).
    const absl::Duration begin = SteadyNow();
    sampler_.Fill(step, micro, x, y);
    return SteadyNow() - begin;
  }
  return Take(Position{step, micro}, [&](const Batch& batch) {
    std::copy(batch.x.begin(), batch.x.end(), x);
    std::copy(batch.y.begin(), batch.y.end(), y);
  });
}

absl::Duration MicroBatchLoader::NextTokens(int64_t step, int micro, int32_t* tokens,
                                            int32_t* targets) {
  return Take(Position{step, micro}, [&](const Batch& batch) {
    std::copy(batch.tokens.begin(), batch.tokens.end(), tokens);
    std::copy(batch.targets.begin(), batch.targets.end(), targets);
  });
}

void MicroBatchLoader::WaitQueued(int n) {
  const size_t want = static_cast<size_t>(std::clamp(n, 0, depth_));
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait(lock, [&] { return queue_.size() >= want; });
}

}  // namespace mlp
}  // namespace zeroshard
