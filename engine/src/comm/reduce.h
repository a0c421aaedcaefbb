// The one reduction every backend uses, so that all of them produce the same
// bits: element i = ((x_0[i] + x_1[i]) + x_2[i]) + ... in rank order,
// accumulated in fp32 for fp32/bf16/fp16 (16-bit types rounded once, to
// nearest even, at the end), in double for fp64 and in int64 for int64.
#ifndef ZEROSHARD_ENGINE_SRC_COMM_REDUCE_H_
#define ZEROSHARD_ENGINE_SRC_COMM_REDUCE_H_

#include <cstdint>

#include "kernels/common/rank_order_sum.h"
#include "zeroshard/dtype.h"

namespace zeroshard {
namespace internal {

// True for the dtypes a sum is defined for (all but kUInt8).
bool IsSummable(DType dtype);

// The device sum kernels' name for a summable dtype (false for the others).
bool ToSumType(DType dtype, kernels::SumType* type);

// Sums `num_inputs` arrays of `count` elements in input order (input k is
// rank k's contribution) and stores the result into each of the
// `num_outputs` arrays. Works in small blocks that are read completely before
// they are written, so an output may be identical to an input (in place);
// other partial overlaps are not allowed. `dtype` must be summable.
void SumInRankOrder(const void* const* inputs, int num_inputs, void* const* outputs,
                    int num_outputs, int64_t count, DType dtype);

// The dtype SumInRankOrder accumulates `dtype` in: kFloat32 for fp32, bf16
// and fp16; `dtype` itself for fp64 and int64.
DType AccumulatorDType(DType dtype);

// SumInRankOrder in legs, for a sum that travels from rank to rank (the
// hierarchical reduce-scatter's chain over nodes): the accumulator starts
// from `partial` (AccumulatorDType elements) or, when it is null, from
// inputs[0]; the inputs that follow are added in order; the result goes to
// `out` in AccumulatorDType, unrounded, when `finish` is false (a later leg
// continues from it), or rounded to `dtype` when it is true. Splitting the
// inputs anywhere gives the bits of one SumInRankOrder over all of them.
// In place as SumInRankOrder (out may be an input or `partial`).
void ContinueSumInRankOrder(const void* partial, const void* const* inputs, int num_inputs,
                            void* out, int64_t count, DType dtype, bool finish);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_REDUCE_H_
