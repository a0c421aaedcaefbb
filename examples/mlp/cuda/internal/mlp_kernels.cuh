// The element-wise and reduction kernels of the MLP block on device memory.
//
// Plain C++ declarations (no CUDA syntax), so the host-compiled block math
// (block_math_cuda.cc) includes this header with the CUDA runtime headers
// only. Every launcher enqueues on `stream`, returns the launch error
// (cudaGetLastError()), cudaErrorInvalidValue for a null pointer, and
// cudaSuccess without launching for an empty range. Sizes are size_t and the
// kernels loop grid-stride, so any size fits any grid.
//
// Numeric contract: each element is computed by the same fp32 operations, in
// the same order, as examples/mlp/internal/block_math.cc; the file is
// compiled with --fmad=false (no contraction into FMA). The erf and exp of
// the GELU are the device's erff / expf, which may differ from the host's by
// an ulp: GELU results are close, not bit-identical. The bias gradients sum
// rows in index order like the CPU, so equal inputs give equal bits.
#ifndef ZEROSHARD_EXAMPLES_MLP_CUDA_INTERNAL_MLP_KERNELS_CUH_
#define ZEROSHARD_EXAMPLES_MLP_CUDA_INTERNAL_MLP_KERNELS_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace internal {

// m [rows, cols] (row-major) += bias [cols] on every row.
cudaError_t LaunchAddBias(const float* bias, size_t rows, size_t cols, float* m,
                          cudaStream_t stream);

// act[i] = gelu(pre[i]) (exact, erf-based), i < n. act may alias pre.
cudaError_t LaunchGelu(const float* pre, size_t n, float* act, cudaStream_t stream);

// grad[i] *= gelu'(pre[i]), i < n.
cudaError_t LaunchMulGeluGrad(const float* pre, size_t n, float* grad, cudaStream_t stream);

// y[i] += x[i], i < n (the residual path).
cudaError_t LaunchAddInPlace(const float* x, size_t n, float* y, cudaStream_t stream);

// y[i] *= scale, i < n (the loss scale on the backward's seed).
cudaError_t LaunchScaleInPlace(float scale, size_t n, float* y, cudaStream_t stream);

// out[c] = sum over r of m[r, c] (row-major [rows, cols]), rows summed in
// index order starting from 0.0f: one thread per column, so the order does
// not depend on the grid.
cudaError_t LaunchColumnSums(const float* m, size_t rows, size_t cols, float* out,
                             cudaStream_t stream);

// Doubles of scratch the MSE launcher needs (one partial sum per block of
// its fixed grid).
size_t MseScratchDoubles();

// dout[i] = (2.0f / n) * (out[i] - target[i]) in fp32, and *loss (a device
// double) = (1/n) sum (out[i] - target[i])^2 with each square and the sum in
// double. The sum runs over a fixed grid and a fixed tree, so it depends
// only on n and the data, never on the device; its order differs from the
// CPU's index order (relative differences ~1e-16). `partials` holds
// MseScratchDoubles() doubles. n must be positive.
cudaError_t LaunchMseLoss(const float* out, const float* target, size_t n, float* dout,
                          double* partials, double* loss, cudaStream_t stream);

// fp32 -> bf16 / fp16 bits and back, element by element, with the project's
// rules (kernels/common/float16_rules.h): widening is exact, narrowing
// rounds to nearest even. src and dst must not overlap.
cudaError_t LaunchBf16ToFp32(const uint16_t* src, size_t n, float* dst, cudaStream_t stream);
cudaError_t LaunchFp16ToFp32(const uint16_t* src, size_t n, float* dst, cudaStream_t stream);
cudaError_t LaunchFp32ToBf16(const float* src, size_t n, uint16_t* dst, cudaStream_t stream);
cudaError_t LaunchFp32ToFp16(const float* src, size_t n, uint16_t* dst, cudaStream_t stream);

}  // namespace internal
}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_CUDA_INTERNAL_MLP_KERNELS_CUH_
