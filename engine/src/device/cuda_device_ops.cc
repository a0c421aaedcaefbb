// DeviceOps on a CUDA device: the kernels of kernels/cuda launched on the
// stream's cudaStream_t after the same argument checks as the CPU ops.
#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_format.h"
#include "engine/src/device/cuda_device.h"
#include "engine/src/device/device_ops.h"
#include "kernels/cuda/adam.cuh"
#include "kernels/cuda/device_ops.cuh"
#include "kernels/cuda/quant_int8.cuh"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

using kernels::cuda::ElementType;

// CheckOperands has accepted only fp32, bf16 and fp16.
ElementType ElementTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return ElementType::kBf16;
    case DType::kFloat16:
      return ElementType::kFp16;
    default:
      return ElementType::kFp32;
  }
}

kernels::cuda::AdamLaunchArgs LaunchArgsOf(const AdamArgs& a) {
  kernels::cuda::AdamLaunchArgs l;
  l.master = a.master;
  l.param_out = a.param_out;
  l.grad = a.grad;
  l.m = a.m;
  l.v = a.v;
  l.n = static_cast<size_t>(a.n);
  switch (a.variant) {
    case AdamVariant::kFp32:
      break;
    case AdamVariant::kMixedBf16:
      l.param_out_type = ElementType::kBf16;
      break;
    case AdamVariant::kMixedBf16GradBf16:
      l.param_out_type = ElementType::kBf16;
      l.grad_type = ElementType::kBf16;
      break;
    case AdamVariant::kMixedFp16:
      l.param_out_type = ElementType::kFp16;
      break;
    case AdamVariant::kMixedFp16GradFp16:
      l.param_out_type = ElementType::kFp16;
      l.grad_type = ElementType::kFp16;
      break;
  }
  return l;
}

class CudaDeviceOps final : public DeviceOps {
 public:
  explicit CudaDeviceOps(CudaStream& stream) : stream_(stream) {}

  absl::Status Accumulate(void* acc, const void* add, int64_t n, DType dtype) override {
    ZS_RETURN_IF_ERROR(CheckOperands("Accumulate", n, dtype, {acc, add}));
    if (n == 0) return absl::OkStatus();
    ScopedCudaDevice guard(stream_.ordinal());
    ZS_RETURN_IF_ERROR(guard.status());
    return CudaStatus(kernels::cuda::LaunchAccumulate(acc, add, static_cast<size_t>(n),
                                                      ElementTypeOf(dtype), stream_.handle()),
                      stream_.ordinal(), "LaunchAccumulate");
  }

  absl::Status BlockSumSquares(const void* x, int64_t n, DType dtype, double* blocks) override {
    ZS_RETURN_IF_ERROR(CheckOperands("BlockSumSquares", n, dtype, {x, blocks}));
    if (n == 0) return absl::OkStatus();
    ScopedCudaDevice guard(stream_.ordinal());
    ZS_RETURN_IF_ERROR(guard.status());
    return CudaStatus(
        kernels::cuda::LaunchBlockSumSquares(x, static_cast<size_t>(n), ElementTypeOf(dtype),
                                             blocks, stream_.handle()),
        stream_.ordinal(), "LaunchBlockSumSquares");
  }

  absl::Status Adam(const AdamArgs& args, const kernels::AdamConstants& c) override {
    ZS_RETURN_IF_ERROR(CheckAdamArgs(args));
    if (args.n == 0) return absl::OkStatus();
    ScopedCudaDevice guard(stream_.ordinal());
    ZS_RETURN_IF_ERROR(guard.status());
    return CudaStatus(kernels::cuda::LaunchAdam(LaunchArgsOf(args), c, stream_.handle()),
                      stream_.ordinal(), "LaunchAdam");
  }

  absl::Status QuantizeInt8(const void* x, int64_t n, DType dtype, void* packed) override {
    ZS_RETURN_IF_ERROR(CheckOperands("QuantizeInt8", n, dtype, {x, packed}));
    if (n == 0) return absl::OkStatus();
    ScopedCudaDevice guard(stream_.ordinal());
    ZS_RETURN_IF_ERROR(guard.status());
    return CudaStatus(
        kernels::cuda::LaunchQuantizeInt8(x, static_cast<size_t>(n), ElementTypeOf(dtype), packed,
                                          stream_.handle()),
        stream_.ordinal(), "LaunchQuantizeInt8");
  }

  absl::Status DequantizeInt8(const void* packed, int64_t n, DType dtype, void* out) override {
    ZS_RETURN_IF_ERROR(CheckOperands("DequantizeInt8", n, dtype, {packed, out}));
    if (n == 0) return absl::OkStatus();
    ScopedCudaDevice guard(stream_.ordinal());
    ZS_RETURN_IF_ERROR(guard.status());
    return CudaStatus(
        kernels::cuda::LaunchDequantizeInt8(packed, static_cast<size_t>(n), ElementTypeOf(dtype),
                                            out, stream_.handle()),
        stream_.ordinal(), "LaunchDequantizeInt8");
  }

  Stream& stream() override { return stream_; }

 private:
  CudaStream& stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(Device& device, Stream& stream) {
  const int ordinal = CudaDeviceOrdinal(device);
  CudaStream* cuda = CudaStream::From(stream);
  if (ordinal < 0 || cuda == nullptr || cuda->ordinal() != ordinal) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: CUDA device ops need a CUDA device and one of its streams; create the stream with "
        "this device's CreateStream",
        device.name()));
  }
  return std::unique_ptr<DeviceOps>(std::make_unique<CudaDeviceOps>(*cuda));
}

}  // namespace zeroshard::internal
