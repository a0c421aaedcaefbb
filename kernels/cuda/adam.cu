// Fused AdamW / Adam-L2: the shared element rule, one grid-stride kernel per
// operand combination, one launcher.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/adam_element.h"
#include "kernels/cuda/adam.cuh"
#include "kernels/cuda/internal/element_io.cuh"

namespace zeroshard::kernels::cuda {
namespace {

using internal::Element;
using internal::FirstItem;
using internal::GridStride;
using internal::Load4;
using internal::Storage;
using internal::Store4;

// kOut == kFp32 means no 16-bit copy. With `vectorized`, threads take groups
// of four elements (16-byte fp32 accesses) and the last n % 4 elements one by
// one; every element goes through the same AdamElement either way.
template <ElementType kGrad, ElementType kOut>
__global__ void AdamKernel(AdamConstants c, float* master, uint16_t* param_out,
                           const Storage<kGrad>* grad, float* m, float* v, size_t n,
                           bool vectorized) {
  const size_t first = FirstItem();
  const size_t stride = GridStride();
  size_t scalar_begin = 0;
  if (vectorized) {
    const size_t groups = n / 4;
    for (size_t group = first; group < groups; group += stride) {
      const size_t i = group * 4;
      float g[4], p[4], mi[4], vi[4];
      Load4<kGrad>(grad + i, g);
      Load4<ElementType::kFp32>(master + i, p);
      Load4<ElementType::kFp32>(m + i, mi);
      Load4<ElementType::kFp32>(v + i, vi);
      for (int k = 0; k < 4; ++k) AdamElement(c, g[k], p[k], mi[k], vi[k]);
      Store4<ElementType::kFp32>(master + i, p);
      Store4<ElementType::kFp32>(m + i, mi);
      Store4<ElementType::kFp32>(v + i, vi);
      if constexpr (kOut != ElementType::kFp32) Store4<kOut>(param_out + i, p);
    }
    scalar_begin = groups * 4;
  }
  for (size_t i = scalar_begin + first; i < n; i += stride) {
    float p = master[i];
    float mi = m[i];
    float vi = v[i];
    AdamElement(c, Element<kGrad>::ToFp32(grad[i]), p, mi, vi);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kOut != ElementType::kFp32) param_out[i] = Element<kOut>::FromFp32(p);
  }
}

template <ElementType kGrad, ElementType kOut>
cudaError_t Launch(const AdamLaunchArgs& a, const AdamConstants& c, cudaStream_t stream) {
  // fp32 operands move 16 bytes at a time, 16-bit ones 8 bytes (four
  // elements either way).
  const size_t grad_width = kGrad == ElementType::kFp32 ? 16 : 8;
  const bool vectorized = internal::IsAligned(a.master, 16) && internal::IsAligned(a.m, 16) &&
                          internal::IsAligned(a.v, 16) && internal::IsAligned(a.grad, grad_width) &&
                          (kOut == ElementType::kFp32 || internal::IsAligned(a.param_out, 8));
  const size_t work = vectorized ? a.n / 4 + a.n % 4 : a.n;
  AdamKernel<kGrad, kOut><<<GridBlocks(work), kLaunchThreads, 0, stream>>>(
      c, a.master, a.param_out, static_cast<const Storage<kGrad>*>(a.grad), a.m, a.v, a.n,
      vectorized);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAdam(const AdamLaunchArgs& a, const AdamConstants& c, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  const bool has_copy = a.param_out_type != ElementType::kFp32;
  if (a.master == nullptr || a.grad == nullptr || a.m == nullptr || a.v == nullptr ||
      has_copy != (a.param_out != nullptr)) {
    return cudaErrorInvalidValue;
  }
  constexpr ElementType kFp32 = ElementType::kFp32;
  constexpr ElementType kBf16 = ElementType::kBf16;
  constexpr ElementType kFp16 = ElementType::kFp16;
  if (a.grad_type == kFp32) {
    switch (a.param_out_type) {
      case kFp32:
        return Launch<kFp32, kFp32>(a, c, stream);
      case kBf16:
        return Launch<kFp32, kBf16>(a, c, stream);
      case kFp16:
        return Launch<kFp32, kFp16>(a, c, stream);
    }
  }
  if (a.grad_type == kBf16 && a.param_out_type == kBf16) return Launch<kBf16, kBf16>(a, c, stream);
  if (a.grad_type == kFp16 && a.param_out_type == kFp16) return Launch<kFp16, kFp16>(a, c, stream);
  return cudaErrorInvalidValue;
}

cudaError_t LaunchAdam(float* master, uint16_t* param_out, const float* grad,
                       const uint16_t* grad_bf16, float* m, float* v, size_t n,
                       const AdamConstants& c, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if ((grad == nullptr) == (grad_bf16 == nullptr)) return cudaErrorInvalidValue;
  AdamLaunchArgs a;
  a.master = master;
  a.param_out = param_out;
  a.param_out_type = param_out != nullptr ? ElementType::kBf16 : ElementType::kFp32;
  a.grad = grad != nullptr ? static_cast<const void*>(grad) : grad_bf16;
  a.grad_type = grad != nullptr ? ElementType::kFp32 : ElementType::kBf16;
  a.m = m;
  a.v = v;
  a.n = n;
  return LaunchAdam(a, c, stream);
}

}  // namespace zeroshard::kernels::cuda
