// DeviceOps: the engine's per-step arithmetic on device buffers, enqueued on
// one stream. One interface, two implementations: the CPU one runs the SIMD
// kernels of kernels/cpu on the CPU stream's thread, the CUDA one launches
// the kernels of kernels/cuda on the CUDA stream. Both give the same bits
// (the per-element arithmetic is shared, kernels/common).
//
// Every call only enqueues: the host must not read an output, or reuse an
// input it owns, before the stream (or an event recorded after the call) has
// been synchronized. Pointers are the Device's memory (host memory on the
// CPU). A call returns an error only for bad arguments or a failed launch;
// failures while the work runs surface at the stream's Synchronize.
#ifndef ZEROSHARD_DEVICE_DEVICE_OPS_H_
#define ZEROSHARD_DEVICE_DEVICE_OPS_H_

#include <cstdint>
#include <initializer_list>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/common/quant_int8.h"
#include "kernels/cpu/adam.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"

namespace zeroshard::internal {

// Which fused update: fp32 params (no master), or an fp32 master with a
// 16-bit param copy and fp32 or 16-bit gradients.
enum class AdamVariant {
  kFp32,               // param fp32, grad fp32
  kMixedBf16,          // master fp32 -> param_out bf16, grad fp32
  kMixedBf16GradBf16,  // master fp32 -> param_out bf16, grad bf16
  kMixedFp16,          // master fp32 -> param_out fp16, grad fp32
  kMixedFp16GradFp16,  // master fp32 -> param_out fp16, grad fp16
};

struct AdamArgs {
  AdamVariant variant = AdamVariant::kFp32;
  float* master = nullptr;        // the fp32 param itself for kFp32
  uint16_t* param_out = nullptr;  // 16-bit copy (mixed variants only)
  const void* grad = nullptr;     // fp32, or the variant's 16-bit type
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // acc[i] += add[i] for n elements of `dtype` (fp32, bf16 or fp16). 16-bit
  // values are widened, added in fp32 and rounded once to nearest even.
  virtual absl::Status Accumulate(void* acc, const void* add, int64_t n, DType dtype) = 0;

  // blocks[b] = sum of squares (double) of block b of x: ceil(n /
  // kernels::kNormBlock) blocks, in the fixed lane order of kernels/cpu/norm.h.
  // `blocks` is device memory.
  virtual absl::Status BlockSumSquares(const void* x, int64_t n, DType dtype, double* blocks) = 0;

  // The fused Adam / AdamW update of kernels/cpu/adam.h.
  virtual absl::Status Adam(const AdamArgs& args, const kernels::AdamConstants& c) = 0;

  // Blockwise int8 quantization (kernels/common/quant_int8.h): n elements of
  // x (fp32, bf16 or fp16) into their packed form at `packed`
  // (QuantPackedBytes(n) bytes, 8-byte aligned), and back into n elements
  // of `dtype` at `out`. The packed form must not overlap x or out.
  virtual absl::Status QuantizeInt8(const void* x, int64_t n, DType dtype, void* packed) = 0;
  virtual absl::Status DequantizeInt8(const void* packed, int64_t n, DType dtype, void* out) = 0;

  virtual Stream& stream() = 0;
};

// Ops for `device` on `stream` (a stream of `device`, which both must
// outlive the ops). Unimplemented for a CUDA device in a build without CUDA.
absl::StatusOr<std::unique_ptr<DeviceOps>> CreateDeviceOps(Device& device, Stream& stream);

// For the implementations (device_ops.cc, cpu_device_ops.cc, and the CUDA
// ones in cuda_device_ops.cc).
absl::StatusOr<std::unique_ptr<DeviceOps>> CreateCpuDeviceOps(Stream& stream);
absl::StatusOr<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(Device& device, Stream& stream);
// InvalidArgument naming `op` for a dtype that is not fp32/bf16/fp16, n < 0,
// or a null pointer among `pointers` when n > 0.
absl::Status CheckOperands(const char* op, int64_t n, DType dtype,
                           std::initializer_list<const void*> pointers);
// InvalidArgument when the pointers do not fit the variant.
absl::Status CheckAdamArgs(const AdamArgs& args);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_DEVICE_DEVICE_OPS_H_
