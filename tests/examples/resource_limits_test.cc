// mlp_demo and gpt_train refuse a run whose sizes exceed the model (a LoRA
// rank above the layer width, a --seq above n_positions) or whose estimated
// bytes exceed the machine's memory, quickly, in one line naming the
// estimate, and while still small (wait4's ru_maxrss); a normal run still
// trains. Sizes are drawn fresh each run.
#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/command_runner.h"
#include "tests/program_run.h"

namespace zeroshard {
namespace {

using testing::ProgramRun;
using testing::RunProgram;

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

// A refused run grows by less than 100 MB over what the program takes to
// print --help: the libraries it maps (the CUDA build's runtime is some
// 200 MB resident) are not the run's allocation.
constexpr int64_t kRefusedGrowthKib = 100 * 1024;

// The peak resident set of `program --help`, measured once per program.
int64_t BaselineRssKib(const std::string& program) {
  static std::map<std::string, int64_t>* baselines = new std::map<std::string, int64_t>();
  auto it = baselines->find(program);
  if (it == baselines->end()) {
    const ProgramRun help = RunProgram({program, "--help"});
    EXPECT_EQ(help.exit_code, 0) << program << " --help: " << help.err;
    it = baselines->emplace(program, help.max_rss_kib).first;
  }
  return it->second;
}

void ExpectRefusedSmall(const ProgramRun& r, const std::string& program, const std::string& what) {
  EXPECT_EQ(r.exit_code, 2) << what << ": " << r.err;
  EXPECT_EQ(Lines(r.err), 1) << what << ": one line expected: " << r.err;
  EXPECT_LT(r.seconds, 1.0) << what << ": " << r.err;
  const int64_t baseline = BaselineRssKib(program);
  EXPECT_LT(r.max_rss_kib - baseline, kRefusedGrowthKib)
      << what << ": peak " << r.max_rss_kib << " KiB against " << baseline
      << " KiB for --help: " << r.err;
}

TEST(MlpDemoResources, LoraRankAboveTheWidthIsRefusedNamingIt) {
  const int64_t hidden = Draw(8, 512);
  const int64_t lora = Draw(hidden + 1, 100000);
  const ProgramRun r = RunProgram({ZS_MLP_DEMO, "--hidden", std::to_string(hidden), "--lora",
                                   std::to_string(lora), "--steps", "1"});
  ExpectRefusedSmall(r, ZS_MLP_DEMO, "--lora " + std::to_string(lora));
  EXPECT_NE(r.err.find("--lora) " + std::to_string(lora) + " exceeds the hidden width " +
                       std::to_string(hidden)),
            std::string::npos)
      << r.err;
}

TEST(MlpDemoResources, RunBeyondTheMachineIsRefusedWithTheEstimate) {
  // --hidden past 10^5 (10^11 params a block) or a micro-batch of 10^8
  // samples: terabytes on any machine these tests run on.
  const bool wide = Draw(0, 1) == 1;
  const std::vector<std::string> args =
      wide ? std::vector<std::string>{ZS_MLP_DEMO, "--hidden",
                                      std::to_string(Draw(100000, 1000000)), "--steps", "1"}
           : std::vector<std::string>{ZS_MLP_DEMO, "--micro-batch",
                                      std::to_string(Draw(100000000, 1000000000)), "--steps", "1"};
  const ProgramRun r = RunProgram(args);
  ExpectRefusedSmall(r, ZS_MLP_DEMO, args[1] + " " + args[2]);
  for (const char* part : {"the run needs about", "engine buffers", "this machine has", "lower"}) {
    EXPECT_NE(r.err.find(part), std::string::npos) << part << " missing: " << r.err;
  }
}

TEST(MlpDemoResources, NormalRunIsAccepted) {
  const int64_t hidden = 8 * Draw(2, 6);
  const ProgramRun r =
      RunProgram({ZS_MLP_DEMO, "--hidden", std::to_string(hidden), "--blocks", "2", "--ranks", "2",
                  "--lora", std::to_string(Draw(1, hidden)), "--steps", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A config.json of the given sizes in a fresh temporary file.
std::string WriteConfig(int64_t layers, int64_t heads, int64_t width, int64_t positions,
                        const std::string& name) {
  const std::string path = testing::TestTempPath(name);
  std::ofstream(path) << "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", "
                      << "\"n_layer\": " << layers << ", \"n_head\": " << heads
                      << ", \"n_embd\": " << width << ", \"n_positions\": " << positions
                      << ", \"vocab_size\": 256, \"layer_norm_epsilon\": 1e-5}\n";
  return path;
}

TEST(GptTrainResources, OversizedRunIsRefusedBeforeAllocatingWithTheEstimate) {
  const std::string config = WriteConfig(Draw(24, 48), 16, 64 * Draw(16, 32), 1024, "big.json");
  const int64_t batch = Draw(2048, 4096);
  for (const std::vector<std::string>& grid :
       {std::vector<std::string>{}, std::vector<std::string>{"--tp", "2", "--ranks", "2"}}) {
    std::vector<std::string> args = {
        ZS_GPT_TRAIN,          "--config", config, "--data",  ZS_GPT_TEXT, "--micro-batch",
        std::to_string(batch), "--seq",    "1024", "--steps", "1",         "--quiet"};
    args.insert(args.end(), grid.begin(), grid.end());
    const ProgramRun r = RunProgram(args);
    ExpectRefusedSmall(r, ZS_GPT_TRAIN,
                       "--micro-batch " + std::to_string(batch) + (grid.empty() ? "" : " --tp 2"));
    for (const std::string& part :
         {std::string("the run needs about"), std::string("this machine has"),
          "micro-batch " + std::to_string(batch) + " x seq 1024"}) {
      EXPECT_NE(r.err.find(part), std::string::npos) << part << " missing: " << r.err;
    }
  }
  std::remove(config.c_str());
}

TEST(GptTrainResources, SeqAboveNPositionsIsRefused) {
  const int64_t positions = Draw(16, 64);
  const std::string config = WriteConfig(2, 2, 32, positions, "short.json");
  const int64_t seq = Draw(positions + 1, 1 << 20);
  const ProgramRun r = RunProgram({ZS_GPT_TRAIN, "--config", config, "--data", ZS_GPT_TEXT, "--seq",
                                   std::to_string(seq), "--steps", "1", "--quiet"});
  ExpectRefusedSmall(r, ZS_GPT_TRAIN, "--seq " + std::to_string(seq));
  EXPECT_NE(r.err.find("n_positions " + std::to_string(positions)), std::string::npos) << r.err;
  std::remove(config.c_str());
}

TEST(GptTrainResources, NormalRunIsAccepted) {
  const std::string config = WriteConfig(2, 2, 32, 64, "small.json");
  const ProgramRun r =
      RunProgram({ZS_GPT_TRAIN, "--config", config, "--data", ZS_GPT_TEXT, "--micro-batch",
                  std::to_string(Draw(1, 4)), "--seq", std::to_string(Draw(8, 32)), "--steps", "2",
                  "--ranks", "2", "--quiet"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::remove(config.c_str());
}

}  // namespace
}  // namespace zeroshard
