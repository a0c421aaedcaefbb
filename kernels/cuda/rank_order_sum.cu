// The rank-order sum of the nccl communicator: one rule per type
// (kernels/common/rank_order_sum.h), one grid-stride kernel per path, one
// host launcher.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/common/rank_order_sum.h"
#include "kernels/cuda/rank_order_sum.cuh"

namespace zeroshard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU; the grid-stride loops cover the rest.
constexpr size_t kMaxBlocks = 65535;
constexpr size_t kVectorBytes = 16;

// One element per step: any count, any alignment.
template <class Rule>
__global__ void RankOrderSumKernel(const typename Rule::Storage* staging, int ranks, size_t count,
                                   typename Rule::Storage* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    out[i] = RankOrderSumElement<Rule>(staging + i, count, ranks);
  }
}

// 16 bytes per load and store. Used only when both buffers are 16-byte
// aligned and a block is a whole number of vectors, so every rank's block
// starts aligned too. Each lane goes through the same Widen / Add / Narrow
// steps, in the same rank order, as RankOrderSumElement: the bits do not
// depend on which path ran.
template <class Rule>
__global__ void RankOrderSumVectorKernel(const typename Rule::Storage* staging, int ranks,
                                         size_t count, typename Rule::Storage* out) {
  using Storage = typename Rule::Storage;
  using Acc = typename Rule::Acc;
  constexpr int kLanes = static_cast<int>(kVectorBytes / sizeof(Storage));
  const size_t vectors = count / kLanes;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t v = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors;
       v += stride) {
    const size_t i = v * kLanes;
    Storage lanes[kLanes];
    uint4 raw = *reinterpret_cast<const uint4*>(staging + i);
    memcpy(lanes, &raw, kVectorBytes);
    Acc acc[kLanes];
#pragma unroll
    for (int l = 0; l < kLanes; ++l) acc[l] = Rule::Widen(lanes[l]);
    for (int k = 1; k < ranks; ++k) {
      raw = *reinterpret_cast<const uint4*>(staging + static_cast<size_t>(k) * count + i);
      memcpy(lanes, &raw, kVectorBytes);
#pragma unroll
      for (int l = 0; l < kLanes; ++l) acc[l] = Rule::Add(acc[l], Rule::Widen(lanes[l]));
    }
#pragma unroll
    for (int l = 0; l < kLanes; ++l) lanes[l] = Rule::Narrow(acc[l]);
    memcpy(&raw, lanes, kVectorBytes);
    *reinterpret_cast<uint4*>(out + i) = raw;
  }
}

template <class Rule>
cudaError_t Launch(const void* staging_bytes, int ranks, size_t count, void* out_bytes,
                   cudaStream_t stream) {
  using Storage = typename Rule::Storage;
  const auto* staging = static_cast<const Storage*>(staging_bytes);
  auto* out = static_cast<Storage*>(out_bytes);
  const bool aligned = reinterpret_cast<uintptr_t>(staging) % kVectorBytes == 0 &&
                       reinterpret_cast<uintptr_t>(out) % kVectorBytes == 0 &&
                       (count * sizeof(Storage)) % kVectorBytes == 0;
  if (aligned) {
    const size_t vectors = count / (kVectorBytes / sizeof(Storage));
    const size_t blocks = std::min(kMaxBlocks, (vectors + kThreads - 1) / kThreads);
    RankOrderSumVectorKernel<Rule>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(staging, ranks, count, out);
  } else {
    const size_t blocks = std::min(kMaxBlocks, (count + kThreads - 1) / kThreads);
    RankOrderSumKernel<Rule>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(staging, ranks, count, out);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRankOrderSum(const void* staging, int ranks, size_t count, SumType type,
                               void* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (staging == nullptr || out == nullptr || ranks < 1) return cudaErrorInvalidValue;
  switch (type) {
    case SumType::kFp32:
      return Launch<Fp32SumRule>(staging, ranks, count, out, stream);
    case SumType::kBf16:
      return Launch<Bf16SumRule>(staging, ranks, count, out, stream);
    case SumType::kFp16:
      return Launch<Fp16SumRule>(staging, ranks, count, out, stream);
    case SumType::kFp64:
      return Launch<Fp64SumRule>(staging, ranks, count, out, stream);
    case SumType::kInt64:
      return Launch<Int64SumRule>(staging, ranks, count, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace zeroshard::kernels::cuda
