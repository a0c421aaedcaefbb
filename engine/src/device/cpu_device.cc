#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/src/device/cpu_stream.h"
#include "engine/src/device/host_tier.h"
#include "zeroshard/device.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

// 64-byte alignment: a cache line and a full AVX-512 vector.
constexpr size_t kCpuAlignment = 64;

// Declares `var`, the CpuStream behind `stream`, or returns InvalidArgument.
#define ZS_DEVICE_ASSIGN_CPU_STREAM(var, stream, call)                                             \
  internal::CpuStream* var = internal::CpuStream::From(stream);                                    \
  if (var == nullptr) {                                                                            \
    return absl::InvalidArgumentError(                                                             \
        absl::StrFormat("cpu: %s on a stream of another device; use one of this device's", call)); \
  }

class CpuDevice final : public Device {
 public:
  // `alignment`: a power of two, at least kCpuAlignment.
  CpuDevice(std::string name, size_t alignment) : name_(std::move(name)), alignment_(alignment) {}
  // Memory from `allocate` / `release` (zero-filled by this class).
  CpuDevice(std::string name, internal::HostAllocateFn allocate, internal::HostReleaseFn release)
      : name_(std::move(name)),
        alignment_(4096),
        allocate_(std::move(allocate)),
        release_(std::move(release)) {}
  std::string name() const override { return name_; }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  bool host_accessible() const override { return true; }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::unique_ptr<Stream>(std::make_unique<internal::CpuStream>());
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return std::unique_ptr<Event>(std::make_unique<internal::CpuEvent>());
  }

  absl::Status CopyAsync(void* dst, const void* src, int64_t bytes, Stream& stream) override {
    ZS_DEVICE_ASSIGN_CPU_STREAM(cpu, stream, "CopyAsync");
    if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cpu: CopyAsync of %d bytes from %p to %p", bytes, src, dst));
    }
    if (bytes == 0) return absl::OkStatus();
    cpu->Enqueue([dst, src, bytes] {
      std::memcpy(dst, src, static_cast<size_t>(bytes));
      return absl::OkStatus();
    });
    return absl::OkStatus();
  }

  absl::Status ZeroAsync(void* dst, int64_t bytes, Stream& stream) override {
    ZS_DEVICE_ASSIGN_CPU_STREAM(cpu, stream, "ZeroAsync");
    if (bytes < 0 || (bytes > 0 && dst == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cpu: ZeroAsync of %d bytes at %p", bytes, dst));
    }
    if (bytes == 0) return absl::OkStatus();
    cpu->Enqueue([dst, bytes] {
      std::memset(dst, 0, static_cast<size_t>(bytes));
      return absl::OkStatus();
    });
    return absl::OkStatus();
  }

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t bytes) override {
    if (allocate_) {
      ZS_ASSIGN_OR_RETURN(void* ptr, allocate_(bytes));
      std::memset(ptr, 0, static_cast<size_t>(bytes));
      return ptr;
    }
    const size_t rounded = (static_cast<size_t>(bytes) + alignment_ - 1) / alignment_ * alignment_;
    void* ptr = std::aligned_alloc(alignment_, rounded);
    if (ptr == nullptr) return absl::ResourceExhaustedError("out of host memory");
    std::memset(ptr, 0, rounded);
    return ptr;
  }
  void RawFree(void* ptr) override {
    if (release_) {
      release_(ptr);
    } else {
      std::free(ptr);
    }
  }

 private:
  std::string name_;
  size_t alignment_;
  internal::HostAllocateFn allocate_;
  internal::HostReleaseFn release_;
};

}  // namespace

std::unique_ptr<Device> CreateCpuDevice() {
  return std::make_unique<CpuDevice>("cpu", kCpuAlignment);
}

absl::StatusOr<std::unique_ptr<Device>> CreateHostTierDevice(const Device& device) {
  if (device.kind() == DeviceKind::kCuda) return internal::CreatePinnedHostTierDevice(device);
  // 4096 bytes: the direct-I/O alignment of the NVMe tier's chunks.
  return std::unique_ptr<Device>(std::make_unique<CpuDevice>("host", 4096));
}

namespace internal {

std::unique_ptr<Device> CreateHostDevice(std::string name, HostAllocateFn allocate,
                                         HostReleaseFn release) {
  return std::make_unique<CpuDevice>(std::move(name), std::move(allocate), std::move(release));
}

}  // namespace internal

}  // namespace zeroshard
