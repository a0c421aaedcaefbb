// The bulk conversions of zeroshard/dtype.h, on the CPU kernels' vectorised
// casts (kernels/cpu/cast.h), which give the bits of the scalar rules.
#include <cstddef>
#include <cstdint>

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

}  // namespace zeroshard
