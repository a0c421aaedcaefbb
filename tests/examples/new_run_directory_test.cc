// A new run (no --resume) of gpt_train or mlp_demo saving into a
// --checkpoint-dir that holds another run's checkpoints is refused, naming
// the steps and --overwrite-checkpoints, and leaves them as they were; with
// --overwrite-checkpoints the old steps are removed and the new run's are
// the only ones there. The seeds are drawn fresh, so the second run's
// weights differ from the first's.
#include <sys/stat.h>

#include <algorithm>
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
using testing::RunCommand;
using testing::TestTempPath;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The step directories in `dir`, by name.
std::vector<std::string> Steps(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

int64_t DrawSeed() {
  std::mt19937_64 rng(std::random_device{}());
  return std::uniform_int_distribution<int64_t>(1, 1 << 30)(rng);
}

int Lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// Runs a first program line that saves steps 2 and 4 into `dir`, then checks
// the refusal of a new one (for each of `fresh_runs`) and the overwrite.
void CheckNewRunIntoOldDirectory(const std::string& first,
                                 const std::vector<std::string>& fresh_runs,
                                 const std::string& overwrite_run, const std::string& resume_run,
                                 const std::string& dir) {
  const testing::CommandResult a = RunCommand(first);
  ASSERT_EQ(a.exit_code, 0) << first << "\n" << a.err;
  ASSERT_EQ(Steps(dir), (std::vector<std::string>{"step_00000002", "step_00000004"}));
  const std::string latest = Slurp(dir + "/latest");
  const std::string manifest2 = Slurp(dir + "/step_00000002/manifest.json");
  const std::string manifest4 = Slurp(dir + "/step_00000004/manifest.json");

  for (const std::string& run : fresh_runs) {
    const testing::CommandResult b = RunCommand(run);
    EXPECT_EQ(b.exit_code, 2) << run << "\n" << b.err;
    EXPECT_EQ(Lines(b.err), 1) << run << "\n" << b.err;
    for (const std::string part :
         {std::string("--checkpoint-dir ") + dir,
          std::string("step_00000002 .. step_00000004 (2 steps)"), std::string("--resume"),
          std::string("--overwrite-checkpoints")}) {
      EXPECT_NE(b.err.find(part), std::string::npos) << part << " missing: " << b.err;
    }
    // Nothing of the old run changed.
    EXPECT_EQ(Steps(dir), (std::vector<std::string>{"step_00000002", "step_00000004"})) << run;
    EXPECT_EQ(Slurp(dir + "/latest"), latest) << run;
    EXPECT_EQ(Slurp(dir + "/step_00000002/manifest.json"), manifest2) << run;
    EXPECT_EQ(Slurp(dir + "/step_00000004/manifest.json"), manifest4) << run;
  }

  const testing::CommandResult both = RunCommand(resume_run + " --overwrite-checkpoints");
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_NE(both.err.find("--overwrite-checkpoints removes the checkpoints"), std::string::npos)
      << both.err;

  const testing::CommandResult c = RunCommand(overwrite_run + " --overwrite-checkpoints");
  ASSERT_EQ(c.exit_code, 0) << overwrite_run << "\n" << c.err;
  EXPECT_NE(c.err.find("--overwrite-checkpoints: removed step_00000002 .. step_00000004 (2 steps)"),
            std::string::npos)
      << c.err;
  // Only the new run's step 2 is there, and `latest` names it.
  EXPECT_EQ(Steps(dir), (std::vector<std::string>{"step_00000002"}));
  EXPECT_EQ(Slurp(dir + "/latest"), "step_00000002\n");
  EXPECT_NE(Slurp(dir + "/step_00000002/manifest.json"), manifest2)
      << "step 2 should be the new run's (another seed)";
}

TEST(NewRunDirectory, GptTrainRefusesAnotherRunsCheckpointsOnEveryPath) {
  const std::string dir = TestTempPath("gpt_ck");
  const std::string config = TestTempPath("gpt_cfg.json");
  fs::remove_all(dir);
  std::ofstream(config) << "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", "
                           "\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"n_positions\": 64, "
                           "\"vocab_size\": 256, \"layer_norm_epsilon\": 1e-5}\n";
  const int64_t seed = DrawSeed();
  const std::string base = std::string(ZS_GPT_TRAIN) + " --config " + config + " --data " +
                           ZS_GPT_TEXT + " --seq 16 --micro-batch 2 --quiet --checkpoint-dir " +
                           dir;
  const std::string first = base + " --steps 4 --save-every 2 --seed " + std::to_string(seed);
  const std::string fresh = base + " --steps 4 --save-every 2 --seed " + std::to_string(seed + 1);
  CheckNewRunIntoOldDirectory(first,
                              {fresh, fresh + " --ranks 2 --stage 2", fresh + " --ranks 2 --tp 2",
                               fresh + " --ranks 2 --pp 2"},
                              base + " --steps 2 --save-every 2 --seed " + std::to_string(seed + 1),
                              base + " --steps 6 --save-every 2 --resume", dir);
  fs::remove_all(dir);
  std::remove(config.c_str());
}

TEST(NewRunDirectory, MlpDemoRefusesAnotherRunsCheckpoints) {
  const std::string dir = TestTempPath("mlp_ck");
  fs::remove_all(dir);
  // mlp_demo has no seed flag: the second run's learning rate differs.
  std::mt19937_64 rng(std::random_device{}());
  const double lr = std::uniform_real_distribution<double>(0.001, 0.01)(rng);
  const std::string base = std::string(ZS_MLP_DEMO) +
                           " --hidden 16 --blocks 2 --ranks 2 --keep-last 5 --checkpoint-dir " +
                           dir;
  const std::string first = base + " --steps 4 --save-every 2 --lr " + std::to_string(lr);
  const std::string fresh = base + " --steps 4 --save-every 2 --lr " + std::to_string(2 * lr);
  CheckNewRunIntoOldDirectory(first, {fresh, fresh + " --stage 3"},
                              base + " --steps 2 --save-every 2 --lr " + std::to_string(2 * lr),
                              base + " --steps 6 --save-every 2 --resume", dir);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zeroshard
