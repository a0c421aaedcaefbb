// The launch shape every zeroshard CUDA kernel uses. Plain C++: the tests
// read it to size inputs that take several grid-stride passes.
#ifndef ZEROSHARD_KERNELS_CUDA_LAUNCH_CONFIG_H_
#define ZEROSHARD_KERNELS_CUDA_LAUNCH_CONFIG_H_

#include <cstddef>

namespace zeroshard::kernels::cuda {

// The element type of a buffer a kernel reads or writes: fp32 as float, bf16
// and fp16 (IEEE binary16) as their raw uint16_t bits.
enum class ElementType { kFp32, kBf16, kFp16 };

inline constexpr unsigned kLaunchThreads = 256;
// 1024 blocks of 256 threads fill an H100/H200 (132 SMs x 2048 resident
// threads); a grid-stride loop covers whatever more work there is, so the
// grid never grows with n.
inline constexpr size_t kMaxGridBlocks = 1024;

// Blocks for `work_items` independent items (one per thread per pass).
inline unsigned GridBlocks(size_t work_items) {
  const size_t blocks = (work_items + kLaunchThreads - 1) / kLaunchThreads;
  if (blocks == 0) return 1;
  return static_cast<unsigned>(blocks < kMaxGridBlocks ? blocks : kMaxGridBlocks);
}

}  // namespace zeroshard::kernels::cuda

#endif  // ZEROSHARD_KERNELS_CUDA_LAUNCH_CONFIG_H_
