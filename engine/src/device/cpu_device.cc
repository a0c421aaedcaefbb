#include <cstdlib>
#include <cstring>

#include "zeroshard/device.h"

namespace zeroshard {
namespace {

// 64-byte alignment: a cache line and a full AVX-512 vector.
constexpr size_t kCpuAlignment = 64;

class CpuDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  bool host_accessible() const override { return true; }

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t bytes) override {
    const size_t rounded =
        (static_cast<size_t>(bytes) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    if (ptr == nullptr) return absl::ResourceExhaustedError("out of host memory");
    std::memset(ptr, 0, rounded);
    return ptr;
  }
  void RawFree(void* ptr) override { std::free(ptr); }
};

}  // namespace

std::unique_ptr<Device> CreateCpuDevice() { return std::make_unique<CpuDevice>(); }

}  // namespace zeroshard
