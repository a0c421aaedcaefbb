// The CUDA device on a GPU: zero-filled ledgered allocations, copies in
// every direction, stream ordering through events, and its errors. Labelled
// `gpu`; without a device every test that needs one skips visibly.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine/src/device/device_ops.h"
#include "tests/cuda_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/device.h"

namespace zeroshard {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

std::unique_ptr<Device> CudaDeviceOrFail() {
  auto device = CreateCudaDevice(0);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(*device) : nullptr;
}

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() | 1);  // never zero
  return bytes;
}

TEST(CudaDeviceTest, NoSuchOrdinalIsNotFound) {
  // Holds with or without a GPU: no machine has 1000 of them.
  auto device = CreateCudaDevice(999);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kNotFound) << device.status();
  EXPECT_NE(device.status().message().find("cuda:999"), absl::string_view::npos) << device.status();
}

TEST(CudaDeviceTest, AllocationsAreZeroFilledAndLedgered) {
  ZS_SKIP_WITHOUT_CUDA_DEVICE("CUDA device allocation");
  std::unique_ptr<Device> device = CudaDeviceOrFail();
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->name(), "cuda:0");
  EXPECT_EQ(device->kind(), DeviceKind::kCuda);
  EXPECT_FALSE(device->host_accessible());
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_NE((*stream)->native_handle(), nullptr);
  const int64_t bytes = 1000003;
  {
    auto a = device->Allocate(bytes, MemoryCategory::kOptimizerState, "m");
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = device->Allocate(4096, MemoryCategory::kGradients, "grads");
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(device->ledger().current(MemoryCategory::kOptimizerState), bytes);
    EXPECT_EQ(device->ledger().current(MemoryCategory::kGradients), 4096);
    EXPECT_EQ(device->ledger().current_total(), bytes + 4096);
    std::vector<uint8_t> host(bytes, 0xab);
    ASSERT_TRUE(device->CopyAsync(host.data(), a->data(), bytes, **stream).ok());
    ASSERT_TRUE((*stream)->Synchronize().ok());
    for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(host[i], 0) << "byte " << i << " not zeroed";
  }
  EXPECT_EQ(device->ledger().current_total(), 0);
  EXPECT_EQ(device->ledger().peak_total(), bytes + 4096);
}

TEST(CudaDeviceTest, CopiesRoundTripAndZeroAsyncClearsARange) {
  ZS_SKIP_WITHOUT_CUDA_DEVICE("CUDA device copies");
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  std::unique_ptr<Device> device = CudaDeviceOrFail();
  ASSERT_NE(device, nullptr);
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const int64_t bytes = (int64_t{1} << 22) + 7;
  const std::vector<uint8_t> source = RandomBytes(rng, bytes);
  auto a = device->Allocate(bytes, MemoryCategory::kParams, "a");
  auto b = device->Allocate(bytes, MemoryCategory::kParams, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  Stream& s = **stream;
  ASSERT_TRUE(device->CopyAsync(a->data(), source.data(), bytes, s).ok());  // H2D
  ASSERT_TRUE(device->CopyAsync(b->data(), a->data(), bytes, s).ok());      // D2D
  // Clear an unaligned range in the middle of b.
  const int64_t zero_begin = 1001, zero_bytes = 333333;
  ASSERT_TRUE(device->ZeroAsync(b->as<uint8_t>() + zero_begin, zero_bytes, s).ok());
  std::vector<uint8_t> back(bytes, 0);
  ASSERT_TRUE(device->CopyAsync(back.data(), b->data(), bytes, s).ok());  // D2H
  ASSERT_TRUE(s.Synchronize().ok());
  for (int64_t i = 0; i < bytes; ++i) {
    const bool zeroed = i >= zero_begin && i < zero_begin + zero_bytes;
    ASSERT_EQ(back[i], zeroed ? 0 : source[i]) << "byte " << i;
  }
  // Negative sizes and foreign streams are argument errors, not CUDA calls.
  EXPECT_EQ(device->CopyAsync(back.data(), a->data(), -1, s).code(),
            absl::StatusCode::kInvalidArgument);
  auto cpu = CreateCpuDevice();
  auto cpu_stream = cpu->CreateStream();
  ASSERT_TRUE(cpu_stream.ok());
  const absl::Status foreign = device->ZeroAsync(a->data(), 16, **cpu_stream);
  EXPECT_EQ(foreign.code(), absl::StatusCode::kInvalidArgument) << foreign;
}

// Work on stream 1 that takes a while (50 accumulations over 64 MiB), an
// event, and stream 2 made to wait for it before copying the result out. If
// MakeStreamWait did not order the streams, stream 2 would copy a partial sum.
TEST(CudaDeviceTest, EventsOrderWorkAcrossStreams) {
  ZS_SKIP_WITHOUT_CUDA_DEVICE("CUDA stream ordering");
  std::unique_ptr<Device> device = CudaDeviceOrFail();
  ASSERT_NE(device, nullptr);
  auto s1 = device->CreateStream();
  auto s2 = device->CreateStream();
  auto event = device->CreateEvent();
  ASSERT_TRUE(s1.ok() && s2.ok() && event.ok());
  // Never recorded: completes at once.
  EXPECT_TRUE((*event)->Synchronize().ok());
  auto ops = internal::CreateDeviceOps(*device, **s1);
  ASSERT_TRUE(ops.ok()) << ops.status();

  const int64_t n = int64_t{1} << 24;
  const int kRounds = 50;
  const std::vector<float> ones(n, 1.0f);
  auto sum = device->Allocate(n * 4, MemoryCategory::kGradients, "sum");
  auto term = device->Allocate(n * 4, MemoryCategory::kGradients, "term");
  auto copy = device->Allocate(n * 4, MemoryCategory::kGradients, "copy");
  ASSERT_TRUE(sum.ok() && term.ok() && copy.ok());
  ASSERT_TRUE(device->CopyAsync(term->data(), ones.data(), n * 4, **s1).ok());
  ASSERT_TRUE(device->CopyAsync(sum->data(), ones.data(), n * 4, **s1).ok());
  for (int r = 0; r < kRounds; ++r) {
    ASSERT_TRUE((*ops)->Accumulate(sum->data(), term->data(), n, DType::kFloat32).ok());
  }
  ASSERT_TRUE((*event)->Record(**s1).ok());
  ASSERT_TRUE((*event)->MakeStreamWait(**s2).ok());
  std::vector<float> out(n, -1.0f);
  ASSERT_TRUE(device->CopyAsync(copy->data(), sum->data(), n * 4, **s2).ok());
  ASSERT_TRUE(device->CopyAsync(out.data(), copy->data(), n * 4, **s2).ok());
  ASSERT_TRUE((*s2)->Synchronize().ok());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], 1.0f + kRounds) << "element " << i << ": stream 2 did not wait";
  }
  // The host can wait on the event too.
  EXPECT_TRUE((*event)->Synchronize().ok());
  EXPECT_TRUE((*s1)->Synchronize().ok());
}

}  // namespace
}  // namespace zeroshard
