// The element formats the kernels read and write, for the shared loop bodies
// (adam_body.h, norm_body.h): fp32 is stored as float, bf16 and fp16 as their
// raw uint16_t bits, so the storage type alone does not name the format.
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_FORMAT_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_FORMAT_H_

#include <cstdint>
#include <type_traits>

#include "kernels/common/float16_rules.h"
#include "kernels/cpu/internal/kernel_inline.h"

namespace zeroshard::kernels::internal {

enum class Format { kFp32, kBf16, kFp16 };

template <Format kFormat>
using Storage = std::conditional_t<kFormat == Format::kFp32, float, uint16_t>;

// Exact widening of one stored element to fp32.
template <Format kFormat>
ZS_KERNEL_INLINE float ToFp32(Storage<kFormat> x) {
  if constexpr (kFormat == Format::kFp32) {
    return x;
  } else if constexpr (kFormat == Format::kBf16) {
    return Bf16ToFp32(x);
  } else {
    return Fp16ToFp32(x);
  }
}

}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_FORMAT_H_
