// mlp_demo --mem-cap --machine as a user runs it: the planner times every
// (tp, pp, stage, optimizer tier) candidate with the calibrated MLP model of
// a fixed profile (testdata/machine-2-cores-offload.json), picks the
// optimizer on the host where a split's all-reduces and bubble cost more,
// and tp where the offload's copies and dp traffic cost more; the demo then
// trains the choice and its ledger equals the plan.
#include <string>

#include "gtest/gtest.h"
#include "tests/command_runner.h"

namespace zeroshard {
namespace {

using ::zeroshard::testing::RunCommand;

testing::CommandResult RunDemo(const std::string& args) {
  return RunCommand(std::string("timeout -k 1 120 ") + ZS_MLP_DEMO +
                    " --ranks 2 --steps 3 --machine " + ZS_PLAN_TESTDATA +
                    "/machine-2-cores-offload.json " + args);
}

void ExpectLedgerEqualsPlan(const testing::CommandResult& r) {
  EXPECT_NE(r.out.find("(equal)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("UNEXPECTED"), std::string::npos) << r.out;
}

TEST(DemoMemCapOffloadTest, PicksTheHostTierWhereItIsTheFastestFit) {
  // Sharding alone needs >= 2.5 MiB; tp 2, pp 2 and the host tier fit.
  const auto r = RunDemo("--blocks 8 --hidden 64 --micro-batch 512 --mem-cap 2.25MiB");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the fastest that fits by the calibrated step model"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("mlp_demo: chosen: tp 1 x pp 1 x dp 2, stage 2, optimizer on host: "),
            std::string::npos)
      << r.err;
  // The passed-over split is printed with its reason.
  EXPECT_NE(r.err.find("2 x 1 x 1        0 device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("slower than the choice"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("over the cap by"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mlp_demo: optimizer state on the host tier"), std::string::npos) << r.err;
  // Trained with the optimizer on the host: the same bits as the baseline.
  EXPECT_NE(r.out.find("bitwise identical: yes"), std::string::npos) << r.out;
  ExpectLedgerEqualsPlan(r);
}

TEST(DemoMemCapOffloadTest, PicksTensorParallelWhereItIsTheFastestFit) {
  // Sharding alone needs >= 12.1 MiB; tp 2 (10.1 MiB) and offload fit.
  const auto r = RunDemo("--blocks 2 --hidden 256 --micro-batch 2 --mem-cap 11MiB");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("mlp_demo: chosen: tp 2 x pp 1 x dp 1, stage 0: "), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("1 x 1 x 2        2 host"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("optimizer state on the"), std::string::npos) << r.err;
  ExpectLedgerEqualsPlan(r);
}

}  // namespace
}  // namespace zeroshard
