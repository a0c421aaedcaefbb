// The local backend's rank-order sum on device memory (ranks as threads on
// one GPU: every rank's buffer is its own array): the rules of
// kernels/common/rank_order_sum.h, the contract of engine/src/comm/reduce.h (element i = ((x_0[i] +
// x_1[i]) + x_2[i]) + ..., fp32 accumulation for fp32/bf16/fp16 with 16-bit results rounded once to
// nearest even, fp64 in double, int64 wrapping), with the same bits.
//
// Plain C++ declarations: a .cc file compiled by the host compiler may
// include this header; it needs the CUDA runtime headers only.
#ifndef ZEROSHARD_KERNELS_CUDA_SUM_IN_RANK_ORDER_CUH_
#define ZEROSHARD_KERNELS_CUDA_SUM_IN_RANK_ORDER_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/common/rank_order_sum.h"

namespace zeroshard::kernels::cuda {

inline constexpr int kMaxSumOperands = 8;

// Sums `num_inputs` device arrays of n elements (in order) into each of
// `num_outputs` device arrays, on `stream`. An output may be one of the
// inputs (each element is read from every input before it is written).
// cudaErrorInvalidValue for counts outside [1, kMaxSumOperands] or null
// pointers; otherwise the launch error. Asynchronous.
cudaError_t LaunchSumInRankOrder(const void* const* inputs, int num_inputs, void* const* outputs,
                                 int num_outputs, size_t n, SumType type, cudaStream_t stream);

}  // namespace zeroshard::kernels::cuda

#endif  // ZEROSHARD_KERNELS_CUDA_SUM_IN_RANK_ORDER_CUH_
