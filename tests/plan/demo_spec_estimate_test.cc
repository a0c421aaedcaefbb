// As a user would: `mlp_demo --print-spec` writes the MLP (LoRA, LoRA with
// the tied LM embedding, the trainable tied LM) as a `--spec` file;
// `zeroshard estimate --spec` of it plans, per GPU, exactly the model-state
// and total bytes `mlp_demo`'s run of the same model reports from its
// ledger (largest rank).
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/command_runner.h"
#include "tests/test_seed.h"

namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// stdout of `command`, and its exit code.
std::string RunShell(const std::string& command, int* exit_code) {
  const zeroshard::testing::CommandResult r = zeroshard::testing::RunCommand(command);
  *exit_code = r.exit_code;
  return r.out;
}

std::string TempPath(const std::string& name) {
  return zeroshard::testing::TestTempPath("demo_spec_" + name);
}

TEST(DemoSpecEstimateTest, EstimateOfPrintedSpecEqualsTheDemosLedger) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const char* variants[] = {"--lora %d", "--lora %d --vocab %d", "--vocab %d"};
  for (int v = 0; v < 3; ++v) {
    for (int trial = 0; trial < 2; ++trial) {
      char model[128];
      if (v == 2) {
        std::snprintf(model, sizeof(model), variants[v], pick(20, 200));
      } else {
        std::snprintf(model, sizeof(model), variants[v], pick(1, 9), pick(20, 200));
      }
      const std::string shape = " --hidden " + std::to_string(8 * pick(2, 8)) + " --blocks " +
                                std::to_string(pick(1, 4)) + " " + model;
      const int ranks = pick(1, 4);
      const int stage = pick(0, 3);
      const std::string precision = pick(0, 1) == 1 ? "bf16" : "fp32";
      const int accum = pick(1, 2);
      const std::string where = shape + " ranks " + std::to_string(ranks) + " stage " +
                                std::to_string(stage) + " " + precision + " accum " +
                                std::to_string(accum);
      const std::string spec = TempPath("spec.json");
      int code = -1;
      RunShell(std::string(ZS_MLP_DEMO) + shape + " --print-spec > " + spec, &code);
      ASSERT_EQ(code, 0) << where;
      const std::string est = RunShell(
          std::string(ZS_BINARY) + " estimate --spec " + spec + " --gpus " + std::to_string(ranks) +
              " --stage " + std::to_string(stage) + " --precision " + precision + " --grad-accum " +
              std::to_string(accum) + " --reserve 0 --workspace 0 --json",
          &code);
      std::remove(spec.c_str());
      ASSERT_EQ(code, 0) << where;
      const nlohmann::json doc = nlohmann::json::parse(est, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << est;
      nlohmann::json chosen;
      for (const nlohmann::json& c : doc["candidates"]) {
        if (c["chosen"].get<bool>()) chosen = c;
      }
      ASSERT_TRUE(chosen.is_object()) << est;
      const std::string demo = RunShell(
          std::string(ZS_MLP_DEMO) + shape + " --ranks " + std::to_string(ranks) + " --stage " +
              std::to_string(stage) + " --precision " + precision + " --accum " +
              std::to_string(accum) + " --steps 1 --micro-batch 2 2>/dev/null",
          &code);
      ASSERT_EQ(code, 0) << where << "\n" << demo;
      const std::string key = "largest rank, bytes: model states ";
      const size_t at = demo.find(key);
      ASSERT_NE(at, std::string::npos) << demo;
      long long states = -1, total = -1;
      ASSERT_EQ(
          std::sscanf(demo.c_str() + at + key.size(), "%lld, engine total %lld", &states, &total),
          2)
          << demo;
      EXPECT_EQ(states, chosen["per_gpu_bytes"]["model_states"].get<long long>()) << where;
      EXPECT_EQ(total, chosen["per_gpu_bytes"]["total"].get<long long>()) << where;
      std::printf("%s: estimate %lld / %lld bytes, ledger %lld / %lld\n", where.c_str(),
                  chosen["per_gpu_bytes"]["model_states"].get<long long>(),
                  chosen["per_gpu_bytes"]["total"].get<long long>(), states, total);
    }
  }
}

}  // namespace
