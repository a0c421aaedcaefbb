// Device-side loads and stores of the three element types, one element or a
// vector of them at a time, for the kernels of kernels/cuda. 16-bit values
// are widened and rounded by the project's rules (kernels/common/
// float16_rules.h), on bits, never by the device's conversion instructions.
#ifndef ZEROSHARD_KERNELS_CUDA_INTERNAL_ELEMENT_IO_CUH_
#define ZEROSHARD_KERNELS_CUDA_INTERNAL_ELEMENT_IO_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/cuda/launch_config.h"

namespace zeroshard::kernels::cuda::internal {

template <ElementType kType>
struct Element;

template <>
struct Element<ElementType::kFp32> {
  using Storage = float;
  static __device__ __forceinline__ float ToFp32(float x) { return x; }
  static __device__ __forceinline__ float FromFp32(float x) { return x; }
};

template <>
struct Element<ElementType::kBf16> {
  using Storage = uint16_t;
  static __device__ __forceinline__ float ToFp32(uint16_t x) { return Bf16ToFp32(x); }
  static __device__ __forceinline__ uint16_t FromFp32(float x) { return Fp32ToBf16Rne(x); }
};

template <>
struct Element<ElementType::kFp16> {
  using Storage = uint16_t;
  static __device__ __forceinline__ float ToFp32(uint16_t x) { return Fp16ToFp32(x); }
  static __device__ __forceinline__ uint16_t FromFp32(float x) { return Fp32ToFp16Rne(x); }
};

template <ElementType kType>
using Storage = typename Element<kType>::Storage;

// Host side: may a kernel use `bytes`-wide vector accesses from `p`?
inline bool IsAligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Four consecutive elements as fp32: one 16-byte load for fp32, one 8-byte
// load for 16-bit types. `p` must be aligned to that width.
template <ElementType kType>
__device__ __forceinline__ void Load4(const Storage<kType>* p, float (&x)[4]) {
  if constexpr (kType == ElementType::kFp32) {
    const float4 w = *reinterpret_cast<const float4*>(p);
    x[0] = w.x;
    x[1] = w.y;
    x[2] = w.z;
    x[3] = w.w;
  } else {
    // Little-endian: element 2k is the low half of word k.
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    x[0] = Element<kType>::ToFp32(static_cast<uint16_t>(w.x & 0xffffu));
    x[1] = Element<kType>::ToFp32(static_cast<uint16_t>(w.x >> 16));
    x[2] = Element<kType>::ToFp32(static_cast<uint16_t>(w.y & 0xffffu));
    x[3] = Element<kType>::ToFp32(static_cast<uint16_t>(w.y >> 16));
  }
}

// Stores four fp32 values as kType (16-bit: rounded to nearest even), with
// the access width of Load4.
template <ElementType kType>
__device__ __forceinline__ void Store4(Storage<kType>* p, const float (&x)[4]) {
  if constexpr (kType == ElementType::kFp32) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    const uint32_t h0 = Element<kType>::FromFp32(x[0]);
    const uint32_t h1 = Element<kType>::FromFp32(x[1]);
    const uint32_t h2 = Element<kType>::FromFp32(x[2]);
    const uint32_t h3 = Element<kType>::FromFp32(x[3]);
    *reinterpret_cast<uint2*>(p) = make_uint2(h0 | (h1 << 16), h2 | (h3 << 16));
  }
}

// Eight consecutive 16-bit elements, raw, in one 16-byte access.
__device__ __forceinline__ void Load8Bits(const uint16_t* p, uint16_t (&h)[8]) {
  const uint4 w = *reinterpret_cast<const uint4*>(p);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  for (int k = 0; k < 4; ++k) {
    h[2 * k] = static_cast<uint16_t>(words[k] & 0xffffu);
    h[2 * k + 1] = static_cast<uint16_t>(words[k] >> 16);
  }
}

__device__ __forceinline__ void Store8Bits(uint16_t* p, const uint16_t (&h)[8]) {
  uint32_t words[4];
  for (int k = 0; k < 4; ++k) {
    words[k] = static_cast<uint32_t>(h[2 * k]) | (static_cast<uint32_t>(h[2 * k + 1]) << 16);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
}

// The first item of this thread and the grid's stride, as size_t so that the
// loop counts past 2^31 elements.
__device__ __forceinline__ size_t FirstItem() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t GridStride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

}  // namespace zeroshard::kernels::cuda::internal

#endif  // ZEROSHARD_KERNELS_CUDA_INTERNAL_ELEMENT_IO_CUH_
