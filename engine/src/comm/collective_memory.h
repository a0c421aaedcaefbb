// CollectiveMemory: how the local backend moves and sums the bytes of a
// collective, for the memory its group was created on. Host memory: memcpy
// and SumInRankOrder (reduce.h). A CUDA device's memory (ranks as threads on
// one GPU): device-to-device copies and a rank-order sum kernel on a stream
// of the rank's own, so the results have the same bits as on the host.
//
// One object per rank, used by that rank's progress thread only.
#ifndef ZEROSHARD_ENGINE_SRC_COMM_COLLECTIVE_MEMORY_H_
#define ZEROSHARD_ENGINE_SRC_COMM_COLLECTIVE_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"

namespace zeroshard::internal {

class CollectiveMemory {
 public:
  virtual ~CollectiveMemory() = default;
  // dst = src, `bytes` bytes; the buffers do not overlap.
  virtual absl::Status Copy(void* dst, const void* src, int64_t bytes) = 0;
  // SumInRankOrder's contract (reduce.h): the sum of `num_inputs` arrays in
  // input order into each of `num_outputs` arrays; an output may be one of
  // the inputs.
  virtual absl::Status Sum(const void* const* inputs, int num_inputs, void* const* outputs,
                           int num_outputs, int64_t count, DType dtype) = 0;
  // Waits until the copies and sums issued so far are done (peers read the
  // results once this rank reports its part done).
  virtual absl::Status Finish() = 0;
};

// The most ranks a device-memory local group supports (the sum kernel takes
// its pointer arrays by value).
inline constexpr int kMaxDeviceLocalRanks = 8;

// Host memory (device null or a CPU device), or the memory of a CUDA device.
// Unimplemented for a CUDA device in a build without CUDA.
absl::StatusOr<std::unique_ptr<CollectiveMemory>> CreateCollectiveMemory(Device* device);

// The CUDA implementation (cuda_collective_memory.cc; a stub without CUDA).
absl::StatusOr<std::unique_ptr<CollectiveMemory>> CreateCudaCollectiveMemory(Device& device);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_ENGINE_SRC_COMM_COLLECTIVE_MEMORY_H_
