// The CUDA device's internals, shared by cuda_device.cc and
// cuda_device_ops.cc: the Stream behind a cudaStream_t, the Device's
// ordinal, and the one conversion of a CUDA return code into a Status.
// Other layers (the nccl communicator) use the device layer's interface,
// zeroshard/device.h and scoped_cuda_device.h, not this header.
// Built only when zeroshard is built with CUDA (zs_device_cuda).
#ifndef ZEROSHARD_DEVICE_CUDA_DEVICE_H_
#define ZEROSHARD_DEVICE_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "engine/src/device/scoped_cuda_device.h"
#include "zeroshard/device.h"

namespace zeroshard::internal {

// OK for cudaSuccess; otherwise Internal naming the device, the call and
// CUDA's own name and text for the code, e.g.
// "cuda:1: cudaMemcpyAsync failed: cudaErrorInvalidValue (invalid argument)".
// Clears the thread's last CUDA error, so that a later launch check does not
// report this one again.
absl::Status CudaStatus(cudaError_t error, int ordinal, const char* call);

// A non-blocking CUDA stream of GPU `ordinal` (it does not synchronize with
// the legacy default stream).
class CudaStream final : public Stream {
 public:
  // Creates the stream; the handle is null when creation failed (see Create).
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(int ordinal);
  ~CudaStream() override;

  absl::Status Synchronize() override;
  void* native_handle() const override { return handle_; }

  cudaStream_t handle() const { return handle_; }
  int ordinal() const { return ordinal_; }

  // The CudaStream behind `stream`, or null when it is another kind.
  static CudaStream* From(Stream& stream) { return dynamic_cast<CudaStream*>(&stream); }

 private:
  CudaStream(int ordinal, cudaStream_t handle) : ordinal_(ordinal), handle_(handle) {}
  int ordinal_;
  cudaStream_t handle_;
};

// The ordinal of a CUDA device (CreateCudaDevice), -1 for any other Device.
int CudaDeviceOrdinal(const Device& device);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_DEVICE_CUDA_DEVICE_H_
