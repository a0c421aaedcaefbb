#include "engine/src/device/cpu_stream.h"

#include <utility>

namespace zeroshard::internal {

CpuStream::CpuStream() : worker_([this] { Run(); }) {}

CpuStream::~CpuStream() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return finished_ == enqueued_; });
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

int64_t CpuStream::Enqueue(Work work) {
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
    ticket = ++enqueued_;
  }
  cv_.notify_all();
  return ticket;
}

void CpuStream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    Work work = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !error_.ok();
    lock.unlock();
    absl::Status status = skip ? absl::OkStatus() : work();
    work = nullptr;  // release what it captured before the host hears of it
    lock.lock();
    if (!status.ok() && error_.ok()) error_ = std::move(status);
    ++finished_;
    cv_.notify_all();
  }
}

absl::Status CpuStream::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = enqueued_;
  cv_.wait(lock, [&] { return finished_ >= target; });
  return std::exchange(error_, absl::OkStatus());
}

int64_t CpuStream::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return enqueued_;
}

void CpuStream::WaitFor(int64_t ticket) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ >= ticket; });
}

CpuStream* CpuStream::From(Stream& stream) { return dynamic_cast<CpuStream*>(&stream); }

absl::Status CpuEvent::Record(Stream& stream) {
  CpuStream* cpu = CpuStream::From(stream);
  if (cpu == nullptr) {
    return absl::InvalidArgumentError("a CPU event can only be recorded on a CPU stream");
  }
  std::lock_guard<std::mutex> lock(mu_);
  stream_ = cpu;
  ticket_ = cpu->position();
  return absl::OkStatus();
}

absl::Status CpuEvent::Synchronize() {
  CpuStream* stream;
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream = stream_;
    ticket = ticket_;
  }
  if (stream != nullptr) stream->WaitFor(ticket);
  return absl::OkStatus();
}

absl::Status CpuEvent::MakeStreamWait(Stream& stream) {
  CpuStream* waiter = CpuStream::From(stream);
  if (waiter == nullptr) {
    return absl::InvalidArgumentError("a CPU event can only order CPU streams");
  }
  CpuStream* recorded;
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    recorded = stream_;
    ticket = ticket_;
  }
  // Same stream: already in order. Never recorded: nothing to wait for.
  if (recorded == nullptr || recorded == waiter || ticket == 0) return absl::OkStatus();
  waiter->Enqueue([recorded, ticket] {
    recorded->WaitFor(ticket);
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
