// One grid-stride kernel per element type; the pointer arrays travel by value.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/float16_rules.h"
#include "kernels/cuda/sum_in_rank_order.cuh"

namespace zeroshard::kernels::cuda {
namespace {

struct Operands {
  const void* in[kMaxSumOperands];
  void* out[kMaxSumOperands];
  int num_in;
  int num_out;
};

// Storage type, accumulator, and the conversions between them.
struct Fp32Codec {
  using Storage = float;
  using Acc = float;
  __device__ static Acc Load(Storage v) { return v; }
  __device__ static Storage Store(Acc v) { return v; }
  __device__ static Acc Add(Acc a, Acc b) { return __fadd_rn(a, b); }
};
struct Bf16Codec {
  using Storage = uint16_t;
  using Acc = float;
  __device__ static Acc Load(Storage v) { return Bf16ToFp32(v); }
  __device__ static Storage Store(Acc v) { return Fp32ToBf16Rne(v); }
  __device__ static Acc Add(Acc a, Acc b) { return __fadd_rn(a, b); }
};
struct Fp16Codec {
  using Storage = uint16_t;
  using Acc = float;
  __device__ static Acc Load(Storage v) { return Fp16ToFp32(v); }
  __device__ static Storage Store(Acc v) { return Fp32ToFp16Rne(v); }
  __device__ static Acc Add(Acc a, Acc b) { return __fadd_rn(a, b); }
};
struct Fp64Codec {
  using Storage = double;
  using Acc = double;
  __device__ static Acc Load(Storage v) { return v; }
  __device__ static Storage Store(Acc v) { return v; }
  __device__ static Acc Add(Acc a, Acc b) { return __dadd_rn(a, b); }
};
struct Int64Codec {
  using Storage = int64_t;
  using Acc = uint64_t;  // wraps like two's complement, no signed overflow
  __device__ static Acc Load(Storage v) { return static_cast<uint64_t>(v); }
  __device__ static Storage Store(Acc v) { return static_cast<int64_t>(v); }
  __device__ static Acc Add(Acc a, Acc b) { return a + b; }
};

template <class Codec>
__global__ void SumKernel(Operands ops, size_t n) {
  using Storage = typename Codec::Storage;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // From x_0, not from zero, so that a lone -0.0 stays -0.0.
    typename Codec::Acc acc = Codec::Load(static_cast<const Storage*>(ops.in[0])[i]);
    for (int k = 1; k < ops.num_in; ++k) {
      acc = Codec::Add(acc, Codec::Load(static_cast<const Storage*>(ops.in[k])[i]));
    }
    const Storage result = Codec::Store(acc);
    for (int o = 0; o < ops.num_out; ++o) static_cast<Storage*>(ops.out[o])[i] = result;
  }
}

template <class Codec>
cudaError_t Launch(const Operands& ops, size_t n, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr size_t kMaxBlocks = 65535;
  const size_t blocks = std::min(kMaxBlocks, (n + kThreads - 1) / kThreads);
  SumKernel<Codec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(ops, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSumInRankOrder(const void* const* inputs, int num_inputs, void* const* outputs,
                                 int num_outputs, size_t n, SumType type, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (num_inputs < 1 || num_inputs > kMaxSumOperands || num_outputs < 1 ||
      num_outputs > kMaxSumOperands || inputs == nullptr || outputs == nullptr) {
    return cudaErrorInvalidValue;
  }
  Operands ops{};
  ops.num_in = num_inputs;
  ops.num_out = num_outputs;
  for (int k = 0; k < num_inputs; ++k) {
    if (inputs[k] == nullptr) return cudaErrorInvalidValue;
    ops.in[k] = inputs[k];
  }
  for (int o = 0; o < num_outputs; ++o) {
    if (outputs[o] == nullptr) return cudaErrorInvalidValue;
    ops.out[o] = outputs[o];
  }
  switch (type) {
    case SumType::kFp32:
      return Launch<Fp32Codec>(ops, n, stream);
    case SumType::kBf16:
      return Launch<Bf16Codec>(ops, n, stream);
    case SumType::kFp16:
      return Launch<Fp16Codec>(ops, n, stream);
    case SumType::kFp64:
      return Launch<Fp64Codec>(ops, n, stream);
    case SumType::kInt64:
      return Launch<Int64Codec>(ops, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace zeroshard::kernels::cuda
