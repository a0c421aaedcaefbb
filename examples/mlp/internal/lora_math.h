// The residual block with LoRA adapters (--lora R), on raw fp32 arrays, apart
// from the engine so that it can be tested against a double reference.
//
// Each adapted weight W [out, in] (W1 and W2 of a block) is frozen and gets
// two trainable factors, A [R, in] and B [out, R], with
//   W_eff = W + s B A,   s = alpha / R,
// never formed: the product goes through the rank-R bottleneck, as PEFT
// computes it, x W_eff^T = x W^T + s (x A^T) B^T. The block is
//   pre = x W1_eff^T + b1,  act = gelu(pre),  y = x + act W2_eff^T + b2
// with the biases frozen too (PEFT's default, bias="none"). The backward
// writes the four adapter gradients and dL/dx; it computes no gradient of
// W1, W2, b1 or b2 (frozen: the engine has no buffer for them).
//
// Every result depends only on its inputs and sizes, as block_math.h.
#ifndef ZEROSHARD_EXAMPLES_MLP_INTERNAL_LORA_MATH_H_
#define ZEROSHARD_EXAMPLES_MLP_INTERNAL_LORA_MATH_H_

#include <cstdint>

#include "examples/mlp/internal/block_math.h"

namespace zeroshard {
namespace mlp {
namespace internal {

// One block's adapters (not owned), fp32.
struct LoraWeights {
  const float* a1 = nullptr;  // [R, h]
  const float* b1 = nullptr;  // [4h, R]
  const float* a2 = nullptr;  // [R, 4h]
  const float* b2 = nullptr;  // [h, R]
  int64_t rank = 0;           // R
  float scale = 1.0f;         // alpha / R
};

// Where the adapter gradients go (every element overwritten).
struct LoraGradients {
  float* a1 = nullptr;
  float* b1 = nullptr;
  float* a2 = nullptr;
  float* b2 = nullptr;
};

// The adapter gradients of a block stored concatenated [A1 B1 A2 B2] at
// `base` (the order of the adapters in the unit's ModelSpec).
LoraGradients LoraGradientsIn(float* base, int64_t hidden, int64_t rank);

// Floats of scratch LoraBlockForward / LoraBlockBackward need.
int64_t LoraScratchSize(int64_t batch, int64_t hidden, int64_t rank);

// One block forward: reads x, writes pre, act and y (y must not alias x).
void LoraBlockForward(const BlockWeights& w, const LoraWeights& lora, int64_t batch, int64_t hidden,
                      const float* x, float* pre, float* act, float* y, float* scratch);

// One block backward from the saved x, pre, act and dL/dy: the adapter
// gradients, and dL/dx (must not alias dy; null when not needed).
void LoraBlockBackward(const BlockWeights& w, const LoraWeights& lora, int64_t batch,
                       int64_t hidden, const float* x, const float* pre, const float* act,
                       const float* dy, float* scratch, float* dx, const LoraGradients& grads);

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_INTERNAL_LORA_MATH_H_
