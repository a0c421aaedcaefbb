// Conversions between the engine's param / gradient views (fp32, bf16 or
// fp16) and the fp32 arrays the MLP math works on.
#ifndef ZEROSHARD_EXAMPLES_MLP_INTERNAL_VIEW_CONVERT_H_
#define ZEROSHARD_EXAMPLES_MLP_INTERNAL_VIEW_CONVERT_H_

#include "absl/status/status.h"
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

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_INTERNAL_VIEW_CONVERT_H_
