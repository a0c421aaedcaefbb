// Element types the engine stores, reduces and exchanges.
#ifndef ZEROSHARD_DTYPE_H_
#define ZEROSHARD_DTYPE_H_

#include <cstddef>
#include <cstdint>
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

// One element, scalar. These are the project's one rule for each 16-bit
// type: the kernels (CPU and CUDA) convert with the same rule, so a value
// converted here has the bits the kernels would give it.
//
// bf16 <-> fp32. fp32 -> bf16 rounds to nearest, ties to even (overflow to
// infinity); NaN stays NaN and becomes quiet. bf16 -> fp32 is exact.
uint16_t Fp32ToBf16(float x);
float Bf16ToFp32(uint16_t h);

// fp16 (IEEE binary16) <-> fp32. fp32 -> fp16 rounds to nearest, ties to even
// (|x| >= 65520 overflows to infinity, gradual underflow into subnormals);
// NaN stays NaN (sign and top payload bits kept) and becomes quiet.
// fp16 -> fp32 is exact (NaN payloads unchanged).
uint16_t Fp32ToFp16(float x);
float Fp16ToFp32(uint16_t h);

// Bulk conversions of n elements, vectorised (AVX-512 / AVX2 / scalar, chosen
// once per process); the same bits as the scalar functions above. `in` and
// `out` hold n elements each and must not overlap. Defined in the engine's
// zs_convert library (linked by the zeroshard target), not in zs_common, so
// that code needing only the types and scalar rules links no SIMD kernels.
void ConvertFp32ToBf16(const float* in, uint16_t* out, size_t n);
void ConvertBf16ToFp32(const uint16_t* in, float* out, size_t n);
void ConvertFp32ToFp16(const float* in, uint16_t* out, size_t n);
void ConvertFp16ToFp32(const uint16_t* in, float* out, size_t n);

}  // namespace zeroshard

#endif  // ZEROSHARD_DTYPE_H_
