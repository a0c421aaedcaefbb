// bf16 / fp16 <-> fp32 casts: the scalar path and the dispatching entry points.
#include "kernels/cpu/cast.h"

#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/cpu/internal/check.h"
#include "kernels/cpu/internal/paths.h"

namespace zeroshard::kernels {
namespace internal {

void CastFp32ToBf16Scalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp32ToBf16Rne(in[i]);
}

void CastBf16ToFp32Scalar(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFp32(in[i]);
}

void CastFp32ToFp16Scalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp32ToFp16Rne(in[i]);
}

void CastFp16ToFp32Scalar(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp16ToFp32(in[i]);
}

}  // namespace internal

void CastFp32ToBf16On(Isa isa, const float* in, uint16_t* out, size_t n) {
  ZS_DISPATCH_KERNEL(isa, CastFp32ToBf16, in, out, n);
}

void CastBf16ToFp32On(Isa isa, const uint16_t* in, float* out, size_t n) {
  ZS_DISPATCH_KERNEL(isa, CastBf16ToFp32, in, out, n);
}

void CastFp32ToFp16On(Isa isa, const float* in, uint16_t* out, size_t n) {
  ZS_DISPATCH_KERNEL(isa, CastFp32ToFp16, in, out, n);
}

void CastFp16ToFp32On(Isa isa, const uint16_t* in, float* out, size_t n) {
  ZS_DISPATCH_KERNEL(isa, CastFp16ToFp32, in, out, n);
}

void CastFp32ToBf16(const float* in, uint16_t* out, size_t n) {
  CastFp32ToBf16On(ActiveIsa(), in, out, n);
}

void CastBf16ToFp32(const uint16_t* in, float* out, size_t n) {
  CastBf16ToFp32On(ActiveIsa(), in, out, n);
}

void CastFp32ToFp16(const float* in, uint16_t* out, size_t n) {
  CastFp32ToFp16On(ActiveIsa(), in, out, n);
}

void CastFp16ToFp32(const uint16_t* in, float* out, size_t n) {
  CastFp16ToFp32On(ActiveIsa(), in, out, n);
}

}  // namespace zeroshard::kernels
