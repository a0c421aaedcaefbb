// CreateCudaDevice on any machine, GPU or not, CUDA build or not: a device
// when there is one, otherwise a clear error (NotFound: no such GPU;
// Unimplemented: built without CUDA), never a crash. A CPU test: it runs
// everywhere and asserts whichever answer this machine must give.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "zeroshard/device.h"

namespace zeroshard {
namespace {

TEST(CudaAvailabilityTest, CreateCudaDeviceGivesADeviceOrAClearError) {
  for (int ordinal : {0, 1, -1, 999}) {
    auto device = CreateCudaDevice(ordinal);
    std::printf("[  NOTE    ] CreateCudaDevice(%d): %s\n", ordinal,
                device.ok() ? (*device)->name().c_str() : device.status().ToString().c_str());
    if (device.ok()) {
      ASSERT_TRUE(ZS_HAVE_CUDA) << "a CUDA device from a build without CUDA";
      EXPECT_GE(ordinal, 0);
      EXPECT_EQ((*device)->kind(), DeviceKind::kCuda);
      EXPECT_EQ((*device)->name(), "cuda:" + std::to_string(ordinal));
      continue;
    }
    const absl::StatusCode want =
        ZS_HAVE_CUDA ? absl::StatusCode::kNotFound : absl::StatusCode::kUnimplemented;
    EXPECT_EQ(device.status().code(), want) << device.status();
    // The message names the device asked for.
    EXPECT_NE(device.status().message().find("cuda:" + std::to_string(ordinal)),
              absl::string_view::npos)
        << device.status();
  }
  // Ordinals that can never exist are never a device.
  EXPECT_FALSE(CreateCudaDevice(-1).ok());
  EXPECT_FALSE(CreateCudaDevice(999).ok());
}

}  // namespace
}  // namespace zeroshard
