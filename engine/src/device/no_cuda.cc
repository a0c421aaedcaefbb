// CreateCudaDevice in a build without CUDA.
#include "zeroshard/device.h"

namespace zeroshard {

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  return absl::UnimplementedError(
      "zeroshard was built without CUDA (no nvcc at configure time, or -DZS_CUDA=OFF); "
      "reconfigure with the CUDA toolkit installed to use cuda:" +
      std::to_string(ordinal));
}

int CudaDeviceCount() { return 0; }

}  // namespace zeroshard
