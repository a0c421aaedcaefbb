// The residual-MLP block of examples/mlp/internal/block_math.h on device
// memory: the same forward and backward, the same row-major layout and the
// same argument order, so every array can be compared element by element
// with the CPU path.
//
// One block on a row-major micro-batch x [batch, hidden]:
//   pre = x W1^T + b1          [batch, 4*hidden]
//   act = gelu(pre)            exact GELU
//   y   = x + act W2^T + b2    [batch, hidden]
//
// Every function only enqueues work on the given stream and returns once it
// is enqueued: results are ready when the stream reaches that point (the
// caller synchronizes the stream or records an event). All pointers are
// device pointers on the device current when `gemm` was created, not owned.
// Errors name the failing CUDA / cuBLASLt call and the product or kernel;
// after an error the outputs are unspecified.
#ifndef ZEROSHARD_EXAMPLES_MLP_CUDA_BLOCK_MATH_CUDA_H_
#define ZEROSHARD_EXAMPLES_MLP_CUDA_BLOCK_MATH_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/mlp/cuda/cublaslt_gemm.h"

namespace zeroshard {
namespace mlp {
namespace gpu {

// What the four matrix products read.
//  kFp32: fp32 operands, fp32 accumulation (the CPU's arithmetic up to the
//         order of each dot product's sum).
//  kBf16: both operands of every product rounded to bf16 (nearest even, the
//         project's rule) into scratch first, then fp32 accumulation and fp32
//         output. Biases, GELU, residual, bias gradients and every saved
//         activation stay fp32. Faster on tensor cores, ~1e-2 relative error.
enum class MatmulInputs { kFp32, kBf16 };

// One block's fp32 weights on the device (not owned).
struct DeviceBlockWeights {
  const float* w1 = nullptr;  // [4h, h]
  const float* b1 = nullptr;  // [4h]
  const float* w2 = nullptr;  // [h, 4h]
  const float* b2 = nullptr;  // [h]
};

// Where one block's fp32 gradients go on the device (not owned); every
// element is overwritten, never accumulated into.
struct DeviceBlockGradients {
  float* w1 = nullptr;
  float* b1 = nullptr;
  float* w2 = nullptr;
  float* b2 = nullptr;
};

// Byte offsets into the scratch buffer of one block's forward or backward,
// each 256-byte aligned (what cuBLASLt's fastest kernels want). The one
// layout both the size query and the functions use, so they cannot drift.
struct BlockScratchLayout {
  size_t dpre = 0;     // fp32 [batch, 4h]: dL/dpre (backward)
  size_t w1_bf16 = 0;  // bf16 copies of the product operands (kBf16 only)
  size_t w2_bf16 = 0;
  size_t x_bf16 = 0;     // [batch, h]
  size_t act_bf16 = 0;   // [batch, 4h]
  size_t dy_bf16 = 0;    // [batch, h]
  size_t dpre_bf16 = 0;  // [batch, 4h]
  size_t total_bytes = 0;
};

// The scratch layout for a [batch, hidden] block (pure; allocates nothing).
BlockScratchLayout LayOutBlockScratch(int64_t batch, int64_t hidden, MatmulInputs inputs);

// Bytes of device scratch BlockForwardCuda / BlockBackwardCuda need.
inline size_t BlockScratchBytes(int64_t batch, int64_t hidden, MatmulInputs inputs) {
  return LayOutBlockScratch(batch, hidden, inputs).total_bytes;
}

// Device scratch the MSE loss needs, in bytes.
size_t MseScratchBytes();

// Sizes and precision of one block's math, and its device scratch.
struct BlockMathArgs {
  int64_t batch = 0;
  int64_t hidden = 0;
  MatmulInputs inputs = MatmulInputs::kFp32;
  void* scratch = nullptr;  // BlockScratchBytes(batch, hidden, inputs) bytes
  size_t scratch_bytes = 0;
};

// One block forward: reads x, writes pre, act and y (y must not alias x).
// InvalidArgument for non-positive sizes, a null pointer or too little
// scratch.
absl::Status BlockForwardCuda(CublasLtGemm& gemm, const BlockMathArgs& args,
                              const DeviceBlockWeights& w, const float* x, float* pre, float* act,
                              float* y, cudaStream_t stream);

// One block backward. Given the saved x, pre, act and dL/dy, writes dL/dx
// (must not alias dy; null when not needed, as for the first block) and the
// four parameter gradients. Errors as BlockForwardCuda.
absl::Status BlockBackwardCuda(CublasLtGemm& gemm, const BlockMathArgs& args,
                               const DeviceBlockWeights& w, const float* x, const float* pre,
                               const float* act, const float* dy, float* dx,
                               const DeviceBlockGradients& grads, cudaStream_t stream);

// Mean squared error over n elements: writes dL/dout = (2/n)(out - target)
// (bit-identical to internal::MseLoss's) and the loss, (1/n) sum of squares
// summed in double, to the device double *loss. `scratch` holds
// MseScratchBytes(). InvalidArgument for n <= 0 or a null pointer.
absl::Status MseLossCuda(const float* out, const float* target, int64_t n, float* dout,
                         void* scratch, size_t scratch_bytes, double* loss, cudaStream_t stream);

// Copies the device double `loss` to the host after synchronizing `stream`
// (so after everything enqueued on it, the loss included).
absl::StatusOr<double> ReadLoss(const double* loss, cudaStream_t stream);

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_CUDA_BLOCK_MATH_CUDA_H_
