// One grid-stride kernel per element type; the pointer arrays travel by value.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/sum_in_rank_order.cuh"

namespace zeroshard::kernels::cuda {
namespace {

struct Operands {
  const void* in[kMaxSumOperands];
  void* out[kMaxSumOperands];
  int num_in;
  int num_out;
};

// The shared rule (kernels/common/rank_order_sum.h) over separate arrays.
template <class Rule>
__global__ void SumKernel(Operands ops, size_t n) {
  using Storage = typename Rule::Storage;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // From x_0, not from zero, so that a lone -0.0 stays -0.0.
    typename Rule::Acc acc = Rule::Widen(static_cast<const Storage*>(ops.in[0])[i]);
    for (int k = 1; k < ops.num_in; ++k) {
      acc = Rule::Add(acc, Rule::Widen(static_cast<const Storage*>(ops.in[k])[i]));
    }
    const Storage result = Rule::Narrow(acc);
    for (int o = 0; o < ops.num_out; ++o) static_cast<Storage*>(ops.out[o])[i] = result;
  }
}

template <class Rule>
cudaError_t Launch(const Operands& ops, size_t n, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr size_t kMaxBlocks = 65535;
  const size_t blocks = std::min(kMaxBlocks, (n + kThreads - 1) / kThreads);
  SumKernel<Rule><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(ops, n);
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
      return Launch<Fp32SumRule>(ops, n, stream);
    case SumType::kBf16:
      return Launch<Bf16SumRule>(ops, n, stream);
    case SumType::kFp16:
      return Launch<Fp16SumRule>(ops, n, stream);
    case SumType::kFp64:
      return Launch<Fp64SumRule>(ops, n, stream);
    case SumType::kInt64:
      return Launch<Int64SumRule>(ops, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace zeroshard::kernels::cuda
