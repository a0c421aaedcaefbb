// A small owner of a cuBLASLt handle and its workspace, with one operation:
// a row-major matrix product in the layout the MLP's CPU path uses.
//
//   C [m, n] = op(A) [m, k] * op(B) [k, n]      (alpha 1, beta 0: C overwritten)
//
// where every matrix is row-major with a leading dimension (elements between
// rows), as in cblas_sgemm(CblasRowMajor, ...), so a call written for the CPU
// path carries over argument by argument. A and B are fp32 or bf16 (both the
// same); C is always fp32 and the products are accumulated in fp32
// (CUBLAS_COMPUTE_32F: no TF32, which cuBLASLt only uses when asked for
// CUBLAS_COMPUTE_32F_FAST_TF32).
#ifndef ZEROSHARD_EXAMPLES_MLP_CUDA_CUBLASLT_GEMM_H_
#define ZEROSHARD_EXAMPLES_MLP_CUDA_CUBLASLT_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard {
namespace mlp {
namespace gpu {

// Element type of the A and B operands.
enum class GemmInputType { kFp32, kBf16 };

// Whether an operand is used as stored (kNo) or transposed (kYes).
enum class Transpose { kNo, kYes };

// One row-major product's shape and operands (device pointers, not owned).
struct RowMajorGemmArgs {
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  GemmInputType input_type = GemmInputType::kFp32;
  const void* a = nullptr;  // op(A) is [m, k]
  int64_t lda = 0;
  const void* b = nullptr;  // op(B) is [k, n]
  int64_t ldb = 0;
  float* c = nullptr;  // [m, n]; must not overlap A or B
  int64_t ldc = 0;
};

// Owns a cublasLtHandle_t and a device workspace on the device that was
// current at Create(). Not thread-safe, and the workspace is shared by every
// call: calls must be ordered (one stream, or streams the caller orders with
// events), as the MLP's block math does.
class CublasLtGemm {
 public:
  // cuBLASLt's recommendation for Hopper; enough for every split-K algorithm
  // the heuristic picks for the MLP's shapes.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Creates the handle and allocates the workspace on the current device.
  // Errors: the failing CUDA / cuBLASLt call (Unavailable without a device,
  // ResourceExhausted when the workspace does not fit).
  static absl::StatusOr<std::unique_ptr<CublasLtGemm>> Create(
      size_t workspace_bytes = kDefaultWorkspaceBytes);

  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Enqueues C = op(A) op(B) on `stream`. `what` names the product in error
  // messages ("forward pre = x W1^T"). InvalidArgument for a null pointer,
  // non-positive sizes or a leading dimension smaller than its row;
  // Unimplemented when cuBLASLt has no algorithm for the shape and types;
  // else the failing cuBLASLt call. Asynchronous: the product is done when
  // the stream has reached this point.
  absl::Status RowMajor(const RowMajorGemmArgs& args, cudaStream_t stream, absl::string_view what);

 private:
  CublasLtGemm(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

  cublasLtHandle_t handle_;
  void* workspace_;
  size_t workspace_bytes_;
};

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_CUDA_CUBLASLT_GEMM_H_
