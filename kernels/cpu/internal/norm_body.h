// The block sum of squares shared by every ISA path (see norm.h for the
// order). A path supplies traits NV (TU-local, as in adam_body.h) with:
//   using Acc;  Acc Zero();
//   Acc Accumulate(Acc, const float*), AccumulateBf16(Acc, const uint16_t*),
//   AccumulateFp16(Acc, const uint16_t*):
//       lane j += double(x[j])^2 for j = 0..7 (the square of an fp32, bf16 or
//       fp16 value is exact in double; only the additions round)
//   void Store(Acc, double lanes[8]);
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_NORM_BODY_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_NORM_BODY_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/internal/format.h"
#include "kernels/cpu/norm.h"

namespace zeroshard::kernels::internal {

template <Format kFormat>
ZS_KERNEL_INLINE double ElementToDouble(Storage<kFormat> x) {
  return static_cast<double>(ToFp32<kFormat>(x));
}

template <class NV, Format kFormat>
ZS_KERNEL_INLINE typename NV::Acc AccumulateAs(typename NV::Acc acc, const Storage<kFormat>* x) {
  if constexpr (kFormat == Format::kFp32) {
    return NV::Accumulate(acc, x);
  } else if constexpr (kFormat == Format::kBf16) {
    return NV::AccumulateBf16(acc, x);
  } else {
    return NV::AccumulateFp16(acc, x);
  }
}

template <class NV, Format kFormat>
ZS_KERNEL_INLINE void BlockSumSquaresWith(const Storage<kFormat>* x, size_t n, double* out) {
  using T = Storage<kFormat>;
  for (size_t start = 0; start < n; start += kNormBlock) {
    const size_t len = std::min(kNormBlock, n - start);
    const T* block = x + start;
    typename NV::Acc acc = NV::Zero();
    size_t i = 0;
    for (; i + kNormLanes <= len; i += kNormLanes) acc = AccumulateAs<NV, kFormat>(acc, block + i);
    double lane[kNormLanes];
    NV::Store(acc, lane);
    // The partial tail of the last block continues the same lanes: element i
    // belongs to lane i % 8 whatever the path.
    for (; i < len; ++i) {
      const double xi = ElementToDouble<kFormat>(block[i]);
      lane[i % kNormLanes] += xi * xi;
    }
    out[start / kNormBlock] =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
}

}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_NORM_BODY_H_
