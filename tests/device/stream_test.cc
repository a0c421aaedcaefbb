// The CPU device's streams and events: enqueue does not wait, work runs in
// order, events order two streams, failures reach Synchronize, and the
// asynchronous copies and fills land.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/src/device/cpu_stream.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/device.h"

namespace zeroshard {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// A stream of no device (to check that devices refuse foreign streams).
class ForeignStream final : public Stream {
 public:
  absl::Status Synchronize() override { return absl::OkStatus(); }
  void* native_handle() const override { return nullptr; }
};

// Enqueue hands the work over and returns: the work below can only finish
// after the host, past Enqueue, opens its gate.
TEST(CpuStreamTest, EnqueueDoesNotWaitForTheWork) {
  internal::CpuStream stream;
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  stream.Enqueue([opened] {
    if (opened.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      return absl::DeadlineExceededError("the host never opened the gate: Enqueue waited");
    }
    return absl::OkStatus();
  });
  gate.set_value();
  EXPECT_TRUE(stream.Synchronize().ok());
}

// The first failure reaches the next Synchronize; the work after it is
// skipped; the stream is usable again afterwards.
TEST(CpuStreamTest, AFailureReachesSynchronizeAndLaterWorkIsSkipped) {
  internal::CpuStream stream;
  int ran = 0;
  stream.Enqueue([&ran] {
    ++ran;
    return absl::OkStatus();
  });
  stream.Enqueue([] { return absl::InternalError("kernel 2 failed"); });
  stream.Enqueue([&ran] {
    ++ran;
    return absl::OkStatus();
  });
  const absl::Status status = stream.Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "kernel 2 failed");
  EXPECT_EQ(ran, 1);
  stream.Enqueue([&ran] {
    ++ran;
    return absl::OkStatus();
  });
  EXPECT_TRUE(stream.Synchronize().ok());
  EXPECT_EQ(ran, 2);
}

TEST(CpuStreamTest, WorkRunsInOrder) {
  auto device = CreateCpuDevice();
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto blocker = device->CreateStream();
  ASSERT_TRUE(blocker.ok());
  std::mt19937_64 rng(Seed());
  // A chain of copies through 16 buffers: buffer k+1 = buffer k, in order.
  // If two ran out of order, the last buffer would not hold the first's data.
  constexpr int kHops = 16;
  constexpr int64_t kBytes = 1 << 20;
  std::vector<std::vector<uint8_t>> hop(kHops, std::vector<uint8_t>(kBytes, 0));
  for (auto& b : hop[0]) b = static_cast<uint8_t>(rng());
  for (int k = 0; k + 1 < kHops; ++k) {
    ASSERT_TRUE(device->CopyAsync(hop[k + 1].data(), hop[k].data(), kBytes, **stream).ok());
  }
  ASSERT_TRUE((*stream)->Synchronize().ok());
  EXPECT_EQ(hop[kHops - 1], hop[0]) << SeedTrace();
}

// Work on stream B that waits for an event recorded on stream A sees A's
// writes, even when A is slow; without the wait it would not.
TEST(CpuStreamTest, AnEventOrdersTwoStreams) {
  auto device = CreateCpuDevice();
  auto a = device->CreateStream();
  auto b = device->CreateStream();
  auto gate = device->CreateStream();
  auto event = device->CreateEvent();
  auto gate_event = device->CreateEvent();
  ASSERT_TRUE(a.ok() && b.ok() && gate.ok() && event.ok() && gate_event.ok());
  std::mt19937_64 rng(Seed());
  constexpr int64_t kBytes = 4 << 20;
  std::vector<uint8_t> source(kBytes), scratch(kBytes), middle(kBytes, 0), out(kBytes, 0);
  for (auto& x : source) x = static_cast<uint8_t>(rng() | 1);  // never zero
  // Stream A: busy work first (so that A is still busy long after B's work
  // is enqueued), then source -> middle.
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(device->CopyAsync(scratch.data(), source.data(), kBytes, **a).ok());
  }
  ASSERT_TRUE(device->CopyAsync(middle.data(), source.data(), kBytes, **a).ok());
  ASSERT_TRUE((*event)->Record(**a).ok());
  ASSERT_TRUE((*event)->MakeStreamWait(**b).ok());
  // Stream B: middle -> out, after A's copies.
  ASSERT_TRUE(device->CopyAsync(out.data(), middle.data(), kBytes, **b).ok());
  ASSERT_TRUE((*b)->Synchronize().ok());
  EXPECT_EQ(out, source) << "B's copy ran before A's finished; " << SeedTrace();
  ASSERT_TRUE((*a)->Synchronize().ok());
  // Event::Synchronize waits for the recorded work only.
  ASSERT_TRUE((*event)->Synchronize().ok());
  // An event never recorded: nothing to wait for.
  auto fresh = device->CreateEvent();
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE((*fresh)->Synchronize().ok());
  EXPECT_TRUE((*fresh)->MakeStreamWait(**b).ok());
}

