// Double-precision oracle for the Adam / AdamW kernels (kernels/cpu/adam.h,
// kernels/cuda/adam.cuh).
//
// The same formulas as the kernels' contract, evaluated in double from the
// double hyper-parameters (not from the kernels' fp32 constants), so a test
// sees the fp32 kernel's rounding of both the constants and every operation.
// It includes nothing from the kernels it judges: the hyper-parameters come
// in this file's own struct, which the tests fill from the kernels' one.
#ifndef ZEROSHARD_KERNELS_REFERENCE_ADAM_REFERENCE_H_
#define ZEROSHARD_KERNELS_REFERENCE_ADAM_REFERENCE_H_

#include <cstddef>
#include <cstdint>

namespace zeroshard::kernels::reference {

// Hyper-parameters of one optimizer step.
struct AdamReferenceParams {
  // true: AdamW (p *= 1 - lr * weight_decay before the step); false: Adam
  // with L2 (weight_decay * p added to the scaled gradient).
  bool decoupled_weight_decay = true;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_scale = 1.0;
  int64_t step = 1;  // 1-based, for bias correction
};

// One optimizer step on n elements, in double, in place on param, m and v.
// `grad` is read only. Slow and simple on purpose.
void AdamStepReference(const AdamReferenceParams& params, double* param, const double* grad,
                       double* m, double* v, size_t n);

}  // namespace zeroshard::kernels::reference

#endif  // ZEROSHARD_KERNELS_REFERENCE_ADAM_REFERENCE_H_
