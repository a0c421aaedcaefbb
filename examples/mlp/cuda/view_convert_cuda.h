// The GPU counterpart of examples/mlp/internal/view_convert.h: conversions
// between the engine's param / gradient views on a CUDA device (fp32, bf16 or
// fp16) and the fp32 device arrays the block math works on, with the
// project's float16 rules (kernels/common/float16_rules.h), so the bits are
// those of the CPU trainer's conversions.
//
// Both functions only enqueue on `stream`: the destination is ready when the
// stream reaches that point. The view's data must be device memory on the
// current device (as the engine's views are when it runs on a CUDA device),
// and the caller must have ordered `stream` after whoever wrote the source
// (the engine has synchronized its own stream before returning a view).
#ifndef ZEROSHARD_EXAMPLES_MLP_CUDA_VIEW_CONVERT_CUDA_H_
#define ZEROSHARD_EXAMPLES_MLP_CUDA_VIEW_CONVERT_CUDA_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "zeroshard/engine.h"

namespace zeroshard {
namespace mlp {
namespace gpu {

// Writes view.numel fp32 values of `view` to the device array `dst`
// (widening bf16 / fp16, which is exact; a device-to-device copy for fp32).
// InvalidArgument for a dtype other than fp32, bf16, fp16, or a view with
// elements and no data; else the failing CUDA call.
absl::Status ReadAsFp32Cuda(const TensorView& view, float* dst, cudaStream_t stream);

// Overwrites every element of `view` with the device array `src` (view.numel
// values), rounded to the view's dtype to nearest even (fp16: overflow to
// infinity, which the engine's loss scaling detects). Errors as
// ReadAsFp32Cuda.
absl::Status WriteFromFp32Cuda(const float* src, const TensorView& view, cudaStream_t stream);

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_CUDA_VIEW_CONVERT_CUDA_H_
