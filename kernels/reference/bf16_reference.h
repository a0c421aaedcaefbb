// Oracles for bf16 rounding and widening, written independently of the rule
// they check (kernels/common/float16_rules.h adds a rounding bias and
// truncates; the oracle truncates first and then compares the dropped half
// with one half), so that the scalar rule, the SIMD casts and the CUDA
// kernels are judged by a second recipe.
#ifndef ZEROSHARD_KERNELS_REFERENCE_BF16_REFERENCE_H_
#define ZEROSHARD_KERNELS_REFERENCE_BF16_REFERENCE_H_

#include <cstdint>

namespace zeroshard::kernels::reference {

// The bf16 nearest to x, ties to even (values past the largest bf16 round to
// inf with x's sign); zeros keep their sign. NaN keeps its sign and top
// payload bits and gains the quiet bit (0x0040), the documented bit rule.
uint16_t RoundToBf16Reference(float x);

// The value of a bf16: exact for finite values and infinities; a quiet NaN
// (without its payload) for NaN.
double Bf16ValueReference(uint16_t h);

}  // namespace zeroshard::kernels::reference

#endif  // ZEROSHARD_KERNELS_REFERENCE_BF16_REFERENCE_H_
