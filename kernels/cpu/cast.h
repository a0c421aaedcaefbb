// bf16 and fp16 <-> fp32 casts on flat buffers (round to nearest even; NaN stays NaN).
#ifndef ZEROSHARD_KERNELS_CPU_CAST_H_
#define ZEROSHARD_KERNELS_CPU_CAST_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.h"

namespace zeroshard::kernels {

void CastFp32ToBf16(const float* in, uint16_t* out, size_t n);
void CastBf16ToFp32(const uint16_t* in, float* out, size_t n);
// fp16 (IEEE binary16): round to nearest even, overflow to inf, subnormals kept.
void CastFp32ToFp16(const float* in, uint16_t* out, size_t n);
void CastFp16ToFp32(const uint16_t* in, float* out, size_t n);
void CastFp32ToFp16On(Isa isa, const float* in, uint16_t* out, size_t n);
void CastFp16ToFp32On(Isa isa, const uint16_t* in, float* out, size_t n);
void CastFp32ToBf16On(Isa isa, const float* in, uint16_t* out, size_t n);
void CastBf16ToFp32On(Isa isa, const uint16_t* in, float* out, size_t n);

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_CAST_H_
