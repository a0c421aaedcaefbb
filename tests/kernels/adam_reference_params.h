// The kernels' Adam hyper-parameters (kernels/cpu/adam.h) in the reference's
// own struct (kernels/reference/adam_reference.h): the oracle includes
// nothing from the kernels it judges, so the tests translate.
#ifndef ZEROSHARD_TESTS_KERNELS_ADAM_REFERENCE_PARAMS_H_
#define ZEROSHARD_TESTS_KERNELS_ADAM_REFERENCE_PARAMS_H_

#include "kernels/cpu/adam.h"
#include "kernels/reference/adam_reference.h"

namespace zeroshard::kernels::testing {

inline reference::AdamReferenceParams ToReferenceParams(const AdamStepParams& params) {
  reference::AdamReferenceParams r;
  r.decoupled_weight_decay = params.mode == AdamMode::kAdamW;
  r.lr = params.lr;
  r.beta1 = params.beta1;
  r.beta2 = params.beta2;
  r.eps = params.eps;
  r.weight_decay = params.weight_decay;
  r.grad_scale = params.grad_scale;
  r.step = params.step;
  return r;
}

}  // namespace zeroshard::kernels::testing

#endif  // ZEROSHARD_TESTS_KERNELS_ADAM_REFERENCE_PARAMS_H_
