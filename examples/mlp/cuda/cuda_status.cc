#include "examples/mlp/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace zeroshard {
namespace mlp {
namespace gpu {

absl::Status CudaCallStatus(cudaError_t error, absl::string_view call) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Clear the runtime's last-error slot (a non-sticky error stays there), so
  // a later launch check does not report this failure as its own.
  cudaGetLastError();
  const std::string message =
      absl::StrCat(call, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::UnavailableError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasCallStatus(cublasStatus_t status, absl::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", cublasLtGetStatusName(status), " (",
                                           cublasLtGetStatusString(status), ")");
  switch (status) {
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(message);
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
