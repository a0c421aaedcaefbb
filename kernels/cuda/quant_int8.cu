// Blockwise int8 quantization kernels (quant_int8.cuh).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/quant_int8.h"
#include "kernels/cuda/internal/element_io.cuh"
#include "kernels/cuda/quant_int8.cuh"

namespace zeroshard::kernels::cuda {
namespace {

static_assert(kQuantBlock == kLaunchThreads, "one thread per element of a quantization block");

template <ElementType kType>
__global__ void QuantizeKernel(const internal::Storage<kType>* x, int64_t n, int8_t* q,
                               float* scales, int64_t scale_pad_bytes) {
  __shared__ float absmax[kLaunchThreads];
  const int64_t block = blockIdx.x;
  const int64_t i = block * kQuantBlock + threadIdx.x;
  const float v = i < n ? internal::Element<kType>::ToFp32(x[i]) : 0.0f;
  absmax[threadIdx.x] = fabsf(v);
  __syncthreads();
  // The largest magnitude: max is exact, so the reduction order is free.
  for (unsigned stride = kLaunchThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      absmax[threadIdx.x] = fmaxf(absmax[threadIdx.x], absmax[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float scale = QuantScale(absmax[0]);
  if (i < n) q[i] = QuantizeElement(v, scale);
  if (threadIdx.x == 0) scales[block] = scale;
  // The padding travels too: zeros, never uninitialised bytes.
  if (block == 0) {
    for (int64_t p = n + threadIdx.x; p < QuantScalesOffset(n); p += kLaunchThreads) q[p] = 0;
    char* tail = reinterpret_cast<char*>(scales + QuantBlocks(n));
    for (int64_t p = threadIdx.x; p < scale_pad_bytes; p += kLaunchThreads) tail[p] = 0;
  }
}

template <ElementType kType>
__global__ void DequantizeKernel(const int8_t* q, const float* scales, int64_t n,
                                 internal::Storage<kType>* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = internal::Element<kType>::FromFp32(DequantizeElement(q[i], scales[i / kQuantBlock]));
  }
}

}  // namespace

cudaError_t LaunchQuantizeInt8(const void* x, size_t n, ElementType type, void* packed,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (x == nullptr || packed == nullptr) return cudaErrorInvalidValue;
  const int64_t count = static_cast<int64_t>(n);
  int8_t* q = static_cast<int8_t*>(packed);
  float* scales = reinterpret_cast<float*>(static_cast<char*>(packed) + QuantScalesOffset(count));
  const int64_t pad = QuantPackedBytes(count) - QuantScalesOffset(count) - QuantBlocks(count) * 4;
  const unsigned grid = static_cast<unsigned>(QuantBlocks(count));
  switch (type) {
    case ElementType::kFp32:
      QuantizeKernel<ElementType::kFp32><<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<const float*>(x), count, q, scales, pad);
      break;
    case ElementType::kBf16:
      QuantizeKernel<ElementType::kBf16><<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), count, q, scales, pad);
      break;
    case ElementType::kFp16:
      QuantizeKernel<ElementType::kFp16><<<grid, kLaunchThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), count, q, scales, pad);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchDequantizeInt8(const void* packed, size_t n, ElementType type, void* out,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (packed == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const int64_t count = static_cast<int64_t>(n);
  const int8_t* q = static_cast<const int8_t*>(packed);
  const float* scales =
      reinterpret_cast<const float*>(static_cast<const char*>(packed) + QuantScalesOffset(count));
  const unsigned grid = GridBlocks(n);
  switch (type) {
    case ElementType::kFp32:
      DequantizeKernel<ElementType::kFp32>
          <<<grid, kLaunchThreads, 0, stream>>>(q, scales, count, static_cast<float*>(out));
      break;
    case ElementType::kBf16:
      DequantizeKernel<ElementType::kBf16>
          <<<grid, kLaunchThreads, 0, stream>>>(q, scales, count, static_cast<uint16_t*>(out));
      break;
    case ElementType::kFp16:
      DequantizeKernel<ElementType::kFp16>
          <<<grid, kLaunchThreads, 0, stream>>>(q, scales, count, static_cast<uint16_t*>(out));
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace zeroshard::kernels::cuda
