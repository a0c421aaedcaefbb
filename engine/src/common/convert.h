// Runs of fp32, bf16 or fp16 elements to and from fp32, on the bulk
// conversions of zeroshard/dtype.h (the kernels' vectorised casts, which
// give the bits of the scalar rules): the quantized packs' widening and
// narrowing (qwZ's DeviceOps, qgZ's reduce-scatter).
#ifndef ZEROSHARD_ENGINE_SRC_COMMON_CONVERT_H_
#define ZEROSHARD_ENGINE_SRC_COMMON_CONVERT_H_

#include <cstdint>

#include "zeroshard/dtype.h"

namespace zeroshard::internal {

// Elements [begin, begin + n) of `x` (fp32, bf16 or fp16) widened to fp32.
void WidenToFp32(const void* x, int64_t begin, int64_t n, DType dtype, float* out);
// `in` rounded once to dtype (fp32: copied) into elements [begin, begin + n)
// of `out`.
void NarrowFromFp32(const float* in, int64_t begin, int64_t n, DType dtype, void* out);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_ENGINE_SRC_COMMON_CONVERT_H_
