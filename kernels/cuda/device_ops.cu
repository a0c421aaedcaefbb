// Accumulate and BlockSumSquares: the shared element rules of kernels/common
// in grid-stride kernels.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/common/accumulate_element.h"
#include "kernels/common/norm_block.h"
#include "kernels/cuda/device_ops.cuh"
#include "kernels/cuda/internal/element_io.cuh"

namespace zeroshard::kernels::cuda {
namespace {

using internal::FirstItem;
using internal::GridStride;
using internal::IsAligned;

template <ElementType kType>
__device__ __forceinline__ uint16_t Accumulate16(uint16_t acc, uint16_t add) {
  if constexpr (kType == ElementType::kBf16) {
    return AccumulateBf16(acc, add);
  } else {
    return AccumulateFp16(acc, add);
  }
}

// With `vectorized`, threads take 16 bytes of both operands at a time (four
// fp32 or eight 16-bit elements) and the remainder one by one.
__global__ void AccumulateFp32Kernel(float* acc, const float* add, size_t n, bool vectorized) {
  const size_t first = FirstItem();
  const size_t stride = GridStride();
  size_t scalar_begin = 0;
  if (vectorized) {
    const size_t groups = n / 4;
    for (size_t group = first; group < groups; group += stride) {
      float4 a = reinterpret_cast<const float4*>(acc)[group];
      const float4 b = reinterpret_cast<const float4*>(add)[group];
      a.x = AccumulateFp32(a.x, b.x);
      a.y = AccumulateFp32(a.y, b.y);
      a.z = AccumulateFp32(a.z, b.z);
      a.w = AccumulateFp32(a.w, b.w);
      reinterpret_cast<float4*>(acc)[group] = a;
    }
    scalar_begin = groups * 4;
  }
  for (size_t i = scalar_begin + first; i < n; i += stride) acc[i] = AccumulateFp32(acc[i], add[i]);
}

template <ElementType kType>
__global__ void Accumulate16Kernel(uint16_t* acc, const uint16_t* add, size_t n, bool vectorized) {
  const size_t first = FirstItem();
  const size_t stride = GridStride();
  size_t scalar_begin = 0;
  if (vectorized) {
    const size_t groups = n / 8;
    for (size_t group = first; group < groups; group += stride) {
      uint16_t a[8], b[8];
      internal::Load8Bits(acc + group * 8, a);
      internal::Load8Bits(add + group * 8, b);
      for (int k = 0; k < 8; ++k) a[k] = Accumulate16<kType>(a[k], b[k]);
      internal::Store8Bits(acc + group * 8, a);
    }
    scalar_begin = groups * 8;
  }
  for (size_t i = scalar_begin + first; i < n; i += stride) {
    acc[i] = Accumulate16<kType>(acc[i], add[i]);
  }
}

// One thread per block of kNormBlock elements: the thread keeps the block's
// eight lanes itself, so the order is the CPU's without any cross-thread
// reduction. With `vectorized` (x 16-byte aligned, hence every block start
// too), full blocks are read 16 bytes at a time.
template <ElementType kType>
__global__ void BlockSumSquaresKernel(const internal::Storage<kType>* x, size_t n, double* blocks,
                                      bool vectorized) {
  using Loader =
      std::conditional_t<kType == ElementType::kFp32, Fp32Loader,
                         std::conditional_t<kType == ElementType::kBf16, Bf16Loader, Fp16Loader>>;
  const size_t block_count = (n + kNormBlock - 1) / kNormBlock;
  for (size_t b = FirstItem(); b < block_count; b += GridStride()) {
    const auto* block = x + b * kNormBlock;
    const size_t len = n - b * kNormBlock < kNormBlock ? n - b * kNormBlock : kNormBlock;
    if (!vectorized || len < kNormBlock) {
      blocks[b] = NormBlockSumSquares(Loader{block}, len);
      continue;
    }
    NormLanes lanes;
    for (size_t i = 0; i < kNormBlock; i += kNormLanes) {
      float group[kNormLanes];
      if constexpr (kType == ElementType::kFp32) {
        const float4 lo = *reinterpret_cast<const float4*>(block + i);
        const float4 hi = *reinterpret_cast<const float4*>(block + i + 4);
        group[0] = lo.x;
        group[1] = lo.y;
        group[2] = lo.z;
        group[3] = lo.w;
        group[4] = hi.x;
        group[5] = hi.y;
        group[6] = hi.z;
        group[7] = hi.w;
      } else {
        uint16_t h[8];
        internal::Load8Bits(block + i, h);
        for (int k = 0; k < 8; ++k) group[k] = internal::Element<kType>::ToFp32(h[k]);
      }
      lanes.AddGroup(group);
    }
    blocks[b] = lanes.Sum();
  }
}

}  // namespace

cudaError_t LaunchAccumulate(void* acc, const void* add, size_t n, ElementType type,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (acc == nullptr || add == nullptr) return cudaErrorInvalidValue;
  const bool vectorized = IsAligned(acc, 16) && IsAligned(add, 16);
  const size_t per_vector = type == ElementType::kFp32 ? 4 : 8;
  const unsigned grid = GridBlocks(vectorized ? n / per_vector + n % per_vector : n);
  switch (type) {
    case ElementType::kFp32:
      AccumulateFp32Kernel<<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<float*>(acc), static_cast<const float*>(add), n, vectorized);
      break;
    case ElementType::kBf16:
      Accumulate16Kernel<ElementType::kBf16><<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(add), n, vectorized);
      break;
    case ElementType::kFp16:
      Accumulate16Kernel<ElementType::kFp16><<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(add), n, vectorized);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchBlockSumSquares(const void* x, size_t n, ElementType type, double* blocks,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (x == nullptr || blocks == nullptr) return cudaErrorInvalidValue;
  const bool vectorized = IsAligned(x, 16);
  const unsigned grid = GridBlocks((n + kNormBlock - 1) / kNormBlock);
  switch (type) {
    case ElementType::kFp32:
      BlockSumSquaresKernel<ElementType::kFp32><<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<const float*>(x), n, blocks, vectorized);
      break;
    case ElementType::kBf16:
      BlockSumSquaresKernel<ElementType::kBf16><<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), n, blocks, vectorized);
      break;
    case ElementType::kFp16:
      BlockSumSquaresKernel<ElementType::kFp16><<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), n, blocks, vectorized);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace zeroshard::kernels::cuda
