// The fp32 constants of one Adam / AdamW step, shared by the CPU kernels
// (kernels/cpu/adam.h derives them: MakeAdamConstants), the CUDA kernels and
// the per-element rule (adam_element.h). Plain data, usable from host C++ and
// from CUDA device code (a kernel takes it by value).
#ifndef ZEROSHARD_KERNELS_COMMON_ADAM_CONSTANTS_H_
#define ZEROSHARD_KERNELS_COMMON_ADAM_CONSTANTS_H_

namespace zeroshard::kernels {

// kAdamW: decoupled weight decay (p *= 1 - lr * weight_decay before the
// step); kAdamL2: weight_decay * p added to the scaled gradient.
enum class AdamMode { kAdamW, kAdamL2 };

// The fp32 constants the kernels use, derived once per step on the host (in
// double, then rounded to fp32).
struct AdamConstants {
  AdamMode mode;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float step_size;                  // lr / (1 - beta1^step)
  float inv_sqrt_bias_correction2;  // 1 / sqrt(1 - beta2^step)
  float decay_factor;               // AdamW: 1 - lr * weight_decay; L2: 1
  float l2;                         // L2: weight_decay; AdamW: 0
  float grad_scale;
};

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_COMMON_ADAM_CONSTANTS_H_
