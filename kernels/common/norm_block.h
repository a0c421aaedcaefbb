// The sum of squares of one norm block, in the fixed order every
// implementation keeps (kernels/cpu/norm.h explains why the order is fixed):
// a block is up to kNormBlock elements; lane j of kNormLanes sums, in double
// and in index order, the squares of elements j, j + 8, j + 16, ...; the
// lanes combine as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). The
// square of an fp32, bf16 or fp16 value is exact in double, so only the
// additions round, and they round the same way everywhere.
//
// Used by the CPU scalar path (kernels/cpu/norm.cc), the CUDA kernel (one
// thread per block) and the tests; the CPU SIMD paths keep the same lanes in
// vector registers (kernels/cpu/internal/norm_body.h). Compile without FMA
// contraction (-ffp-contract=off, nvcc --fmad=false): lane += x * x must stay
// a multiply and an add.
#ifndef ZEROSHARD_KERNELS_COMMON_NORM_BLOCK_H_
#define ZEROSHARD_KERNELS_COMMON_NORM_BLOCK_H_

#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/common/host_device.h"

namespace zeroshard::kernels {

inline constexpr size_t kNormBlock = 128;
inline constexpr size_t kNormLanes = 8;

// The eight running lane sums of one block.
struct NormLanes {
  double lane[kNormLanes] = {};

  // Lane j adds the square of group[j]: one step of elements i..i+7 with i a
  // multiple of 8 within the block.
  ZS_HOST_DEVICE_INLINE void AddGroup(const float (&group)[kNormLanes]) {
    for (size_t j = 0; j < kNormLanes; ++j) {
      const double x = group[j];
      lane[j] += x * x;
    }
  }

  ZS_HOST_DEVICE_INLINE double Sum() const {
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
};

// Loaders: element i of a block, widened exactly to fp32.
struct Fp32Loader {
  const float* x;
  ZS_HOST_DEVICE_INLINE float operator()(size_t i) const { return x[i]; }
};
struct Bf16Loader {
  const uint16_t* x;
  ZS_HOST_DEVICE_INLINE float operator()(size_t i) const { return Bf16ToFp32(x[i]); }
};
struct Fp16Loader {
  const uint16_t* x;
  ZS_HOST_DEVICE_INLINE float operator()(size_t i) const { return Fp16ToFp32(x[i]); }
};

// The sum of squares of elements [0, len) of one block, len <= kNormBlock;
// `load(i)` gives element i as fp32.
template <class Loader>
ZS_HOST_DEVICE_INLINE double NormBlockSumSquares(const Loader& load, size_t len) {
  NormLanes lanes;
  size_t i = 0;
  for (; i + kNormLanes <= len; i += kNormLanes) {
    float group[kNormLanes];
    for (size_t j = 0; j < kNormLanes; ++j) group[j] = load(i + j);
    lanes.AddGroup(group);
  }
  // A partial tail continues the same lanes: element i + j belongs to lane j.
  // Constant lane indices (rather than lane[i % 8]) keep the lanes in
  // registers on the GPU.
  for (size_t j = 0; j < kNormLanes; ++j) {
    if (i + j < len) {
      const double x = load(i + j);
      lanes.lane[j] += x * x;
    }
  }
  return lanes.Sum();
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_COMMON_NORM_BLOCK_H_
