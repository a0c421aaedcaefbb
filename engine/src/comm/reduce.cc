#include "engine/src/comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace zeroshard {
namespace internal {

uint16_t Fp32ToFp16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet.
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  // 65520 is the midpoint between 65504 (largest half) and 65536; its tie
  // goes to the even neighbour 65536, i.e. infinity.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs >= 0x38800000u) {  // Normal half (|x| >= 2^-14).
    const uint32_t exponent = (abs >> 23) - 127 + 15;
    const uint32_t mantissa = abs & 0x7fffffu;
    uint32_t half = (exponent << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    // A carry out of the mantissa correctly bumps the exponent.
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Subnormal half: units of 2^-24. |x| <= 2^-25 rounds to zero (the tie at
  // exactly 2^-25 goes to the even value 0).
  if (abs <= 0x33000000u) return sign;
  const uint32_t exponent = abs >> 23;
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // In [14, 24].
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in fp32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    std::memcpy(&bits, &magnitude, sizeof(bits));
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  }
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

bool IsSummable(DType dtype) { return dtype != DType::kUInt8; }

namespace {

// Elements per block: the accumulator lives on the stack and each block is
// fully read before any output is written (this is what makes in place safe).
constexpr int64_t kBlock = 1024;

struct Fp32Codec {
  using Storage = float;
  using Acc = float;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return v; }
};
struct Bf16Codec {
  using Storage = uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return Bf16ToFp32(v); }
  static Storage Store(Acc v) { return Fp32ToBf16(v); }
};
struct Fp16Codec {
  using Storage = uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return Fp16ToFp32(v); }
  static Storage Store(Acc v) { return Fp32ToFp16(v); }
};
struct Fp64Codec {
  using Storage = double;
  using Acc = double;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return v; }
};
struct Int64Codec {
  using Storage = int64_t;
  using Acc = int64_t;
  static Acc Load(Storage v) { return v; }
  // Wrap-around on overflow, as two's complement (no UB on signed overflow).
  static Storage Store(Acc v) { return v; }
};

template <typename Codec>
void SumTyped(const void* const* inputs, int num_inputs, void* const* outputs, int num_outputs,
              int64_t count) {
  using Storage = typename Codec::Storage;
  using Acc = typename Codec::Acc;
  Acc acc[kBlock];
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    // Start from x_0 (not from zero) so a lone -0.0 stays -0.0.
    const Storage* first = static_cast<const Storage*>(inputs[0]) + begin;
    for (int64_t i = 0; i < n; ++i) acc[i] = Codec::Load(first[i]);
    for (int k = 1; k < num_inputs; ++k) {
      const Storage* in = static_cast<const Storage*>(inputs[k]) + begin;
      if constexpr (std::is_same_v<Acc, int64_t>) {
        for (int64_t i = 0; i < n; ++i) {
          acc[i] =
              static_cast<int64_t>(static_cast<uint64_t>(acc[i]) + static_cast<uint64_t>(in[i]));
        }
      } else {
        for (int64_t i = 0; i < n; ++i) acc[i] += Codec::Load(in[i]);
      }
    }
    for (int o = 0; o < num_outputs; ++o) {
      Storage* out = static_cast<Storage*>(outputs[o]) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = Codec::Store(acc[i]);
    }
  }
}

}  // namespace

void SumInRankOrder(const void* const* inputs, int num_inputs, void* const* outputs,
                    int num_outputs, int64_t count, DType dtype) {
  if (count <= 0 || num_inputs <= 0) return;
  switch (dtype) {
    case DType::kFloat32:
      return SumTyped<Fp32Codec>(inputs, num_inputs, outputs, num_outputs, count);
    case DType::kBFloat16:
      return SumTyped<Bf16Codec>(inputs, num_inputs, outputs, num_outputs, count);
    case DType::kFloat16:
      return SumTyped<Fp16Codec>(inputs, num_inputs, outputs, num_outputs, count);
    case DType::kFloat64:
      return SumTyped<Fp64Codec>(inputs, num_inputs, outputs, num_outputs, count);
    case DType::kInt64:
      return SumTyped<Int64Codec>(inputs, num_inputs, outputs, num_outputs, count);
    case DType::kUInt8:
      return;  // Rejected by argument checks before any backend runs.
  }
}

}  // namespace internal
}  // namespace zeroshard
