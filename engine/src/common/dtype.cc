#include "zeroshard/dtype.h"

#include "absl/strings/str_format.h"
#include "kernels/common/float16_rules.h"

namespace zeroshard {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kFloat64:
      return "fp64";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  if (name == "fp64" || name == "float64") return DType::kFloat64;
  if (name == "int64") return DType::kInt64;
  if (name == "uint8") return DType::kUInt8;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown dtype '%s'; expected fp32, bf16, fp16, fp64, int64 or uint8", name));
}

// One rule for the whole project (kernels/common/float16_rules.h): the one the
// kernels' scalar and CUDA code use and their SIMD paths are tested against
// bit for bit. Out of line so that the public header includes no path that is
// not installed.
uint16_t Fp32ToBf16(float x) { return kernels::Fp32ToBf16Rne(x); }

float Bf16ToFp32(uint16_t h) { return kernels::Bf16ToFp32(h); }

uint16_t Fp32ToFp16(float x) { return kernels::Fp32ToFp16Rne(x); }

float Fp16ToFp32(uint16_t h) { return kernels::Fp16ToFp32(h); }

}  // namespace zeroshard
