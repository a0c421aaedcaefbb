// Double-precision oracle for the Adam / AdamW kernels (kernels/cpu/adam.h).
//
// The same formulas as the kernels' contract, evaluated in double from the
// double hyper-parameters (not from the fp32 AdamConstants), so a test sees
// the fp32 kernel's rounding of both the constants and every operation.
#ifndef ZEROSHARD_KERNELS_REFERENCE_ADAM_REFERENCE_H_
#define ZEROSHARD_KERNELS_REFERENCE_ADAM_REFERENCE_H_

#include <cstddef>

#include "kernels/cpu/adam.h"

namespace zeroshard::kernels::reference {

// One optimizer step on n elements, in double, in place on param, m and v.
// `grad` is read only. Slow and simple on purpose.
void AdamStepReference(const AdamStepParams& params, double* param, const double* grad, double* m,
                       double* v, size_t n);

}  // namespace zeroshard::kernels::reference

#endif  // ZEROSHARD_KERNELS_REFERENCE_ADAM_REFERENCE_H_
