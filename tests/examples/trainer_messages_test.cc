// The messages of issue 34's item 11, each from the command line a user
// types: what went wrong, where, what to do, with the right status code
// (never INTERNAL for a user's mistake) and on one line.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
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

int64_t Draw(int64_t lo, int64_t hi) {
  static std::mt19937_64 rng(std::random_device{}());
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

std::string WriteConfig(int layers, const std::string& name) {
  const std::string path = TestTempPath(name);
  std::ofstream(path)
      << "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", "
      << "\"n_layer\": " << layers << ", \"n_head\": 2, \"n_embd\": 32, "
      << "\"n_positions\": 64, \"vocab_size\": 256, \"layer_norm_epsilon\": 1e-5}\n";
  return path;
}

std::string Gpt(const std::string& config, const std::string& extra) {
  return std::string(ZS_GPT_TRAIN) + " --config " + config + " --data " + ZS_GPT_TEXT +
         " --seq 16 --micro-batch 2 --steps 2 --quiet " + extra + " >/dev/null";
}

// --pp beyond what the GPT splits into (every stage must train something):
// named as a --pp problem with the largest --pp that works, not "every param
// is frozen" from the engine of the stage that holds only the tied head.
TEST(TrainerMessages, GptPipelineDeeperThanTheModelNamesTheMostStages) {
  const int layers = static_cast<int>(Draw(1, 3));
  const std::string config = WriteConfig(layers, "pp_cfg.json");
  // embed, h.0 .. h.(L-1), final_norm, lm_head: L + 3 units; the last
  // stage cannot hold lm_head alone.
  const int pp = layers + 3;
  const CommandResult r =
      RunCommand(Gpt(config, "--ranks " + std::to_string(pp) + " --pp " + std::to_string(pp)));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--pp " + std::to_string(pp) + ": pipeline stage"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("nothing to train"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("at most " + std::to_string(layers + 2) + " stages"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("every param"), std::string::npos) << r.err;
  // The --pp the message names runs.
  const CommandResult fits = RunCommand(
      Gpt(config, "--ranks " + std::to_string(layers + 2) + " --pp " + std::to_string(layers + 2)));
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  std::remove(config.c_str());
}

// A file in the checkpoint path: FailedPrecondition saying a part of the path
// is a file (it was INTERNAL "Not a directory").
TEST(TrainerMessages, CheckpointDirUnderAFileSaysSo) {
  const std::string file = TestTempPath("afile");
  std::ofstream(file) << "x";
  const std::string config = WriteConfig(2, "ckfile_cfg.json");
  for (const std::string grid : {std::string(""), std::string("--ranks 2 --tp 2")}) {
    const CommandResult r =
        RunCommand(Gpt(config, grid + " --save-every 1 --checkpoint-dir " + file + "/ck"));
    EXPECT_NE(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("a part of the path is a file, not a directory"), std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("INTERNAL"), std::string::npos) << r.err;
  }
  const CommandResult m = RunCommand(std::string(ZS_MLP_DEMO) +
                                     " --hidden 16 --blocks 2 --steps 2 --save-every 1 "
                                     "--checkpoint-dir " +
                                     file + "/ck >/dev/null");
  EXPECT_NE(m.exit_code, 0) << m.err;
  EXPECT_NE(m.err.find("a part of the path is a file, not a directory"), std::string::npos)
      << m.err;
  std::remove(file.c_str());
  std::remove(config.c_str());
}

// A grid resume of a model with more layers is refused before anything is
// loaded: no "resumed from" line precedes the refusal.
TEST(TrainerMessages, GridResumeOfAnotherModelSaysNothingResumed) {
  const std::string ck = TestTempPath("more_layers_ck");
  fs::remove_all(ck);
  const std::string two = WriteConfig(2, "two.json");
  const std::string more = WriteConfig(static_cast<int>(Draw(3, 4)), "more.json");
  CommandResult r = RunCommand(Gpt(two, "--ranks 2 --pp 2 --save-every 2 --checkpoint-dir " + ck));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCommand(Gpt(more, "--ranks 2 --pp 2 --steps 4 --resume --checkpoint-dir " + ck));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("n_layer is 2 there"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("resumed from"), std::string::npos) << r.err;
  fs::remove_all(ck);
  std::remove(two.c_str());
  std::remove(more.c_str());
}

}  // namespace
}  // namespace zeroshard
