#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "zeroshard/device.h"

namespace zeroshard {
namespace {

TEST(CpuDeviceTest, AllocationsAreAlignedZeroedAndLedgered) {
  auto device = CreateCpuDevice();
  {
    auto a = device->Allocate(1000, MemoryCategory::kParams, "a");
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 64, 0u);
    const auto* bytes = a->as<unsigned char>();
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(bytes[i], 0);
    auto b = device->Allocate(24, MemoryCategory::kOptimizerState, "b");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(device->ledger().current(MemoryCategory::kParams), 1000);
    EXPECT_EQ(device->ledger().current(MemoryCategory::kOptimizerState), 24);
    EXPECT_EQ(device->ledger().current_model_states(), 1024);
    auto c = device->Allocate(500, MemoryCategory::kCommBuffers, "c");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(device->ledger().current_model_states(), 1024);
    EXPECT_EQ(device->ledger().current_total(), 1524);
    // Moving keeps one owner.
    DeviceBuffer moved = std::move(*c);
    EXPECT_EQ(device->ledger().current_total(), 1524);
  }
  EXPECT_EQ(device->ledger().current_total(), 0);
  EXPECT_EQ(device->ledger().peak_total(), 1524);
  EXPECT_EQ(device->ledger().peak(MemoryCategory::kParams), 1000);
  EXPECT_FALSE(device->Allocate(-1, MemoryCategory::kParams, "neg").ok());
}

TEST(MemoryLedgerTest, PeakIsOfTheSumNotTheSumOfPeaks) {
  MemoryLedger ledger;
  ledger.Add(MemoryCategory::kParams, 100);
  ledger.Remove(MemoryCategory::kParams, 100);
  ledger.Add(MemoryCategory::kGradients, 60);
  EXPECT_EQ(ledger.peak_total(), 100);
  EXPECT_EQ(ledger.peak(MemoryCategory::kParams), 100);
  EXPECT_EQ(ledger.peak(MemoryCategory::kGradients), 60);
}

TEST(MemoryLedgerTest, ConcurrentUpdatesBalance) {
  MemoryLedger ledger;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&ledger, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 10000; ++i) {
        const int64_t bytes = rng() % 1000;
        ledger.Add(MemoryCategory::kWorkspace, bytes);
        ledger.Remove(MemoryCategory::kWorkspace, bytes);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ledger.current_total(), 0);
  EXPECT_LE(ledger.peak_total(), 4000);
}

}  // namespace
}  // namespace zeroshard
