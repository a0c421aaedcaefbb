// `zeroshard calibrate --what offload` as a user runs it: the host-copy
// rate and a small swap file's write and read through SwapFiles, added to
// an existing profile (the rest kept), which then parses back.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/command_runner.h"
#include "tools/machine_profile.h"

namespace zeroshard {
namespace {

using ::zeroshard::testing::RunCommand;
using ::zeroshard::testing::TestTempPath;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(CalibrateOffloadTest, MeasuresTheNvmeAndHostCopyRatesIntoTheProfile) {
  const std::string dir = TestTempPath("calibrate_offload");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(std::filesystem::create_directories(dir)) << dir;
  const std::string profile = dir + "/machine.json";
  std::filesystem::copy_file(std::string(ZS_TOOLS_TESTDATA) + "/machine-2-cores.json", profile);
  const std::string before = ReadFile(profile);
  auto original = ParseMachineProfile(before, profile);
  ASSERT_TRUE(original.ok()) << original.status();

  const testing::CommandResult r =
      RunCommand(std::string(ZS_CALIBRATE) + " --what offload --offload-dir " + dir +
                 " --offload-bytes 1048576 --min-seconds 0.05 --out " + profile);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("host copy"), std::string::npos) << r.err;
  auto measured = ParseMachineProfile(ReadFile(profile), profile);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_GT(measured->offload.host_copy_bytes_per_s, 0);
  EXPECT_GT(measured->offload.nvme_read_bytes_per_s, 0);
  EXPECT_GT(measured->offload.nvme_write_bytes_per_s, 0);
  // Which backend ran, as SwapFiles says it.
  const std::string& backend = measured->offload.io_backend;
  EXPECT_TRUE(backend.rfind("io_uring", 0) == 0 || backend.rfind("thread pool", 0) == 0) << backend;
  EXPECT_NE(r.err.find(backend), std::string::npos) << r.err;
  EXPECT_EQ(measured->offload.dir, dir);
  // The rest of the profile is kept.
  EXPECT_EQ(measured->sgemm_flops_per_s, original->sgemm_flops_per_s);
  EXPECT_EQ(measured->collectives.size(), original->collectives.size());
  // The swap file is scratch: removed at the end.
  int left = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    left += entry.path().filename().string().rfind("zeroshard-swap", 0) == 0;
  }
  EXPECT_EQ(left, 0);

  // A directory that does not exist: refused, naming it, profile untouched.
  const std::string kept = ReadFile(profile);
  const testing::CommandResult missing =
      RunCommand(std::string(ZS_CALIBRATE) + " --what offload --offload-dir " + dir +
                 "/nope --offload-bytes 1048576 --out " + profile);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find(dir + "/nope"), std::string::npos) << missing.err;
  EXPECT_EQ(ReadFile(profile), kept);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zeroshard
