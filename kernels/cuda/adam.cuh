// Fused one-pass AdamW / Adam-L2 on device buffers.
//
// Plain C++ declarations (no CUDA syntax): a .cc file compiled by the host
// compiler may include this header; it needs the CUDA runtime headers only.
//
// Numeric contract: the one of kernels/cpu/adam.h, operation by operation, in
// fp32 with the same host-derived AdamConstants (MakeAdamConstants). The file
// is compiled with --fmad=false and IEEE division and square root, so the
// results match the CPU paths bit for bit.
#ifndef ZEROSHARD_KERNELS_CUDA_ADAM_CUH_
#define ZEROSHARD_KERNELS_CUDA_ADAM_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam.h"

namespace zeroshard::kernels::cuda {

// Launches the update of n elements on `stream`. All pointers are device
// pointers to n elements, fp32 unless named bf16 (raw uint16_t bits), and must
// not overlap. `param_out` (bf16) may be null for the fp32 variant, where
// `master` is the param itself; `grad` is fp32 unless `grad_bf16` is given
// (then `grad` must be null). Returns the launch error (cudaGetLastError()),
// cudaErrorInvalidValue for inconsistent pointers; cudaSuccess for n == 0.
// Asynchronous: errors of the kernel's execution surface at the next sync.
cudaError_t LaunchAdam(float* master, uint16_t* param_out, const float* grad,
                       const uint16_t* grad_bf16, float* m, float* v, size_t n,
                       const AdamConstants& c, cudaStream_t stream);

}  // namespace zeroshard::kernels::cuda

#endif  // ZEROSHARD_KERNELS_CUDA_ADAM_CUH_
