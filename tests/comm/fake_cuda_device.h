// A Device that says it is a CUDA device, with a chosen name, for tests of
// the nccl backend's argument checks: it allocates nothing and runs nothing.
#ifndef ZEROSHARD_TESTS_COMM_FAKE_CUDA_DEVICE_H_
#define ZEROSHARD_TESTS_COMM_FAKE_CUDA_DEVICE_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "zeroshard/device.h"

namespace zeroshard::testing_comm {

class FakeCudaDevice : public Device {
 public:
  explicit FakeCudaDevice(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  bool host_accessible() const override { return false; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override { return Unsupported(); }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override { return Unsupported(); }
  absl::Status CopyAsync(void*, const void*, int64_t, Stream&) override { return Unsupported(); }
  absl::Status ZeroAsync(void*, int64_t, Stream&) override { return Unsupported(); }

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t) override { return Unsupported(); }
  void RawFree(void*) override {}

 private:
  static absl::Status Unsupported() {
    return absl::UnimplementedError("FakeCudaDevice: a test double that only has a name");
  }
  std::string name_;
};

}  // namespace zeroshard::testing_comm

#endif  // ZEROSHARD_TESTS_COMM_FAKE_CUDA_DEVICE_H_
