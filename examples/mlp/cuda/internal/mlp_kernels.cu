// Kernels of the MLP block: one functor per element rule, one grid-stride
// __global__ applying it, one launcher.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "examples/mlp/cuda/internal/mlp_kernels.cuh"
#include "kernels/common/float16_rules.h"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace internal {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU; the grid-stride loops cover the rest.
constexpr size_t kMaxBlocks = 65535;

unsigned BlocksFor(size_t n) {
  return static_cast<unsigned>(std::min(kMaxBlocks, (n + kThreads - 1) / kThreads));
}

__device__ __forceinline__ size_t FirstIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t GridStride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// The constants and operation order of block_math.cc's Gelu / GeluGrad; the
// _rn intrinsics forbid contraction even without --fmad=false.
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

struct GeluFunctor {
  __device__ __forceinline__ float operator()(float x) const {
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, erff(__fmul_rn(x, kInvSqrt2))));
  }
};

struct GeluGradFunctor {
  __device__ __forceinline__ float operator()(float x) const {
    const float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erff(__fmul_rn(x, kInvSqrt2))));
    const float pdf = __fmul_rn(kInvSqrt2Pi, expf(__fmul_rn(__fmul_rn(-0.5f, x), x)));
    return __fadd_rn(cdf, __fmul_rn(x, pdf));
  }
};

__global__ void AddBiasKernel(const float* bias, size_t rows, size_t cols, float* m) {
  const size_t n = rows * cols;
  for (size_t i = FirstIndex(); i < n; i += GridStride()) m[i] = __fadd_rn(m[i], bias[i % cols]);
}

__global__ void GeluKernel(GeluFunctor f, const float* pre, size_t n, float* act) {
  for (size_t i = FirstIndex(); i < n; i += GridStride()) act[i] = f(pre[i]);
}

__global__ void MulGeluGradKernel(GeluGradFunctor f, const float* pre, size_t n, float* grad) {
  for (size_t i = FirstIndex(); i < n; i += GridStride()) grad[i] = __fmul_rn(grad[i], f(pre[i]));
}

