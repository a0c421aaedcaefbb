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
  // True when data() pointers may be dereferenced on the host.
  virtual bool host_accessible() const = 0;

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

}  // namespace zeroshard

#endif  // ZEROSHARD_DEVICE_H_
