// The CPU device's Stream and Event: an in-order work queue run by a thread
// of its own, so that enqueue / record / wait mean on the CPU what they mean
// on a CUDA stream.
#ifndef ZEROSHARD_DEVICE_CPU_STREAM_H_
#define ZEROSHARD_DEVICE_CPU_STREAM_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "zeroshard/device.h"

namespace zeroshard::internal {

class CpuStream final : public Stream {
 public:
  using Work = std::function<absl::Status()>;

  CpuStream();
  // Finishes the enqueued work, then stops the thread.
  ~CpuStream() override;

  // Appends `work`; it runs after everything enqueued before it. Work after a
  // failed one is skipped until Synchronize has reported the failure.
  // Returns the ticket of `work`: the stream's position after it.
  int64_t Enqueue(Work work);
  absl::Status Synchronize() override;
  void* native_handle() const override { return nullptr; }

  // The ticket of the last enqueued work (0: none).
  int64_t position() const;
  // Blocks until the work of `ticket` (and all before it) has finished.
  void WaitFor(int64_t ticket) const;

  // `stream` as a CpuStream, or null when it belongs to another backend.
  static CpuStream* From(Stream& stream);

 private:
  void Run();

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Work> queue_;
  int64_t enqueued_ = 0;  // tickets handed out
  int64_t finished_ = 0;  // tickets whose work has finished (or was skipped)
  absl::Status error_;    // first failure since the last Synchronize
  bool stop_ = false;
  std::thread worker_;
};

class CpuEvent final : public Event {
 public:
  absl::Status Record(Stream& stream) override;
  absl::Status Synchronize() override;
  absl::Status MakeStreamWait(Stream& stream) override;

 private:
  std::mutex mu_;
  CpuStream* stream_ = nullptr;  // where it was recorded (null: never)
  int64_t ticket_ = 0;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_DEVICE_CPU_STREAM_H_
