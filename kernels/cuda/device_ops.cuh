// The element-wise kernels behind the engine's CUDA DeviceOps (besides Adam,
// adam.cuh): gradient accumulation and the block sums of squares of the
// global norm.
//
// Plain C++ declarations (no CUDA syntax), like adam.cuh. Each launcher
// enqueues one grid-stride kernel on `stream` and returns the launch error
// (cudaGetLastError()), cudaErrorInvalidValue for a null operand, cudaSuccess
// for n == 0. Asynchronous: errors of the kernel's execution surface at the
// next sync. Pointers are device pointers; no alignment is required (16-byte
// vector accesses are used where every operand allows them).
//
// The per-element arithmetic is the CPU kernels' own (kernels/common), and
// the file is compiled with --fmad=false, so the results equal the CPU
// DeviceOps bit for bit.
#ifndef ZEROSHARD_KERNELS_CUDA_DEVICE_OPS_CUH_
#define ZEROSHARD_KERNELS_CUDA_DEVICE_OPS_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/adam.cuh"
#include "kernels/cuda/launch_config.h"

namespace zeroshard::kernels::cuda {

// acc[i] += add[i] for n elements of `type` (kernels/common/
// accumulate_element.h: fp32 adds; bf16 / fp16 widen, add in fp32 and round
// once to nearest even). acc and add must not overlap.
cudaError_t LaunchAccumulate(void* acc, const void* add, size_t n, ElementType type,
                             cudaStream_t stream);

// blocks[b] = the sum of squares of block b of x (kernels/common/
// norm_block.h: ceil(n / kNormBlock) blocks, the last one partial, in the
// fixed lane order), one thread per block.
cudaError_t LaunchBlockSumSquares(const void* x, size_t n, ElementType type, double* blocks,
                                  cudaStream_t stream);

}  // namespace zeroshard::kernels::cuda

#endif  // ZEROSHARD_KERNELS_CUDA_DEVICE_OPS_CUH_
