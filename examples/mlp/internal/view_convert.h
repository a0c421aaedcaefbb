// Conversions between the engine's param / gradient views (fp32, bf16 or
// fp16) and the fp32 arrays the MLP math works on.
#ifndef ZEROSHARD_EXAMPLES_MLP_INTERNAL_VIEW_CONVERT_H_
#define ZEROSHARD_EXAMPLES_MLP_INTERNAL_VIEW_CONVERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/mlp/internal/block_math.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"

namespace zeroshard {
namespace mlp {
namespace internal {

// True for the dtypes the MLP example reads and writes: fp32, bf16, fp16.
bool IsSupportedViewDType(DType dtype);

// Writes view.numel fp32 values of `view` to `dst` (widening bf16 / fp16,
// which is exact). InvalidArgument for another dtype or a null view.
absl::Status ReadAsFp32(const TensorView& view, float* dst);

// Overwrites every element of `view` with `src` (view.numel values), rounded
// to the view's dtype to nearest even (fp16: overflow to infinity, which the
// engine's loss scaling detects). InvalidArgument for another dtype or a
// null view.
absl::Status WriteFromFp32(const float* src, const TensorView& view);

// Checks one unit's view against the element counts its trainer expects
// (`sizes`, one per param in ModelSpec order): Internal when a count
// differs or a view is null, Unimplemented for a dtype the example does not
// handle; the message starts with `who` and names `what` ("params",
// "gradient view") and the unit.
absl::Status CheckUnitView(const UnitView& view, int unit, const std::vector<int64_t>& sizes,
                           const char* who, const char* what);

// fp32 pointers to a unit's params, one per param: the view itself for
// fp32, else a widened (exact) copy in `copy`, which holds the sum of
// `sizes` floats. Errors: CheckUnitView's.
absl::Status UnitParamsAsFp32(const UnitView& view, int unit, const std::vector<int64_t>& sizes,
                              const char* who, float* copy, const float** params);

// A block's params (W1, b1, W2, b2, in ModelSpec order) as fp32, as
// UnitParamsAsFp32 gives them: valid while the view is and until `copy` is
// reused.
absl::StatusOr<BlockWeights> BlockWeightsAsFp32(const UnitView& view, int unit,
                                                const std::vector<int64_t>& sizes, const char* who,
                                                float* copy);

// Overwrites every element of a unit's gradient view with the fp32 values
// in `src` (the params' gradients concatenated in ModelSpec order), rounded
// to the view's dtype. Errors: CheckUnitView's.
absl::Status WriteUnitFromFp32(const float* src, const UnitView& view, int unit,
                               const std::vector<int64_t>& sizes, const char* who);

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_INTERNAL_VIEW_CONVERT_H_
