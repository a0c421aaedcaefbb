// The nccl backend's entry points on any machine (no GPU needed): a build
// without NCCL says so (Unimplemented); a build with it refuses non-CUDA
// devices (InvalidArgument) and GPUs the machine lacks (NotFound), each with
// a message that names the device and what to do, before touching MPI.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/fake_cuda_device.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;
using testing_comm::FakeCudaDevice;

absl::Status NeverCalled(int, Communicator&) {
  return absl::InternalError("fn must not run when the ranks cannot be created");
}

TEST(NcclCreateTest, HaveNcclMatchesTheBuild) { EXPECT_EQ(HaveNccl(), ZS_TEST_EXPECT_NCCL != 0); }

TEST(NcclCreateTest, CpuDeviceIsRefused) {
  std::unique_ptr<Device> cpu = CreateCpuDevice();
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateNcclCommunicator(*cpu);
  ASSERT_FALSE(comm.ok());
  if (!HaveNccl()) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnimplemented) << comm.status();
    EXPECT_THAT(comm.status().message(), HasSubstr("built without NCCL"));
    return;
  }
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("device 'cpu' is not a CUDA device"));
  EXPECT_THAT(comm.status().message(), HasSubstr("one GPU per rank"));
}

TEST(NcclCreateTest, MissingGpuIsNotFound) {
  FakeCudaDevice absent("cuda:4096");
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateNcclCommunicator(absent);
  ASSERT_FALSE(comm.ok());
  if (!HaveNccl()) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnimplemented) << comm.status();
    return;
  }
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kNotFound) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("device cuda:4096: this machine has"));
}

TEST(NcclCreateTest, MalformedCudaNameIsRefused) {
  FakeCudaDevice odd("cuda:first");
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateNcclCommunicator(odd);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(),
            HaveNccl() ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kUnimplemented)
      << comm.status();
}

TEST(NcclCreateTest, LocalRanksRefuseBadDeviceLists) {
  std::unique_ptr<Device> cpu = CreateCpuDevice();
  FakeCudaDevice absent("cuda:4096");
  struct Case {
    std::vector<Device*> devices;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, absl::StatusCode::kInvalidArgument, "no devices"},
      {{nullptr}, absl::StatusCode::kInvalidArgument, "rank 0: the device is null"},
      {{cpu.get()}, absl::StatusCode::kInvalidArgument, "rank 0: device 'cpu' is not a CUDA"},
      {{&absent}, absl::StatusCode::kNotFound, "rank 0: device cuda:4096"},
  };
  for (const Case& c : cases) {
    const absl::Status status = RunNcclLocalRanks(c.devices, NeverCalled);
    ASSERT_FALSE(status.ok());
    if (!HaveNccl()) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
      continue;
    }
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace zeroshard
