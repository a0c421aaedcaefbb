// CUDA runtime and cuBLASLt return codes as absl::Status, naming the call.
//
// The MLP's GPU math passes every error up (a library must not exit); the
// message carries the call, the code's name and its description, e.g.
//   "cublasLtMatmul (forward pre = x W1^T): CUBLAS_STATUS_NOT_SUPPORTED (...)".
#ifndef ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_STATUS_H_
#define ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace gpu {

// OK for cudaSuccess; otherwise Internal (Unavailable for "no device" and
// "insufficient driver", ResourceExhausted for out of memory) with `call`,
// the error's name and its description.
absl::Status CudaCallStatus(cudaError_t error, absl::string_view call);

// OK for CUBLAS_STATUS_SUCCESS; otherwise Internal (InvalidArgument for
// CUBLAS_STATUS_INVALID_VALUE, Unimplemented for NOT_SUPPORTED,
// ResourceExhausted for ALLOC_FAILED) with `call` and the status's name.
absl::Status CublasCallStatus(cublasStatus_t status, absl::string_view call);

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

// Evaluates a CUDA runtime call and returns its Status from the enclosing
// function when it failed; the message names the call as written.
#define ZS_CUDA_RETURN_IF_ERROR(call) \
  ZS_RETURN_IF_ERROR(::zeroshard::mlp::gpu::CudaCallStatus((call), #call))

// The same for a cuBLAS / cuBLASLt call.
#define ZS_CUBLAS_RETURN_IF_ERROR(call) \
  ZS_RETURN_IF_ERROR(::zeroshard::mlp::gpu::CublasCallStatus((call), #call))

#endif  // ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_STATUS_H_
