// The CUDA device: cudaMalloc'ed memory (never managed memory), non-blocking
// streams, timing-free events. Every CUDA return code becomes a Status that
// names the device and the call.
#include "engine/src/device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "engine/src/device/host_tier.h"
#include "zeroshard/device.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {

absl::Status CudaStatus(cudaError_t error, int ordinal, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Consume the error: the runtime also keeps it as the thread's last error,
  // and the next launch's cudaGetLastError() check must not report it again.
  cudaGetLastError();
  return absl::InternalError(absl::StrFormat("cuda:%d: %s failed: %s (%s)", ordinal, call,
                                             cudaGetErrorName(error), cudaGetErrorString(error)));
}

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(int ordinal) {
  ScopedCudaDevice guard(ordinal);
  ZS_RETURN_IF_ERROR(guard.status());
  cudaStream_t handle = nullptr;
  ZS_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking), ordinal,
                                "cudaStreamCreateWithFlags"));
  return std::unique_ptr<CudaStream>(new CudaStream(ordinal, handle));
}

CudaStream::~CudaStream() {
  // cudaStreamDestroy lets enqueued work finish; a failure cannot be
  // reported from here (it would have surfaced at Synchronize).
  ScopedCudaDevice guard(ordinal_);
  cudaStreamDestroy(handle_);
}

absl::Status CudaStream::Synchronize() {
  return CudaStatus(cudaStreamSynchronize(handle_), ordinal_, "cudaStreamSynchronize");
}

namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t handle) : ordinal_(ordinal), handle_(handle) {}
  ~CudaEvent() override {
    ScopedCudaDevice guard(ordinal_);
    cudaEventDestroy(handle_);
  }

  absl::Status Record(Stream& stream) override {
    ZS_ASSIGN_OR_RETURN(CudaStream * cuda, OwnStream(stream, "Record"));
    return CudaStatus(cudaEventRecord(handle_, cuda->handle()), ordinal_, "cudaEventRecord");
  }

  // An event never recorded completes at once (CUDA's own rule).
  absl::Status Synchronize() override {
    return CudaStatus(cudaEventSynchronize(handle_), ordinal_, "cudaEventSynchronize");
  }

  absl::Status MakeStreamWait(Stream& stream) override {
    ZS_ASSIGN_OR_RETURN(CudaStream * cuda, OwnStream(stream, "MakeStreamWait"));
    return CudaStatus(cudaStreamWaitEvent(cuda->handle(), handle_, 0), ordinal_,
                      "cudaStreamWaitEvent");
  }

 private:
  absl::StatusOr<CudaStream*> OwnStream(Stream& stream, const char* op) const {
    CudaStream* cuda = CudaStream::From(stream);
    if (cuda == nullptr || cuda->ordinal() != ordinal_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cuda:%d: Event::%s on a stream of another device; use a stream of cuda:%d", ordinal_, op,
          ordinal_));
    }
    return cuda;
  }

  int ordinal_;
  cudaEvent_t handle_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}

  std::string name() const override { return absl::StrFormat("cuda:%d", ordinal_); }
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  bool host_accessible() const override { return false; }
  int ordinal() const { return ordinal_; }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> stream, CudaStream::Create(ordinal_));
    return std::unique_ptr<Stream>(std::move(stream));
  }

  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    ScopedCudaDevice guard(ordinal_);
    ZS_RETURN_IF_ERROR(guard.status());
    cudaEvent_t handle = nullptr;
    // Events only order work here; timing would cost a timestamp per record.
    ZS_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&handle, cudaEventDisableTiming),
                                  ordinal_, "cudaEventCreateWithFlags"));
    return std::unique_ptr<Event>(std::make_unique<CudaEvent>(ordinal_, handle));
  }

  absl::Status CopyAsync(void* dst, const void* src, int64_t bytes, Stream& stream) override {
    ZS_ASSIGN_OR_RETURN(CudaStream * cuda, OwnStream(stream, "CopyAsync"));
    if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: CopyAsync of %d bytes from %p to %p", name(), bytes, src, dst));
    }
    if (bytes == 0) return absl::OkStatus();
    ScopedCudaDevice guard(ordinal_);
    ZS_RETURN_IF_ERROR(guard.status());
    // cudaMemcpyDefault: the runtime tells host from device pointers (unified
    // addressing), so one call serves H2D, D2H and D2D.
    return CudaStatus(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, cuda->handle()),
        ordinal_, "cudaMemcpyAsync");
  }

  absl::Status ZeroAsync(void* dst, int64_t bytes, Stream& stream) override {
    ZS_ASSIGN_OR_RETURN(CudaStream * cuda, OwnStream(stream, "ZeroAsync"));
    if (bytes < 0 || (bytes > 0 && dst == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: ZeroAsync of %d bytes at %p", name(), bytes, dst));
    }
    if (bytes == 0) return absl::OkStatus();
    ScopedCudaDevice guard(ordinal_);
    ZS_RETURN_IF_ERROR(guard.status());
    return CudaStatus(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), cuda->handle()), ordinal_,
                      "cudaMemsetAsync");
  }

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t bytes) override {
    ScopedCudaDevice guard(ordinal_);
    ZS_RETURN_IF_ERROR(guard.status());
    void* ptr = nullptr;
    ZS_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&ptr, static_cast<size_t>(bytes)), ordinal_, "cudaMalloc"));
    // cudaMemset runs on the legacy default stream, which the device's
    // non-blocking streams do not wait for: finish it here so the buffer is
    // zero before any stream can touch it.
    absl::Status zeroed =
        CudaStatus(cudaMemset(ptr, 0, static_cast<size_t>(bytes)), ordinal_, "cudaMemset");
    if (zeroed.ok()) {
      zeroed = CudaStatus(cudaStreamSynchronize(nullptr), ordinal_, "cudaStreamSynchronize");
    }
    if (!zeroed.ok()) {
      cudaFree(ptr);
      return zeroed;
    }
    return ptr;
  }

  void RawFree(void* ptr) override {
    // cudaFree waits for the device's work; a failure here (a context lost
    // to an earlier error) was already reported by that error's call.
    ScopedCudaDevice guard(ordinal_);
    cudaFree(ptr);
  }

 private:
  absl::StatusOr<CudaStream*> OwnStream(Stream& stream, const char* op) const {
    CudaStream* cuda = CudaStream::From(stream);
    if (cuda == nullptr || cuda->ordinal() != ordinal_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s on a stream of another device; use one of this device's", name(), op));
    }
    return cuda;
  }

  int ordinal_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreatePinnedHostTierDevice(const Device& device) {
  const int ordinal = CudaDeviceOrdinal(device);
  auto allocate = [ordinal](int64_t bytes) -> absl::StatusOr<void*> {
    void* ptr = nullptr;
    // Portable: pinned for every context, so any GPU's copy engine may use it.
    ZS_RETURN_IF_ERROR(CudaStatus(
        cudaHostAlloc(&ptr, static_cast<size_t>(bytes > 0 ? bytes : 1), cudaHostAllocPortable),
        ordinal, "cudaHostAlloc"));
    return ptr;
  };
  auto release = [](void* ptr) { cudaFreeHost(ptr); };
  return CreateHostDevice("pinned-host", allocate, release);
}

int CudaDeviceOrdinal(const Device& device) {
  const auto* cuda = dynamic_cast<const CudaDevice*>(&device);
  return cuda != nullptr ? cuda->ordinal() : -1;
}

}  // namespace internal

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: not an error for later calls
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // consumed here, as CudaStatus does
    // No driver, no GPU, or a driver older than the runtime: no device.
    return absl::NotFoundError(absl::StrFormat(
        "cuda:%d: no CUDA device is usable (cudaGetDeviceCount: %s (%s)); check the driver and "
        "CUDA_VISIBLE_DEVICES, or use the CPU device",
        ordinal, cudaGetErrorName(error), cudaGetErrorString(error)));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::NotFoundError(
        count == 0 ? absl::StrFormat("cuda:%d: no such GPU; no CUDA device is visible", ordinal)
                   : absl::StrFormat("cuda:%d: no such GPU; %d CUDA device(s) visible, "
                                     "ordinals 0..%d",
                                     ordinal, count, count - 1));
  }
  return std::unique_ptr<Device>(std::make_unique<internal::CudaDevice>(ordinal));
}

}  // namespace zeroshard
