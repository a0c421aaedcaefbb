#include "examples/mlp/internal/view_convert.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace internal {
namespace {

absl::Status CheckView(const TensorView& view, const char* what) {
  if (!IsSupportedViewDType(view.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": view of dtype ", DTypeName(view.dtype),
                     "; the MLP example handles fp32, bf16 and fp16"));
  }
  if (view.numel < 0 || (view.numel > 0 && view.data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": view of ", view.numel, " elements has no data"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSupportedViewDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

absl::Status ReadAsFp32(const TensorView& view, float* dst) {
  ZS_RETURN_IF_ERROR(CheckView(view, "ReadAsFp32"));
  const int64_t n = view.numel;
  switch (view.dtype) {
    case DType::kFloat32:
      std::memcpy(dst, view.data, static_cast<size_t>(n) * sizeof(float));
      break;
    case DType::kBFloat16:
      ConvertBf16ToFp32(view.as<const uint16_t>(), dst, static_cast<size_t>(n));
      break;
    default:
      ConvertFp16ToFp32(view.as<const uint16_t>(), dst, static_cast<size_t>(n));
      break;
  }
  return absl::OkStatus();
}

absl::Status WriteFromFp32(const float* src, const TensorView& view) {
  ZS_RETURN_IF_ERROR(CheckView(view, "WriteFromFp32"));
  const int64_t n = view.numel;
  switch (view.dtype) {
    case DType::kFloat32:
      std::memcpy(view.data, src, static_cast<size_t>(n) * sizeof(float));
      break;
    case DType::kBFloat16:
      ConvertFp32ToBf16(src, view.as<uint16_t>(), static_cast<size_t>(n));
      break;
    default:
      ConvertFp32ToFp16(src, view.as<uint16_t>(), static_cast<size_t>(n));
      break;
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard
