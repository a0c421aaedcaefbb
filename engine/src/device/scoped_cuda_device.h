// ScopedCudaDevice: the device layer's one way to make a GPU current on the
// calling thread. The nccl communicator (engine/src/comm) includes this
// header, and only this one of the CUDA device's internals: it needs the
// GPU current while it creates and drives its NCCL communicator, nothing of
// the device's streams or memory. Built only with CUDA (zs_device_cuda).
#ifndef ZEROSHARD_DEVICE_SCOPED_CUDA_DEVICE_H_
#define ZEROSHARD_DEVICE_SCOPED_CUDA_DEVICE_H_

#include "absl/status/status.h"

namespace zeroshard::internal {

// Makes GPU `ordinal` current on the calling thread for the guard's life and
// restores the previous device afterwards, so that a library call does not
// change the caller's current device.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int ordinal);
  ~ScopedCudaDevice();
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;
  // The result of switching to `ordinal`.
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_DEVICE_SCOPED_CUDA_DEVICE_H_
