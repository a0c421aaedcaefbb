// Oracles for the norm kernels (kernels/cpu/norm.h), in higher precision than
// the kernels: long double sums (64-bit significand on x86) in plain index
// order, so they check the value, not the kernels' fixed order. They include
// nothing from the kernels: the block size is a parameter.
#ifndef ZEROSHARD_KERNELS_REFERENCE_NORM_REFERENCE_H_
#define ZEROSHARD_KERNELS_REFERENCE_NORM_REFERENCE_H_

#include <cstddef>

namespace zeroshard::kernels::reference {

// out[b] = sum of x[i]^2 over block b of `block` elements (the last one
// partial), summed in long double and rounded to double: ceil(n / block)
// values. `block` must be positive.
void BlockSumSquaresReference(const double* x, size_t n, size_t block, double* out);

// The sum of x[0..n) with compensated (Kahan-Babuska) long double summation
// over the values sorted by magnitude; relative error far below 2^-53 for the
// non-negative inputs ExactSum takes.
long double CompensatedSum(const double* x, size_t n);

}  // namespace zeroshard::kernels::reference

#endif  // ZEROSHARD_KERNELS_REFERENCE_NORM_REFERENCE_H_
