// Device memory with a ledger: every byte the engine allocates is recorded
// under a MemoryCategory, with current and peak bytes per category.
#ifndef ZEROSHARD_DEVICE_H_
#define ZEROSHARD_DEVICE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "zeroshard/memory_category.h"

namespace zeroshard {

// Thread-safe record of live and peak bytes, per category and in total.
// It counts the bytes of every DeviceBuffer its Device hands out (the
// requested size, not allocator rounding) from Allocate until the buffer is
// destroyed; memory a device uses outside Allocate (a CUDA context, an
// allocator's slack) is not in it.
class MemoryLedger {
 public:
  // Called by Device; `bytes` >= 0.
  void Add(MemoryCategory category, int64_t bytes);
  void Remove(MemoryCategory category, int64_t bytes);

  int64_t current(MemoryCategory category) const;
  int64_t peak(MemoryCategory category) const;
  int64_t current_total() const;
  // Peak of the sum over categories (not the sum of per-category peaks).
  int64_t peak_total() const;
  // Sum of current() over the model-state categories.
  int64_t current_model_states() const;

 private:
  mutable std::mutex mu_;
  std::array<int64_t, kNumMemoryCategories> current_{};
  std::array<int64_t, kNumMemoryCategories> peak_{};
  int64_t current_total_ = 0;
  int64_t peak_total_ = 0;
};

class Device;

// Where a Device's memory lives.
enum class DeviceKind { kCpu, kCuda };

// An ordered work queue of a Device. Work enqueued on one stream runs in
// the order it was enqueued; work on two streams is ordered only through an
// Event. The host does not wait for enqueued work unless it calls
// Synchronize (or an Event's). A stream is used by one thread at a time.
//
// CPU streams run their work on a thread of their own, so that code written
// for a CUDA device (enqueue, record, wait) means the same on the CPU and the
// CPU tests check its ordering.
class Stream {
 public:
  virtual ~Stream() = default;
  // Blocks until everything enqueued so far has finished. Returns the first
  // failure of enqueued work since the previous Synchronize (Internal for a
  // CUDA error, with the call that failed); later work after a failure is
  // skipped on the CPU and undefined on CUDA.
  virtual absl::Status Synchronize() = 0;
  // The backend's handle: the cudaStream_t of a CUDA stream, null on the CPU.
  virtual void* native_handle() const = 0;
};

// A point in a stream's work.
class Event {
 public:
  virtual ~Event() = default;
  // Marks the work enqueued on `stream` so far.
  virtual absl::Status Record(Stream& stream) = 0;
  // Blocks the host until the recorded work has finished (at once if the
  // event was never recorded).
  virtual absl::Status Synchronize() = 0;
  // Work enqueued on `stream` after this call starts only after the recorded
  // work has finished; the host does not wait.
  virtual absl::Status MakeStreamWait(Stream& stream) = 0;
};

// An owned, ledgered allocation. Move-only; frees itself (and updates the
// ledger) on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  int64_t bytes() const { return bytes_; }
  MemoryCategory category() const { return category_; }
  const std::string& name() const { return name_; }

 private:
  friend class Device;
  Device* device_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  MemoryCategory category_ = MemoryCategory::kWorkspace;
  std::string name_;
};

// One rank's memory. The CPU device hands out 64-byte-aligned, zero-filled
// host memory. Allocate and buffer destruction are thread-safe (the ledger
// locks); a Device must outlive every buffer it handed out.
class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  virtual DeviceKind kind() const = 0;
  // True when data() pointers may be dereferenced on the host.
  virtual bool host_accessible() const = 0;

  // A new ordered work queue (a CUDA stream; a worker thread on the CPU).
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;
  // Enqueues a copy of `bytes` on `stream`. `dst` and `src` may each be host
  // memory or this device's memory; they must not overlap. The host memory
  // must stay valid until the copy has finished (Synchronize).
  virtual absl::Status CopyAsync(void* dst, const void* src, int64_t bytes, Stream& stream) = 0;
  // Enqueues zero-filling `bytes` of this device's memory at `dst`.
  virtual absl::Status ZeroAsync(void* dst, int64_t bytes, Stream& stream) = 0;

  // Allocates `bytes` (zero-filled) and records them under `category`.
  // `name` is for error messages and reports. ResourceExhausted on failure.
  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, MemoryCategory category, std::string name);

  MemoryLedger& ledger() { return ledger_; }
  const MemoryLedger& ledger() const { return ledger_; }

 protected:
  virtual absl::StatusOr<void*> RawAllocate(int64_t bytes) = 0;
  virtual void RawFree(void* ptr) = 0;

 private:
  friend class DeviceBuffer;
  void Free(DeviceBuffer& buffer);
  MemoryLedger ledger_;
};

// Host memory device.
std::unique_ptr<Device> CreateCpuDevice();

// The engine's host tier (TrainSpec::offload) beside `device`: host memory
// aligned to 4096 bytes (direct I/O), with CPU streams, events and ops.
// Beside a CUDA device the memory is pinned (cudaHostAlloc), so that the
// copies to and from the GPU run asynchronously on their stream.
absl::StatusOr<std::unique_ptr<Device>> CreateHostTierDevice(const Device& device);

// GPU `ordinal`'s memory through the CUDA runtime (cudaMalloc, never managed
// memory). NotFound when there is no such GPU, Unimplemented when zeroshard
// was built without CUDA.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal);

// How many CUDA devices this process sees: 0 without a usable driver, and in
// a build without CUDA.
int CudaDeviceCount();

// The GPU ordinal of a CUDA device (its name "cuda:N"); InvalidArgument,
// naming the device, for any other.
absl::StatusOr<int> CudaOrdinal(const Device& device);

}  // namespace zeroshard

#endif  // ZEROSHARD_DEVICE_H_
