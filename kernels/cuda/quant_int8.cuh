// The blockwise int8 quantization of the qwZ weight all-gather on the GPU
// (kernels/common/quant_int8.h says the format and the numbers): the same
// element functions as the CPU DeviceOps, so the same bits.
//
// Plain C++ declarations, like device_ops.cuh. Each launcher enqueues on
// `stream` and returns the launch error, cudaErrorInvalidValue for a null
// operand, cudaSuccess for n == 0. `packed` must be 8-byte aligned.
#ifndef ZEROSHARD_KERNELS_CUDA_QUANT_INT8_CUH_
#define ZEROSHARD_KERNELS_CUDA_QUANT_INT8_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/launch_config.h"

namespace zeroshard::kernels::cuda {

// n elements of x (of `type`) into QuantPackedBytes(n) bytes at `packed`:
// one thread block per quantization block.
cudaError_t LaunchQuantizeInt8(const void* x, size_t n, ElementType type, void* packed,
                               cudaStream_t stream);

// The packed form of n elements back into n elements of `type` at `out`.
cudaError_t LaunchDequantizeInt8(const void* packed, size_t n, ElementType type, void* out,
                                 cudaStream_t stream);

}  // namespace zeroshard::kernels::cuda

#endif  // ZEROSHARD_KERNELS_CUDA_QUANT_INT8_CUH_
