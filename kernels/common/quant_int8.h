// Blockwise int8 quantization: the qwZ weight all-gather of ZeRO++
// (TrainSpec::zeropp.quantized_weights, docs/multinode.md). A run of n
// elements is cut into blocks of kQuantBlock (the last one partial); each
// block gets one fp32 scale, its largest magnitude / 127, and each element
// the int8 nearest to x / scale (ties to even, clamped to [-127, 127]); a
// block of zeros has scale 0 and quantizes to 0. Dequantized, an element is
// q * scale, then rounded once to the param dtype; its error is at most
// scale / 2 before that rounding. A block holding inf or NaN dequantizes to
// zeros and NaN-free values: quantized weights are for finite params.
//
// The packed form of n elements (what ranks exchange): the n int8 values,
// padded to a multiple of 8 bytes, then the ceil(n / kQuantBlock) fp32
// scales, padded to a multiple of 8 bytes (QuantPackedBytes). The element
// functions are shared by the CPU and CUDA DeviceOps, so both give the same
// bits.
#ifndef ZEROSHARD_KERNELS_COMMON_QUANT_INT8_H_
#define ZEROSHARD_KERNELS_COMMON_QUANT_INT8_H_

#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace zeroshard::kernels {

inline constexpr int64_t kQuantBlock = 256;

ZS_HOST_DEVICE_INLINE constexpr int64_t QuantBlocks(int64_t n) {
  return (n + kQuantBlock - 1) / kQuantBlock;
}
// Where the scales start in a packed run of n elements.
ZS_HOST_DEVICE_INLINE constexpr int64_t QuantScalesOffset(int64_t n) { return (n + 7) / 8 * 8; }
ZS_HOST_DEVICE_INLINE constexpr int64_t QuantPackedBytes(int64_t n) {
  return QuantScalesOffset(n) + (QuantBlocks(n) * 4 + 7) / 8 * 8;
}

// The scale of a block whose largest magnitude is `absmax` (IEEE division:
// correctly rounded on the host and on the GPU).
ZS_HOST_DEVICE_INLINE float QuantScale(float absmax) { return absmax / 127.0f; }

ZS_HOST_DEVICE_INLINE int8_t QuantizeElement(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  // rintf rounds to nearest even in the default rounding mode (host and GPU).
  float q = rintf(x / scale);
  if (q != q) return 0;  // NaN (an infinite block's inf / inf): no int8 says it
  q = q > 127.0f ? 127.0f : q;
  q = q < -127.0f ? -127.0f : q;
  return static_cast<int8_t>(q);
}

ZS_HOST_DEVICE_INLINE float DequantizeElement(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_COMMON_QUANT_INT8_H_
