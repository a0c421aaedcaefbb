#include "engine/src/comm/collective_memory.h"

#include <cstring>

#include "engine/src/comm/reduce.h"

namespace zeroshard::internal {
namespace {

class HostCollectiveMemory final : public CollectiveMemory {
 public:
  absl::Status Copy(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status Sum(const void* const* inputs, int num_inputs, void* const* outputs, int num_outputs,
                   int64_t count, DType dtype) override {
    SumInRankOrder(inputs, num_inputs, outputs, num_outputs, count, dtype);
    return absl::OkStatus();
  }
  absl::Status Finish() override { return absl::OkStatus(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<CollectiveMemory>> CreateCollectiveMemory(Device* device) {
  if (device == nullptr || device->kind() == DeviceKind::kCpu) {
    return std::unique_ptr<CollectiveMemory>(std::make_unique<HostCollectiveMemory>());
  }
  return CreateCudaCollectiveMemory(*device);
}

#if !ZS_HAVE_CUDA
absl::StatusOr<std::unique_ptr<CollectiveMemory>> CreateCudaCollectiveMemory(Device& device) {
  return absl::UnimplementedError(device.name() +
                                  ": zeroshard was built without CUDA; a local group cannot move "
                                  "this device's memory");
}
#endif

}  // namespace zeroshard::internal
