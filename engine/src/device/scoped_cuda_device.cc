// ScopedCudaDevice (scoped_cuda_device.h).
#include "engine/src/device/scoped_cuda_device.h"

#include <cuda_runtime_api.h>

#include "engine/src/device/cuda_device.h"

namespace zeroshard::internal {

ScopedCudaDevice::ScopedCudaDevice(int ordinal) {
  status_ = CudaStatus(cudaGetDevice(&previous_), ordinal, "cudaGetDevice");
  if (status_.ok() && previous_ != ordinal) {
    status_ = CudaStatus(cudaSetDevice(ordinal), ordinal, "cudaSetDevice");
    if (!status_.ok()) previous_ = -1;
  } else {
    previous_ = -1;  // nothing to restore
  }
}

ScopedCudaDevice::~ScopedCudaDevice() {
  // Best effort: a destructor cannot report, and the device was current a
  // moment ago.
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace zeroshard::internal
