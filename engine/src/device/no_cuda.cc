// CreateCudaDevice in a build without CUDA.
#include "engine/src/device/host_tier.h"
#include "zeroshard/device.h"

namespace zeroshard {

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  return absl::UnimplementedError(
      "zeroshard was built without CUDA (no nvcc at configure time, or -DZS_CUDA=OFF); "
      "reconfigure with the CUDA toolkit installed to use cuda:" +
      std::to_string(ordinal));
}

int CudaDeviceCount() { return 0; }

namespace internal {

absl::StatusOr<std::unique_ptr<Device>> CreatePinnedHostTierDevice(const Device& device) {
  return absl::UnimplementedError("zeroshard was built without CUDA: no pinned host tier beside " +
                                  device.name());
}

}  // namespace internal

}  // namespace zeroshard
