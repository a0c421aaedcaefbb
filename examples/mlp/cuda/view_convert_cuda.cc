#include "examples/mlp/cuda/view_convert_cuda.h"

#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "examples/mlp/cuda/cuda_status.h"
#include "examples/mlp/cuda/internal/mlp_kernels.cuh"
#include "zeroshard/dtype.h"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace {

absl::Status CheckView(const TensorView& view, const void* array, const char* what) {
  if (view.dtype != DType::kFloat32 && view.dtype != DType::kBFloat16 &&
      view.dtype != DType::kFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": view of dtype ", DTypeName(view.dtype),
                     "; the MLP example handles fp32, bf16 and fp16"));
  }
  if (view.numel < 0 || (view.numel > 0 && (view.data == nullptr || array == nullptr))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": view or array of ", view.numel, " elements has no data"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadAsFp32Cuda(const TensorView& view, float* dst, cudaStream_t stream) {
  ZS_RETURN_IF_ERROR(CheckView(view, dst, "ReadAsFp32Cuda"));
  const size_t n = static_cast<size_t>(view.numel);
  if (n == 0) return absl::OkStatus();
  switch (view.dtype) {
    case DType::kFloat32:
      return CudaCallStatus(
          cudaMemcpyAsync(dst, view.data, n * sizeof(float), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync (ReadAsFp32Cuda, fp32 view)");
    case DType::kBFloat16:
      return CudaCallStatus(internal::LaunchBf16ToFp32(view.as<const uint16_t>(), n, dst, stream),
                            "LaunchBf16ToFp32 (ReadAsFp32Cuda)");
    default:
      return CudaCallStatus(internal::LaunchFp16ToFp32(view.as<const uint16_t>(), n, dst, stream),
                            "LaunchFp16ToFp32 (ReadAsFp32Cuda)");
  }
}

absl::Status WriteFromFp32Cuda(const float* src, const TensorView& view, cudaStream_t stream) {
  ZS_RETURN_IF_ERROR(CheckView(view, src, "WriteFromFp32Cuda"));
  const size_t n = static_cast<size_t>(view.numel);
  if (n == 0) return absl::OkStatus();
  switch (view.dtype) {
    case DType::kFloat32:
      return CudaCallStatus(
          cudaMemcpyAsync(view.data, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync (WriteFromFp32Cuda, fp32 view)");
    case DType::kBFloat16:
      return CudaCallStatus(internal::LaunchFp32ToBf16(src, n, view.as<uint16_t>(), stream),
                            "LaunchFp32ToBf16 (WriteFromFp32Cuda)");
    default:
      return CudaCallStatus(internal::LaunchFp32ToFp16(src, n, view.as<uint16_t>(), stream),
                            "LaunchFp32ToFp16 (WriteFromFp32Cuda)");
  }
}

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
