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

// qgZ's gradient packs (TrainSpec::zeropp.quantized_grad_bits): the same
// blocks and fp32 scales with `bits` 8 (the int8 values above) or 4: values
// in [-7, 7] with scale largest magnitude / 7, two per byte (element 2i in
// the low nibble, 2i + 1 in the high one, two's complement), the values'
// bytes padded to a multiple of 8 before the scales. For bits 8 these are
// the functions above.
ZS_HOST_DEVICE_INLINE constexpr int QuantMax(int bits) { return bits == 4 ? 7 : 127; }
ZS_HOST_DEVICE_INLINE constexpr int64_t QuantValueBytes(int64_t n, int bits) {
  return bits == 4 ? (n + 1) / 2 : n;
}
ZS_HOST_DEVICE_INLINE constexpr int64_t QuantScalesOffset(int64_t n, int bits) {
  return (QuantValueBytes(n, bits) + 7) / 8 * 8;
}
ZS_HOST_DEVICE_INLINE constexpr int64_t QuantPackedBytes(int64_t n, int bits) {
  return QuantScalesOffset(n, bits) + (QuantBlocks(n) * 4 + 7) / 8 * 8;
}
ZS_HOST_DEVICE_INLINE float QuantScale(float absmax, int bits) {
  return absmax / static_cast<float>(QuantMax(bits));
}
// The value nearest to x / scale (ties to even), clamped to the bits' range.
ZS_HOST_DEVICE_INLINE int QuantizeElement(float x, float scale, int bits) {
  if (!(scale > 0.0f)) return 0;
  float q = rintf(x / scale);
  if (q != q) return 0;
  const float max = static_cast<float>(QuantMax(bits));
  q = q > max ? max : q;
  q = q < -max ? -max : q;
  return static_cast<int>(q);
}
// Value i of a pack's value bytes.
ZS_HOST_DEVICE_INLINE int QuantValueAt(const uint8_t* values, int64_t i, int bits) {
  if (bits == 8) return static_cast<int8_t>(values[i]);
  const int nibble = (i & 1) ? values[i >> 1] >> 4 : values[i >> 1] & 0xF;
  return nibble >= 8 ? nibble - 16 : nibble;
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_COMMON_QUANT_INT8_H_
