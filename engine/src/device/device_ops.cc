#include "engine/src/device/device_ops.h"

namespace zeroshard::internal {

absl::StatusOr<std::unique_ptr<DeviceOps>> CreateDeviceOps(Device& device, Stream& stream) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return CreateCpuDeviceOps(stream);
    case DeviceKind::kCuda:
      return CreateCudaDeviceOps(device, stream);
  }
  return absl::InvalidArgumentError("CreateDeviceOps: unknown device kind");
}

#if !ZS_HAVE_CUDA
absl::StatusOr<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(Device& device, Stream&) {
  return absl::UnimplementedError(device.name() +
                                  ": zeroshard was built without CUDA; no CUDA device ops");
}
#endif

}  // namespace zeroshard::internal
