// Every output of gpt_train, mlp_demo and zeroshard is written and checked
// to the last close: a full disk (/dev/full) under any output flag or under
// stdout is a non-zero exit naming the flag and the file, never a silent
// success; a missing directory says so (not PERMISSION_DENIED); a new
// run's --log-json starts afresh and a resumed run's continues it.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/command_runner.h"

namespace zeroshard {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::RunCommand;
using testing::TestTempPath;

std::mt19937_64& Rng() {
  static std::mt19937_64 rng(std::random_device{}());
  return rng;
}
int64_t Draw(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(Rng());
}

int Lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void ExpectFailsNaming(const CommandResult& r, const std::string& command,
                       const std::vector<std::string>& parts) {
  EXPECT_NE(r.exit_code, 0) << command << " exited 0: " << r.err;
  EXPECT_NE(r.exit_code, -1) << command << " did not exit: " << r.err;
  for (const std::string& part : parts) {
    EXPECT_NE(r.err.find(part), std::string::npos)
        << command << ": '" << part << "' missing from: " << r.err;
  }
}

class OutputErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = Draw(1, 1 << 20);
    config_ = TestTempPath("out_cfg.json");
    std::ofstream(config_) << "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": "
                              "\"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, "
                              "\"n_positions\": 64, \"vocab_size\": 256, "
                              "\"layer_norm_epsilon\": 1e-5}\n";
  }
  void TearDown() override { std::remove(config_.c_str()); }
  std::string Gpt(const std::string& extra) const {
    return std::string(ZS_GPT_TRAIN) + " --config " + config_ + " --data " + ZS_GPT_TEXT +
           " --seq 16 --micro-batch 2 --quiet --seed " + std::to_string(seed_) + " " + extra;
  }
  std::string config_;
  int64_t seed_ = 0;
};

TEST_F(OutputErrorsTest, MlpDemoResultJsonOnAFullDiskFails) {
  const std::string command = std::string(ZS_MLP_DEMO) + " --hidden 16 --blocks 2 --ranks 2 " +
                              "--steps " + std::to_string(Draw(1, 3)) +
                              " --result-json /dev/full >/dev/null";
  ExpectFailsNaming(RunCommand(command), command,
                    {"--result-json /dev/full", "No space left on device"});
}

TEST_F(OutputErrorsTest, MlpDemoResultJsonInAMissingDirectorySaysSo) {
  const std::string dir = TestTempPath("no_such_dir");
  fs::remove_all(dir);
  const std::string command = std::string(ZS_MLP_DEMO) +
                              " --hidden 16 --blocks 2 --steps 1 --result-json " + dir +
                              "/r.json >/dev/null";
  const CommandResult r = RunCommand(command);
  ExpectFailsNaming(r, command, {"--result-json " + dir + "/r.json", "does not exist"});
  EXPECT_EQ(r.err.find("PERMISSION_DENIED"), std::string::npos) << r.err;
}

TEST_F(OutputErrorsTest, MlpDemoStdoutOnAFullDiskFails) {
  const std::string command =
      std::string(ZS_MLP_DEMO) + " --hidden 16 --blocks 2 --steps 1 >/dev/full";
  ExpectFailsNaming(RunCommand(command), command, {"standard output"});
}

TEST_F(OutputErrorsTest, GptTrainOutputsOnAFullDiskFail) {
  for (const std::string flag : {"--log-json", "--dump-batches", "--dump-logits"}) {
    for (const std::string grid : {std::string(""), std::string("--ranks 2 --tp 2")}) {
      const std::string command = Gpt("--steps " + std::to_string(Draw(1, 3)) + " " + grid + " " +
                                      flag + " /dev/full >/dev/null");
      ExpectFailsNaming(RunCommand(command), command,
                        {flag + " /dev/full", "No space left on device"});
    }
  }
  const std::string command = Gpt("--steps 1 >/dev/full");
  ExpectFailsNaming(RunCommand(command), command, {"standard output"});
}

TEST_F(OutputErrorsTest, GptTrainLogJsonStartsAfreshAndAResumeAppends) {
  const std::string log = TestTempPath("log.jsonl");
  const std::string ck = TestTempPath("log_ck");
  fs::remove_all(ck);
  // Another run's lines are there: a new run replaces them.
  const int old_lines = static_cast<int>(Draw(1, 20));
  {
    std::ofstream out(log);
    for (int i = 0; i < old_lines; ++i) out << "{\"step\": " << i << ", \"old\": true}\n";
  }
  const int steps = static_cast<int>(Draw(2, 4));
  CommandResult r = RunCommand(Gpt("--steps " + std::to_string(steps) + " --log-json " + log +
                                   " --checkpoint-dir " + ck + " --save-every " +
                                   std::to_string(steps) + " >/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string text = Slurp(log);
  EXPECT_EQ(Lines(text), steps) << text;
  EXPECT_EQ(text.find("\"old\""), std::string::npos) << text;
  // The resume continues the same log: steps + 1 .. steps + 2 follow.
  r = RunCommand(Gpt("--steps " + std::to_string(steps + 2) + " --log-json " + log +
                     " --checkpoint-dir " + ck + " --resume >/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  text = Slurp(log);
  EXPECT_EQ(Lines(text), steps + 2) << text;
  EXPECT_NE(text.find("\"step\":" + std::to_string(steps + 2) + "}"), std::string::npos) << text;
  fs::remove_all(ck);
  std::remove(log.c_str());
}

TEST_F(OutputErrorsTest, ZeroshardEstimateOutputsOnAFullDiskFail) {
  const std::string base = std::string(ZS_ZEROSHARD) + " estimate --preset llama-2-7b --gpus " +
                           std::to_string(8 * Draw(1, 4)) + " --gpu-mem 80GiB";
  std::string command = base + " --svg /dev/full >/dev/null";
  ExpectFailsNaming(RunCommand(command), command, {"--svg /dev/full", "No space left on device"});
  for (const std::string json : {std::string(""), std::string(" --json")}) {
    command = base + json + " >/dev/full";
    const CommandResult r = RunCommand(command);
    ExpectFailsNaming(r, command, {"standard output"});
    EXPECT_EQ(Lines(r.err), 1) << r.err;
  }
}

}  // namespace
}  // namespace zeroshard
