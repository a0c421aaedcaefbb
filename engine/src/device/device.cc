#include "zeroshard/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace zeroshard {

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (device_ != nullptr) device_->Free(*this);
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    category_ = other.category_;
    name_ = std::move(other.name_);
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (device_ != nullptr) device_->Free(*this);
}

absl::StatusOr<int> CudaOrdinal(const Device& device) {
  const std::string name = device.name();
  absl::string_view digits = name;
  int ordinal = -1;
  if (device.kind() != DeviceKind::kCuda || !absl::ConsumePrefix(&digits, "cuda:") ||
      !absl::SimpleAtoi(digits, &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("device '%s' is not a CUDA device named cuda:N", name));
  }
  return ordinal;
}

absl::StatusOr<DeviceBuffer> Device::Allocate(int64_t bytes, MemoryCategory category,
                                              std::string name) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot allocate %d bytes for '%s'", this->name(), bytes, name));
  }
  void* ptr = nullptr;
  if (bytes > 0) {
    absl::StatusOr<void*> raw = RawAllocate(bytes);
    if (!raw.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%s: allocating %d bytes for '%s' (%s) failed: %s; %d bytes are in use",
                          this->name(), bytes, name, MemoryCategoryName(category),
                          raw.status().message(), ledger_.current_total()));
    }
    ptr = *raw;
  }
  ledger_.Add(category, bytes);
  DeviceBuffer buffer;
  buffer.device_ = this;
  buffer.data_ = ptr;
  buffer.bytes_ = bytes;
  buffer.category_ = category;
  buffer.name_ = std::move(name);
  return buffer;
}

void Device::Free(DeviceBuffer& buffer) {
  if (buffer.data_ != nullptr) RawFree(buffer.data_);
  ledger_.Remove(buffer.category_, buffer.bytes_);
  buffer.device_ = nullptr;
  buffer.data_ = nullptr;
  buffer.bytes_ = 0;
}

}  // namespace zeroshard
