// The one rule of gradient accumulation, acc += add, per element type: fp32
// adds in fp32; bf16 and fp16 widen both operands exactly to fp32, add once
// in fp32 and round the sum once to nearest even (float16_rules.h). Shared by
// the CPU DeviceOps, the CUDA kernel (kernels/cuda/device_ops.cu) and the
// tests. Compile without FMA contraction (there is none to form here, but the
// rule is that of every file that includes it).
#ifndef ZEROSHARD_KERNELS_COMMON_ACCUMULATE_ELEMENT_H_
#define ZEROSHARD_KERNELS_COMMON_ACCUMULATE_ELEMENT_H_

#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/common/host_device.h"

namespace zeroshard::kernels {

ZS_HOST_DEVICE_INLINE float AccumulateFp32(float acc, float add) { return acc + add; }

// 16-bit operands and result are raw bits.
ZS_HOST_DEVICE_INLINE uint16_t AccumulateBf16(uint16_t acc, uint16_t add) {
  return Fp32ToBf16Rne(Bf16ToFp32(acc) + Bf16ToFp32(add));
}

ZS_HOST_DEVICE_INLINE uint16_t AccumulateFp16(uint16_t acc, uint16_t add) {
  return Fp32ToFp16Rne(Fp16ToFp32(acc) + Fp16ToFp32(add));
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_COMMON_ACCUMULATE_ELEMENT_H_
