#include "kernels/reference/adam_reference.h"

#include <cmath>
#include <cstddef>

namespace zeroshard::kernels::reference {

void AdamStepReference(const AdamReferenceParams& params, double* param, const double* grad,
                       double* m, double* v, size_t n) {
  const double step = static_cast<double>(params.step);
  const double bias_correction1 = 1.0 - std::pow(params.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(params.beta2, step);
  const bool adamw = params.decoupled_weight_decay;
  for (size_t i = 0; i < n; ++i) {
    double g = grad[i] * params.grad_scale;
    if (!adamw) g += params.weight_decay * param[i];
    m[i] = params.beta1 * m[i] + (1.0 - params.beta1) * g;
    v[i] = params.beta2 * v[i] + (1.0 - params.beta2) * g * g;
    const double denom = std::sqrt(v[i]) / std::sqrt(bias_correction2) + params.eps;
    if (adamw) param[i] *= 1.0 - params.lr * params.weight_decay;
    param[i] -= params.lr / bias_correction1 * (m[i] / denom);
  }
}

}  // namespace zeroshard::kernels::reference
