// The nccl communicator's reduction: sums the blocks that every rank sent
// into a staging buffer, in rank order, on the device.
//
// Plain C++ declarations (no CUDA syntax): a .cc file compiled by the host
// compiler may include this header; it needs the CUDA runtime headers only.
//
// Numeric contract: kernels/common/rank_order_sum.h, element by element, so
// the result has the bits of the host reduction of the local and mpi
// backends. The file is compiled with --fmad=false and IEEE arithmetic.
#ifndef ZEROSHARD_KERNELS_CUDA_RANK_ORDER_SUM_CUH_
#define ZEROSHARD_KERNELS_CUDA_RANK_ORDER_SUM_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/common/rank_order_sum.h"

namespace zeroshard::kernels::cuda {

// Launches out[i] = sum over k in [0, ranks) of staging[k * count + i], in
// rank order, for i in [0, count), on `stream`. `staging` holds ranks * count
// elements of `type` (rank k's contribution is block k); `out` holds count
// elements and must not overlap `staging`. Both are device pointers.
// Returns the launch error (cudaGetLastError()), cudaErrorInvalidValue for a
// null pointer, ranks < 1 or an unknown type; cudaSuccess for count == 0.
// Asynchronous: errors of the kernel's execution surface at the next sync.
cudaError_t LaunchRankOrderSum(const void* staging, int ranks, size_t count, SumType type,
                               void* out, cudaStream_t stream);

}  // namespace zeroshard::kernels::cuda

#endif  // ZEROSHARD_KERNELS_CUDA_RANK_ORDER_SUM_CUH_
