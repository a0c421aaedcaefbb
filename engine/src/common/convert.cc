// The bulk conversions of zeroshard/dtype.h, on the CPU kernels' vectorised
// casts (kernels/cpu/cast.h), which give the bits of the scalar rules.
#include "engine/src/common/convert.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/cast.h"
#include "zeroshard/dtype.h"

namespace zeroshard {

void ConvertFp32ToBf16(const float* in, uint16_t* out, size_t n) {
  kernels::CastFp32ToBf16(in, out, n);
}

void ConvertBf16ToFp32(const uint16_t* in, float* out, size_t n) {
  kernels::CastBf16ToFp32(in, out, n);
}

void ConvertFp32ToFp16(const float* in, uint16_t* out, size_t n) {
  kernels::CastFp32ToFp16(in, out, n);
}

void ConvertFp16ToFp32(const uint16_t* in, float* out, size_t n) {
  kernels::CastFp16ToFp32(in, out, n);
}

namespace internal {

void WidenToFp32(const void* x, int64_t begin, int64_t n, DType dtype, float* out) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(out, static_cast<const float*>(x) + begin, n * sizeof(float));
      break;
    case DType::kBFloat16:
      ConvertBf16ToFp32(static_cast<const uint16_t*>(x) + begin, out, static_cast<size_t>(n));
      break;
    default:
      ConvertFp16ToFp32(static_cast<const uint16_t*>(x) + begin, out, static_cast<size_t>(n));
      break;
  }
}

void NarrowFromFp32(const float* in, int64_t begin, int64_t n, DType dtype, void* out) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(static_cast<float*>(out) + begin, in, n * sizeof(float));
      break;
    case DType::kBFloat16:
      ConvertFp32ToBf16(in, static_cast<uint16_t*>(out) + begin, static_cast<size_t>(n));
      break;
    default:
      ConvertFp32ToFp16(in, static_cast<uint16_t*>(out) + begin, static_cast<size_t>(n));
      break;
  }
}

}  // namespace internal
}  // namespace zeroshard