TEST(CpuStreamTest, CopiesAndFillsLandAndBadArgumentsAreRefused) {
  auto device = CreateCpuDevice();
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto buffer = device->Allocate(4096, MemoryCategory::kWorkspace, "buf");
  ASSERT_TRUE(buffer.ok());
  std::mt19937_64 rng(Seed());
  std::vector<uint8_t> host(4096), back(4096, 0);
  for (auto& x : host) x = static_cast<uint8_t>(rng() | 0x80);
  ASSERT_TRUE(device->CopyAsync(buffer->data(), host.data(), 4096, **stream).ok());
  ASSERT_TRUE(device->ZeroAsync(buffer->as<uint8_t>() + 100, 200, **stream).ok());
  ASSERT_TRUE(device->CopyAsync(back.data(), buffer->data(), 4096, **stream).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  for (int i = 0; i < 4096; ++i) {
    const uint8_t expected = (i >= 100 && i < 300) ? 0 : host[i];
    ASSERT_EQ(back[i], expected) << "byte " << i << "; " << SeedTrace();
  }
  EXPECT_EQ(device->CopyAsync(back.data(), nullptr, 16, **stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->ZeroAsync(back.data(), -1, **stream).code(),
            absl::StatusCode::kInvalidArgument);
  ForeignStream foreign;
  const absl::Status wrong = device->CopyAsync(back.data(), host.data(), 16, foreign);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("another device"), std::string::npos) << wrong;
  auto event = device->CreateEvent();
  ASSERT_TRUE(event.ok());
  EXPECT_EQ((*event)->Record(foreign).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuStreamTest, TheDestructorFinishesQueuedWork) {
  auto device = CreateCpuDevice();
  std::vector<uint8_t> source(8 << 20, 7), out(8 << 20, 0);
  {
    auto stream = device->CreateStream();
    ASSERT_TRUE(stream.ok());
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(device->CopyAsync(out.data(), source.data(), 8 << 20, **stream).ok());
    }
  }
  EXPECT_EQ(out, source);
}

// A device of another kind whose name looks like a GPU's.
class NamedDevice final : public Device {
 public:
  NamedDevice(std::string name, DeviceKind kind) : name_(std::move(name)), kind_(kind) {}
  std::string name() const override { return name_; }
  DeviceKind kind() const override { return kind_; }
  bool host_accessible() const override { return true; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return absl::UnimplementedError("not needed");
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return absl::UnimplementedError("not needed");
  }
  absl::Status CopyAsync(void*, const void*, int64_t, Stream&) override {
    return absl::UnimplementedError("not needed");
  }
  absl::Status ZeroAsync(void*, int64_t, Stream&) override {
    return absl::UnimplementedError("not needed");
  }

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t) override {
    return absl::UnimplementedError("not needed");
  }
  void RawFree(void*) override {}

 private:
  std::string name_;
  DeviceKind kind_;
};

TEST(CudaOrdinalTest, ReadsTheOrdinalOfACudaDeviceOnly) {
  auto ordinal = CudaOrdinal(NamedDevice("cuda:12", DeviceKind::kCuda));
  ASSERT_TRUE(ordinal.ok()) << ordinal.status();
  EXPECT_EQ(*ordinal, 12);
  for (const auto& [name, kind] :
       std::vector<std::pair<std::string, DeviceKind>>{{"cuda:3", DeviceKind::kCpu},
                                                       {"cuda:", DeviceKind::kCuda},
                                                       {"cuda:-1", DeviceKind::kCuda},
                                                       {"gpu:0", DeviceKind::kCuda},
                                                       {"cuda:1x", DeviceKind::kCuda}}) {
    const auto bad = CudaOrdinal(NamedDevice(name, kind));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(bad.status().message().find(name), std::string::npos) << bad.status();
  }
  EXPECT_EQ(CudaOrdinal(*CreateCpuDevice()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, ThereIsNoCudaDeviceHere) {
  // This build machine has no GPU (or the build has no CUDA): a clear error,
  // never a crash.
  auto cuda = CreateCudaDevice(0);
  if (cuda.ok()) GTEST_SKIP() << "a CUDA device is present: " << (*cuda)->name();
  EXPECT_EQ(CudaDeviceCount(), 0);
  EXPECT_TRUE(cuda.status().code() == absl::StatusCode::kNotFound ||
              cuda.status().code() == absl::StatusCode::kUnimplemented)
      << cuda.status();
  EXPECT_NE(cuda.status().message().find("cuda"), std::string::npos) << cuda.status();
}

}  // namespace
}  // namespace zeroshard
