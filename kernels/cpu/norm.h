// Sum of squares for the global gradient norm, reproducible across shardings.
//
// The norm must have the same bits whatever the stage or world size. Two
// pieces make that so:
//  1. BlockSumSquares sums squares over fixed blocks of kNormBlock elements,
//     in double, in a fixed order (lane j of 8 sums elements j, j+8, ...; the
//     lanes combine as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))). Block boundaries
//     are multiples of kNormBlock from the start of a unit's segment, and
//     shards are multiples of kNormBlock, so a block never straddles ranks.
//  2. ExactSum adds the block sums exactly (a fixed-point accumulator over
//     int64 limbs), so the order in which blocks, shards and ranks are added
//     does not matter: the limbs of several ranks are summed as integers.
#ifndef ZEROSHARD_KERNELS_CPU_NORM_H_
#define ZEROSHARD_KERNELS_CPU_NORM_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "kernels/common/norm_block.h"
#include "kernels/cpu/isa.h"

namespace zeroshard::kernels {

// kNormBlock, kNormLanes and the order within one block:
// kernels/common/norm_block.h.

// out[b] = sum of x[i]^2 (in double) over block b of x; ceil(n / kNormBlock)
// blocks, the last one partial. Identical bits on every ISA path.
void BlockSumSquaresFp32(const float* x, size_t n, double* out);
void BlockSumSquaresBf16(const uint16_t* x, size_t n, double* out);
void BlockSumSquaresFp16(const uint16_t* x, size_t n, double* out);
void BlockSumSquaresFp16On(Isa isa, const uint16_t* x, size_t n, double* out);
void BlockSumSquaresFp32On(Isa isa, const float* x, size_t n, double* out);
void BlockSumSquaresBf16On(Isa isa, const uint16_t* x, size_t n, double* out);

// Exact sum of non-negative doubles that are whole multiples of 2^-298 and
// below 2^280 (every sum of squares of fp32 values is). Non-finite inputs are
// counted, not added. Limbs are plain int64 so that the accumulators of
// several ranks combine by an integer all-reduce (Merge / summing limbs()).
class ExactSum {
 public:
  static constexpr int kValueLimbs = 19;          // 32 bits each, from 2^-298
  static constexpr int kLimbs = kValueLimbs + 1;  // + count of non-finite inputs

  void Add(double x);
  void AddBlocks(const double* x, size_t n);
  void Merge(const ExactSum& other);
  // Deterministic rounding of the exact sum to double (same limbs, same
  // bits); +inf if any input was non-finite or out of range.
  double Value() const;
  int64_t non_finite() const { return limbs_[kValueLimbs]; }

  // Propagates carries so that every value limb is in [0, 2^32). Call before
  // summing the limbs of several ranks (so the integer sum cannot overflow);
  // Value() accepts limbs in any state.
  void Normalize();

  int64_t* limbs() { return limbs_.data(); }
  const int64_t* limbs() const { return limbs_.data(); }

 private:
  std::array<int64_t, kLimbs> limbs_{};
  int64_t adds_since_normalize_ = 0;
};

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_NORM_H_
