#include "examples/mlp/internal/view_convert.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "examples/mlp/mlp.h"
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

absl::Status CheckUnitView(const UnitView& view, int unit, const std::vector<int64_t>& sizes,
                           const char* who, const char* what) {
  if (view.params.size() != sizes.size()) {
    return absl::InternalError(absl::StrCat(who, ": ", what, " of unit block.", unit, " has ",
                                            view.params.size(), " params, expected ",
                                            sizes.size()));
  }
  for (size_t p = 0; p < sizes.size(); ++p) {
    const TensorView& t = view.params[p];
    if (t.numel != sizes[p] || t.data == nullptr) {
      return absl::InternalError(absl::StrCat(who, ": ", what, " of unit block.", unit, " param ",
                                              p, " has ", t.numel, " elements, expected ",
                                              sizes[p]));
    }
    if (!IsSupportedViewDType(t.dtype)) {
      return absl::UnimplementedError(
          absl::StrCat(who, ": ", what, " of unit block.", unit, " param ", p, " is ",
                       DTypeName(t.dtype), "; the MLP example handles fp32, bf16 and fp16"));
    }
  }
  return absl::OkStatus();
}

absl::Status UnitParamsAsFp32(const UnitView& view, int unit, const std::vector<int64_t>& sizes,
                              const char* who, float* copy, const float** params) {
  ZS_RETURN_IF_ERROR(CheckUnitView(view, unit, sizes, who, "params"));
  size_t offset = 0;
  for (size_t p = 0; p < sizes.size(); ++p) {
    const TensorView& t = view.params[p];
    if (t.dtype == DType::kFloat32) {
      params[p] = t.as<const float>();
    } else {
      // BLAS wants fp32: widen the 16-bit params (exactly) into the copy.
      float* dst = copy + offset;
      ZS_RETURN_IF_ERROR(ReadAsFp32(t, dst));
      params[p] = dst;
    }
    offset += static_cast<size_t>(sizes[p]);
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockWeights> BlockWeightsAsFp32(const UnitView& view, int unit,
                                                const std::vector<int64_t>& sizes, const char* who,
                                                float* copy) {
  const float* ptrs[kNumBlockParams];
  if (sizes.size() != kNumBlockParams) {
    return absl::InternalError(absl::StrCat(who, ": a block has ", kNumBlockParams,
                                            " params, got sizes for ", sizes.size()));
  }
  ZS_RETURN_IF_ERROR(UnitParamsAsFp32(view, unit, sizes, who, copy, ptrs));
  return BlockWeights{ptrs[kW1], ptrs[kB1], ptrs[kW2], ptrs[kB2]};
}

absl::Status WriteUnitFromFp32(const float* src, const UnitView& view, int unit,
                               const std::vector<int64_t>& sizes, const char* who) {
  ZS_RETURN_IF_ERROR(CheckUnitView(view, unit, sizes, who, "gradient view"));
  size_t offset = 0;
  for (size_t p = 0; p < sizes.size(); ++p) {
    // Overwrite, never accumulate: the engine does the summing, in an order
    // that does not depend on the world size.
    ZS_RETURN_IF_ERROR(WriteFromFp32(src + offset, view.params[p]));
    offset += static_cast<size_t>(sizes[p]);
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard
