// The engine's host tier beside a device (CreateHostTierDevice): a CPU
// device (CPU streams, events, ops) whose memory comes from a given
// allocator: page-aligned host memory, or beside a CUDA device pinned host
// memory (cudaHostAlloc) so that the GPU's copies to and from it run
// asynchronously.
#ifndef ZEROSHARD_DEVICE_HOST_TIER_H_
#define ZEROSHARD_DEVICE_HOST_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "zeroshard/device.h"

namespace zeroshard::internal {

// `bytes` of host memory aligned to at least 4096 bytes, or an error.
using HostAllocateFn = std::function<absl::StatusOr<void*>(int64_t bytes)>;
using HostReleaseFn = std::function<void(void* ptr)>;

// A host-memory device named `name` whose buffers come from `allocate` and
// go back through `release` (zero-filled by the device).
std::unique_ptr<Device> CreateHostDevice(std::string name, HostAllocateFn allocate,
                                         HostReleaseFn release);

// The host tier beside the CUDA device `device`: pinned memory
// (cudaHostAlloc, portable). cuda_device.cc; the build without CUDA has no
// CUDA device to be beside (Unimplemented).
absl::StatusOr<std::unique_ptr<Device>> CreatePinnedHostTierDevice(const Device& device);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_DEVICE_HOST_TIER_H_
