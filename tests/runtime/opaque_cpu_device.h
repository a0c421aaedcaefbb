// A device whose memory the engine must treat as device memory, on the CPU:
// it hands out host memory but says it is not host-accessible, so the
// engine takes its device paths (copies, staging through device memory) as
// on a GPU, and every copy goes through CopyAsync (which it can count).
#ifndef ZEROSHARD_TESTS_RUNTIME_OPAQUE_CPU_DEVICE_H_
#define ZEROSHARD_TESTS_RUNTIME_OPAQUE_CPU_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "zeroshard/device.h"

namespace zeroshard::testing {

class OpaqueCpuDevice final : public Device {
 public:
  // `copies` (may be null) counts the CopyAsync calls.
  explicit OpaqueCpuDevice(std::atomic<int64_t>* copies) : copies_(copies) {}
  std::string name() const override { return "opaque-cpu"; }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  bool host_accessible() const override { return false; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override { return cpu_->CreateStream(); }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override { return cpu_->CreateEvent(); }
  absl::Status CopyAsync(void* dst, const void* src, int64_t bytes, Stream& stream) override {
    if (copies_ != nullptr) ++*copies_;
    return cpu_->CopyAsync(dst, src, bytes, stream);
  }
  absl::Status ZeroAsync(void* dst, int64_t bytes, Stream& stream) override {
    return cpu_->ZeroAsync(dst, bytes, stream);
  }

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t bytes) override {
    void* p = std::aligned_alloc(64, (static_cast<size_t>(bytes) + 63) / 64 * 64);
    if (p == nullptr) return absl::ResourceExhaustedError("out of host memory");
    std::memset(p, 0, static_cast<size_t>(bytes));
    return p;
  }
  void RawFree(void* ptr) override { std::free(ptr); }

 private:
  std::unique_ptr<Device> cpu_ = CreateCpuDevice();
  std::atomic<int64_t>* copies_;
};

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_RUNTIME_OPAQUE_CPU_DEVICE_H_
