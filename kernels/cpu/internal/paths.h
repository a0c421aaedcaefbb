// The per-ISA implementations behind the dispatching entry points. Each
// *_avx2.cc / *_avx512.cc file is compiled with its own ISA flags and must
// only be called when the CPU has that ISA (see isa.cc).
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_PATHS_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_PATHS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam.h"

namespace zeroshard::kernels::internal {

#define ZS_DECLARE_KERNEL_PATH(suffix)                                                         \
  void AdamFp32##suffix(float* param, const float* grad, float* m, float* v, size_t n,         \
                        const AdamConstants& c);                                               \
  void AdamMixedBf16##suffix(float* master, uint16_t* param_out, const float* grad, float* m,  \
                             float* v, size_t n, const AdamConstants& c);                      \
  void AdamMixedBf16GradBf16##suffix(float* master, uint16_t* param_out, const uint16_t* grad, \
                                     float* m, float* v, size_t n, const AdamConstants& c);    \
  void AdamMixedFp16##suffix(float* master, uint16_t* param_out, const float* grad, float* m,  \
                             float* v, size_t n, const AdamConstants& c);                      \
  void AdamMixedFp16GradFp16##suffix(float* master, uint16_t* param_out, const uint16_t* grad, \
                                     float* m, float* v, size_t n, const AdamConstants& c);    \
  void CastFp32ToBf16##suffix(const float* in, uint16_t* out, size_t n);                       \
  void CastBf16ToFp32##suffix(const uint16_t* in, float* out, size_t n);                       \
  void CastFp32ToFp16##suffix(const float* in, uint16_t* out, size_t n);                       \
  void CastFp16ToFp32##suffix(const uint16_t* in, float* out, size_t n);                       \
  void BlockSumSquaresFp32##suffix(const float* x, size_t n, double* out);                     \
  void BlockSumSquaresBf16##suffix(const uint16_t* x, size_t n, double* out);                  \
  void BlockSumSquaresFp16##suffix(const uint16_t* x, size_t n, double* out);

ZS_DECLARE_KERNEL_PATH(Scalar)
ZS_DECLARE_KERNEL_PATH(Avx2)
ZS_DECLARE_KERNEL_PATH(Avx512)

#undef ZS_DECLARE_KERNEL_PATH

// The body of a dispatching `<fn>On(isa, ...)` entry point: checks that the
// CPU runs `isa`, then calls internal::<fn>Avx512 / <fn>Avx2 / <fn>Scalar.
#if defined(ZS_KERNELS_X86_PATHS)
#define ZS_DISPATCH_KERNEL(isa, fn, ...)                                                 \
  ::zeroshard::kernels::internal::CheckIsaSupported(isa, #fn "On");                      \
  if ((isa) == Isa::kAvx512) {                                                           \
    return ::zeroshard::kernels::internal::fn##Avx512(__VA_ARGS__);                      \
  }                                                                                      \
  if ((isa) == Isa::kAvx2) return ::zeroshard::kernels::internal::fn##Avx2(__VA_ARGS__); \
  return ::zeroshard::kernels::internal::fn##Scalar(__VA_ARGS__)
#else
#define ZS_DISPATCH_KERNEL(isa, fn, ...)                            \
  ::zeroshard::kernels::internal::CheckIsaSupported(isa, #fn "On"); \
  return ::zeroshard::kernels::internal::fn##Scalar(__VA_ARGS__)
#endif

}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_PATHS_H_
