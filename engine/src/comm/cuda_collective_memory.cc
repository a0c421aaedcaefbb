// CollectiveMemory on a CUDA device: the device's own copies on a stream of
// the rank's, and the rank-order sum kernel (kernels/cuda) on that stream.
#include <cuda_runtime_api.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/comm/collective_memory.h"
#include "engine/src/comm/reduce.h"
#include "kernels/cuda/sum_in_rank_order.cuh"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

class CudaCollectiveMemory final : public CollectiveMemory {
 public:
  CudaCollectiveMemory(Device& device, int ordinal) : device_(device), ordinal_(ordinal) {}

  absl::Status Copy(void* dst, const void* src, int64_t bytes) override {
    ZS_RETURN_IF_ERROR(EnsureStream());
    return device_.CopyAsync(dst, src, bytes, *stream_);
  }

  absl::Status Sum(const void* const* inputs, int num_inputs, void* const* outputs, int num_outputs,
                   int64_t count, DType dtype) override {
    kernels::SumType type;
    if (!ToSumType(dtype, &type)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("no sum is defined for dtype %s", DTypeName(dtype)));
    }
    ZS_RETURN_IF_ERROR(EnsureStream());
    const cudaError_t err = kernels::cuda::LaunchSumInRankOrder(
        inputs, num_inputs, outputs, num_outputs, static_cast<size_t>(count), type,
        static_cast<cudaStream_t>(stream_->native_handle()));
    if (err != cudaSuccess) {
      return absl::InternalError(absl::StrFormat(
          "%s: the rank-order sum of %d inputs (%d %s) "
          "failed to launch: %s",
          device_.name(), num_inputs, count, DTypeName(dtype), cudaGetErrorString(err)));
    }
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    if (stream_ == nullptr) return absl::OkStatus();
    return stream_->Synchronize();
  }

 private:
  // The stream is made on the first use, on the progress thread that uses it
  // (with the device current there).
  absl::Status EnsureStream() {
    const cudaError_t err = cudaSetDevice(ordinal_);
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky: leave no trace for the next launch check
      return absl::InternalError(
          absl::StrFormat("cudaSetDevice(%d): %s", ordinal_, cudaGetErrorString(err)));
    }
    if (stream_ != nullptr) return absl::OkStatus();
    ZS_ASSIGN_OR_RETURN(stream_, device_.CreateStream());
    return absl::OkStatus();
  }

  Device& device_;
  const int ordinal_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CollectiveMemory>> CreateCudaCollectiveMemory(Device& device) {
  const absl::StatusOr<int> ordinal = CudaOrdinal(device);
  if (!ordinal.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ordinal.status().message(), "; a local group moves host or CUDA memory"));
  }
  return std::unique_ptr<CollectiveMemory>(
      std::make_unique<CudaCollectiveMemory>(device, *ordinal));
}

}  // namespace zeroshard::internal
