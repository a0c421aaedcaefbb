// The block sum of squares shared by every ISA path (see norm.h for the
// order). A path supplies traits NV (TU-local, as in adam_body.h) with:
//   using Acc;  Acc Zero();
//   Acc Accumulate(Acc, const float*) / Accumulate(Acc, const uint16_t*):
//       lane j += double(x[j])^2 for j = 0..7 (the square of an fp32 or bf16
//       value is exact in double; only the additions round)
//   void Store(Acc, double lanes[8]);
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_NORM_BODY_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_NORM_BODY_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/internal/bf16.h"
#include "kernels/cpu/norm.h"

namespace zeroshard::kernels::internal {

inline constexpr size_t kNormLanes = 8;

ZS_KERNEL_INLINE double ElementToDouble(float x) { return static_cast<double>(x); }
ZS_KERNEL_INLINE double ElementToDouble(uint16_t x) { return static_cast<double>(Bf16ToFp32(x)); }

template <class NV, class T>
ZS_KERNEL_INLINE void BlockSumSquaresWith(const T* x, size_t n, double* out) {
  for (size_t start = 0; start < n; start += kNormBlock) {
    const size_t len = std::min(kNormBlock, n - start);
    const T* block = x + start;
    typename NV::Acc acc = NV::Zero();
    size_t i = 0;
    for (; i + kNormLanes <= len; i += kNormLanes) acc = NV::Accumulate(acc, block + i);
    double lane[kNormLanes];
    NV::Store(acc, lane);
    // The partial tail of the last block continues the same lanes: element i
    // belongs to lane i % 8 whatever the path.
    for (; i < len; ++i) {
      const double xi = ElementToDouble(block[i]);
      lane[i % kNormLanes] += xi * xi;
    }
    out[start / kNormBlock] =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
}

}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_NORM_BODY_H_
