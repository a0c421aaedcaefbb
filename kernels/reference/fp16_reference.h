// Oracles for fp16 (IEEE binary16) rounding, written from the values (double
// arithmetic and nearbyint) rather than from bit patterns, so that they check
// the bit recipes (kernels/common/float16_rules.h, F16C) independently.
#ifndef ZEROSHARD_KERNELS_REFERENCE_FP16_REFERENCE_H_
#define ZEROSHARD_KERNELS_REFERENCE_FP16_REFERENCE_H_

#include <cstdint>

namespace zeroshard::kernels::reference {

// The fp16 nearest to x, ties to even; |x| >= 65520 gives inf with x's sign;
// zeros keep their sign. NaN follows the documented bit rule of the kernels
// (sign | 0x7e00 | the top 10 payload bits), the one part that is not a value.
uint16_t RoundToFp16Reference(float x);

// The value of an fp16: exact for finite values and infinities; a quiet NaN
// (without its payload) for NaN.
double Fp16ValueReference(uint16_t h);

}  // namespace zeroshard::kernels::reference

#endif  // ZEROSHARD_KERNELS_REFERENCE_FP16_REFERENCE_H_
