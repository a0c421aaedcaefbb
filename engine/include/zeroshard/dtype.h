// Element types the engine stores, reduces and exchanges.
#ifndef ZEROSHARD_DTYPE_H_
#define ZEROSHARD_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard {

// kFloat32/kBFloat16/kFloat16 hold model states; kFloat64/kInt64/kUInt8 are
// for engine bookkeeping that travels through the communicator (exact norm
// accumulators, fingerprints).
enum class DType : uint8_t { kFloat32, kBFloat16, kFloat16, kFloat64, kInt64, kUInt8 };

// Bytes per element.
size_t DTypeSize(DType dtype);
// "fp32", "bf16", "fp16", "fp64", "int64", "uint8".
const char* DTypeName(DType dtype);
// Inverse of DTypeName; also accepts "float32", "bfloat16", "float16".
absl::StatusOr<DType> ParseDType(absl::string_view name);

// bf16 <-> fp32. Rounding is to nearest, ties to even; NaN stays NaN (quiet).
inline uint16_t Fp32ToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float Bf16ToFp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// fp16 (IEEE binary16) <-> fp32. Rounding is to nearest, ties to even
// (overflow to infinity, gradual underflow); NaN stays NaN (quiet).
uint16_t Fp32ToFp16(float x);
float Fp16ToFp32(uint16_t h);

// Bulk conversions of n elements, vectorised (AVX-512 / AVX2 / scalar, chosen
// once per process); the same bits as the scalar functions above.
void ConvertFp32ToBf16(const float* in, uint16_t* out, size_t n);
void ConvertBf16ToFp32(const uint16_t* in, float* out, size_t n);
void ConvertFp32ToFp16(const float* in, uint16_t* out, size_t n);
void ConvertFp16ToFp32(const uint16_t* in, float* out, size_t n);

}  // namespace zeroshard

#endif  // ZEROSHARD_DTYPE_H_