__global__ void AddInPlaceKernel(const float* x, size_t n, float* y) {
  for (size_t i = FirstIndex(); i < n; i += GridStride()) y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void ScaleInPlaceKernel(float scale, size_t n, float* y) {
  for (size_t i = FirstIndex(); i < n; i += GridStride()) y[i] = __fmul_rn(y[i], scale);
}

// One thread per column: neighbouring threads read neighbouring addresses
// of each row (coalesced), and every column is summed in row order.
__global__ void ColumnSumsKernel(const float* m, size_t rows, size_t cols, float* out) {
  for (size_t c = FirstIndex(); c < cols; c += GridStride()) {
    float sum = 0.0f;
    for (size_t r = 0; r < rows; ++r) sum = __fadd_rn(sum, m[r * cols + c]);
    out[c] = sum;
  }
}

// The MSE's fixed grid: kLossBlocks blocks of kThreads threads, whatever n
// is, so the reduction tree (and so the double result) depends only on n and
// the data.
constexpr unsigned kLossBlocks = 256;

// Sums kThreads doubles of shared memory in a fixed tree; the result is in
// values[0] for thread 0.
__device__ void BlockSum(double* values) {
  for (unsigned width = kThreads / 2; width > 0; width /= 2) {
    __syncthreads();
    if (threadIdx.x < width) values[threadIdx.x] += values[threadIdx.x + width];
  }
}

__global__ void MseKernel(const float* out, const float* target, size_t n, float scale, float* dout,
                          double* partials) {
  __shared__ double values[kThreads];
  double sum = 0.0;
  for (size_t i = FirstIndex(); i < n; i += GridStride()) {
    const float diff = __fsub_rn(out[i], target[i]);
    // A float times a float is exact in double: only the sum rounds.
    sum += static_cast<double>(diff) * static_cast<double>(diff);
    dout[i] = __fmul_rn(scale, diff);
  }
  values[threadIdx.x] = sum;
  BlockSum(values);
  if (threadIdx.x == 0) partials[blockIdx.x] = values[0];
}

__global__ void MseFinishKernel(const double* partials, size_t n, double* loss) {
  __shared__ double values[kThreads];
  double sum = 0.0;
  for (unsigned b = threadIdx.x; b < kLossBlocks; b += kThreads) sum += partials[b];
  values[threadIdx.x] = sum;
  BlockSum(values);
  if (threadIdx.x == 0) *loss = values[0] / static_cast<double>(n);
}

template <class Src, class Dst, class Convert>
__global__ void ConvertKernel(Convert convert, const Src* src, size_t n, Dst* dst) {
  for (size_t i = FirstIndex(); i < n; i += GridStride()) dst[i] = convert(src[i]);
}

struct Bf16ToFp32Op {
  __device__ __forceinline__ float operator()(uint16_t h) const {
    return ::zeroshard::kernels::Bf16ToFp32(h);
  }
};
struct Fp16ToFp32Op {
  __device__ __forceinline__ float operator()(uint16_t h) const {
    return ::zeroshard::kernels::Fp16ToFp32(h);
  }
};
struct Fp32ToBf16Op {
  __device__ __forceinline__ uint16_t operator()(float x) const {
    return ::zeroshard::kernels::Fp32ToBf16Rne(x);
  }
};
struct Fp32ToFp16Op {
  __device__ __forceinline__ uint16_t operator()(float x) const {
    return ::zeroshard::kernels::Fp32ToFp16Rne(x);
  }
};

template <class Src, class Dst, class Convert>
cudaError_t LaunchConvert(const Src* src, size_t n, Dst* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  ConvertKernel<Src, Dst, Convert><<<BlocksFor(n), kThreads, 0, stream>>>(Convert{}, src, n, dst);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAddBias(const float* bias, size_t rows, size_t cols, float* m,
                          cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (bias == nullptr || m == nullptr) return cudaErrorInvalidValue;
  AddBiasKernel<<<BlocksFor(rows * cols), kThreads, 0, stream>>>(bias, rows, cols, m);
  return cudaGetLastError();
}

cudaError_t LaunchGelu(const float* pre, size_t n, float* act, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (pre == nullptr || act == nullptr) return cudaErrorInvalidValue;
  GeluKernel<<<BlocksFor(n), kThreads, 0, stream>>>(GeluFunctor{}, pre, n, act);
  return cudaGetLastError();
}

cudaError_t LaunchMulGeluGrad(const float* pre, size_t n, float* grad, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (pre == nullptr || grad == nullptr) return cudaErrorInvalidValue;
  MulGeluGradKernel<<<BlocksFor(n), kThreads, 0, stream>>>(GeluGradFunctor{}, pre, n, grad);
  return cudaGetLastError();
}

cudaError_t LaunchAddInPlace(const float* x, size_t n, float* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  AddInPlaceKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchScaleInPlace(float scale, size_t n, float* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (y == nullptr) return cudaErrorInvalidValue;
  ScaleInPlaceKernel<<<BlocksFor(n), kThreads, 0, stream>>>(scale, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSums(const float* m, size_t rows, size_t cols, float* out,
                             cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  if (m == nullptr || out == nullptr) return cudaErrorInvalidValue;
  ColumnSumsKernel<<<BlocksFor(cols), kThreads, 0, stream>>>(m, rows, cols, out);
  return cudaGetLastError();
}

size_t MseScratchDoubles() { return kLossBlocks; }

cudaError_t LaunchMseLoss(const float* out, const float* target, size_t n, float* dout,
                          double* partials, double* loss, cudaStream_t stream) {
  if (n == 0 || out == nullptr || target == nullptr || dout == nullptr || partials == nullptr ||
      loss == nullptr) {
    return cudaErrorInvalidValue;
  }
  // The CPU's scale: 2.0f / (float)n, rounded once in fp32.
  const float scale = 2.0f / static_cast<float>(n);
  MseKernel<<<kLossBlocks, kThreads, 0, stream>>>(out, target, n, scale, dout, partials);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  MseFinishKernel<<<1, kThreads, 0, stream>>>(partials, n, loss);
  return cudaGetLastError();
}

cudaError_t LaunchBf16ToFp32(const uint16_t* src, size_t n, float* dst, cudaStream_t stream) {
  return LaunchConvert<uint16_t, float, Bf16ToFp32Op>(src, n, dst, stream);
}
cudaError_t LaunchFp16ToFp32(const uint16_t* src, size_t n, float* dst, cudaStream_t stream) {
  return LaunchConvert<uint16_t, float, Fp16ToFp32Op>(src, n, dst, stream);
}
cudaError_t LaunchFp32ToBf16(const float* src, size_t n, uint16_t* dst, cudaStream_t stream) {
  return LaunchConvert<float, uint16_t, Fp32ToBf16Op>(src, n, dst, stream);
}
cudaError_t LaunchFp32ToFp16(const float* src, size_t n, uint16_t* dst, cudaStream_t stream) {
  return LaunchConvert<float, uint16_t, Fp32ToFp16Op>(src, n, dst, stream);
}

}  // namespace internal
}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
