// The communicator's sum of one element over ranks, as one rule that host C++
// and CUDA device code share.
//
// Element i of a reduction is ((x_0[i] + x_1[i]) + x_2[i]) + ... in rank
// order, starting from x_0 (so a lone -0.0 stays -0.0), accumulated in fp32
// for fp32/bf16/fp16 (the 16-bit types widened exactly and rounded once, to
// nearest even, with the rules of float16_rules.h), in fp64 for fp64 and in
// int64 (two's complement wrap-around) for int64. The host reduction of the
// local and mpi backends (engine/src/comm/reduce.cc) computes the same bits;
// tests/comm/rank_order_sum_test.cc holds the two to each other, and the nccl
// backend's kernel (kernels/cuda/rank_order_sum.cu) is built from this file.
//
// A rule says how to widen a stored element into the accumulator, how to add
// two accumulators and how to narrow the result once; the vectorised CUDA
// path and the scalar element function below use the same three steps.
#ifndef ZEROSHARD_KERNELS_COMMON_RANK_ORDER_SUM_H_
#define ZEROSHARD_KERNELS_COMMON_RANK_ORDER_SUM_H_

#include <cstddef>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/common/host_device.h"

namespace zeroshard::kernels {

// The element types a rank-order sum is defined for. Kept apart from the
// engine's DType so that the kernels depend on no engine header.
enum class SumType : uint8_t { kFp32, kBf16, kFp16, kFp64, kInt64 };

// The explicit round-to-nearest adds keep nvcc from fusing or reordering
// anything, whatever the flags; on the host a plain add is already exact IEEE
// (the kernel files are compiled with -ffp-contract=off).
struct Fp32SumRule {
  using Storage = float;
  using Acc = float;
  static ZS_HOST_DEVICE_INLINE Acc Widen(Storage v) { return v; }
  static ZS_HOST_DEVICE_INLINE Acc Add(Acc a, Acc b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
  }
  static ZS_HOST_DEVICE_INLINE Storage Narrow(Acc v) { return v; }
};

struct Fp64SumRule {
  using Storage = double;
  using Acc = double;
  static ZS_HOST_DEVICE_INLINE Acc Widen(Storage v) { return v; }
  static ZS_HOST_DEVICE_INLINE Acc Add(Acc a, Acc b) {
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
  }
  static ZS_HOST_DEVICE_INLINE Storage Narrow(Acc v) { return v; }
};

// Wraps on overflow, through unsigned arithmetic (no undefined behaviour).
struct Int64SumRule {
  using Storage = int64_t;
  using Acc = int64_t;
  static ZS_HOST_DEVICE_INLINE Acc Widen(Storage v) { return v; }
  static ZS_HOST_DEVICE_INLINE Acc Add(Acc a, Acc b) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
  static ZS_HOST_DEVICE_INLINE Storage Narrow(Acc v) { return v; }
};

struct Bf16SumRule {
  using Storage = uint16_t;
  using Acc = float;
  static ZS_HOST_DEVICE_INLINE Acc Widen(Storage v) { return Bf16ToFp32(v); }
  static ZS_HOST_DEVICE_INLINE Acc Add(Acc a, Acc b) { return Fp32SumRule::Add(a, b); }
  static ZS_HOST_DEVICE_INLINE Storage Narrow(Acc v) { return Fp32ToBf16Rne(v); }
};

struct Fp16SumRule {
  using Storage = uint16_t;
  using Acc = float;
  static ZS_HOST_DEVICE_INLINE Acc Widen(Storage v) { return Fp16ToFp32(v); }
  static ZS_HOST_DEVICE_INLINE Acc Add(Acc a, Acc b) { return Fp32SumRule::Add(a, b); }
  static ZS_HOST_DEVICE_INLINE Storage Narrow(Acc v) { return Fp32ToFp16Rne(v); }
};

// The sum over `ranks` (>= 1) contributions of one element: contribution k
// is first[k * stride]. This is the whole numeric contract of a reduction.
template <class Rule>
ZS_HOST_DEVICE_INLINE typename Rule::Storage RankOrderSumElement(
    const typename Rule::Storage* first, size_t stride, int ranks) {
  typename Rule::Acc acc = Rule::Widen(first[0]);
  for (int k = 1; k < ranks; ++k) {
    acc = Rule::Add(acc, Rule::Widen(first[static_cast<size_t>(k) * stride]));
  }
  return Rule::Narrow(acc);
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_COMMON_RANK_ORDER_SUM_H_
