// Fused one-pass AdamW / Adam-L2 on device buffers.
//
// Plain C++ declarations (no CUDA syntax): a .cc file compiled by the host
// compiler may include this header; it needs the CUDA runtime headers only.
//
// Numeric contract: the one of kernels/cpu/adam.h, operation by operation, in
// fp32 with the same host-derived AdamConstants (MakeAdamConstants): every
// element goes through AdamElement (kernels/common/adam_element.h), the
// function the CPU scalar path calls. The file is compiled with --fmad=false
// and IEEE division and square root, so the results match the CPU paths bit
// for bit (a NaN result may differ in sign and payload, as between CPU paths).
#ifndef ZEROSHARD_KERNELS_CUDA_ADAM_CUH_
#define ZEROSHARD_KERNELS_CUDA_ADAM_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/adam_constants.h"
#include "kernels/cuda/launch_config.h"

namespace zeroshard::kernels::cuda {

// The operands of one update of n elements; all are device pointers to n
// elements and must not overlap.
struct AdamLaunchArgs {
  float* master = nullptr;  // the fp32 master, or the fp32 param itself
  // The 16-bit param copy written from the new master (rounded to nearest
  // even): param_out_type kBf16 or kFp16. kFp32 means no copy (param_out null).
  uint16_t* param_out = nullptr;
  ElementType param_out_type = ElementType::kFp32;
  const void* grad = nullptr;  // of grad_type: fp32, or raw 16-bit bits
  ElementType grad_type = ElementType::kFp32;
  float* m = nullptr;
  float* v = nullptr;
  size_t n = 0;
};

// Launches the update on `stream`. Supported combinations: fp32 grads with
// no copy, a bf16 or an fp16 copy; bf16 grads with a bf16 copy; fp16 grads
// with an fp16 copy. Accesses are 16 bytes wide (8 for 16-bit operands) when
// every pointer allows it, element by element otherwise. Returns the launch
// error (cudaGetLastError()); cudaErrorInvalidValue for a null or missing
// operand or an unsupported combination; cudaSuccess for n == 0.
// Asynchronous: errors of the kernel's execution surface at the next sync.
cudaError_t LaunchAdam(const AdamLaunchArgs& args, const AdamConstants& c, cudaStream_t stream);

// The fp32 / bf16 form: `param_out` (bf16) may be null, where `master` is the
// param itself; `grad` is fp32 unless `grad_bf16` is given (then `grad` must
// be null).
cudaError_t LaunchAdam(float* master, uint16_t* param_out, const float* grad,
                       const uint16_t* grad_bf16, float* m, float* v, size_t n,
                       const AdamConstants& c, cudaStream_t stream);

}  // namespace zeroshard::kernels::cuda

#endif  // ZEROSHARD_KERNELS_CUDA_ADAM_CUH_
