#include "examples/mlp/internal/view_convert.h"

#include <cstdint>
#include <cstring>
#include <vector>

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

// Every fp16 value widened once by Fp16ToFp32: a lookup is several times
// faster than the branchy conversion, with the same bits by construction
// (the trainer widens a whole unit twice per micro-batch).
const float* Fp16ToFp32Table() {
  static const std::vector<float>* const table = [] {
    auto* t = new std::vector<float>(size_t{1} << 16);
    for (uint32_t h = 0; h < (uint32_t{1} << 16); ++h) {
      (*t)[h] = Fp16ToFp32(static_cast<uint16_t>(h));
    }
    return t;
  }();
  return table->data();
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
    case DType::kBFloat16: {
      const uint16_t* src = view.as<const uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(src[i]);
      break;
    }
    default: {
      const uint16_t* src = view.as<const uint16_t>();
      const float* table = Fp16ToFp32Table();
      for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
      break;
    }
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
    case DType::kBFloat16: {
      uint16_t* dst = view.as<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp32ToBf16(src[i]);
      break;
    }
    default: {
      uint16_t* dst = view.as<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp32ToFp16(src[i]);
      break;
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard
