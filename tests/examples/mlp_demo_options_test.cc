// mlp_demo's flags for the model variants (--vocab, --lora, --recompute and
// the adapter groups), the runs that refuse them, and the schedule a run
// length derives (a one-step run is valid; longer runs keep their warm-up).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "examples/mlp/demo_options.h"
#include "examples/mlp/demo_resources.h"
#include "gtest/gtest.h"
#include "zeroshard/buffer_plan.h"

namespace zeroshard {
namespace mlp {
namespace {

absl::StatusOr<DemoOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "mlp_demo");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  bool help = false;
  return ParseDemoFlags(static_cast<int>(argv.size()), argv.data(), &help);
}

TEST(DemoOptions, OneStepRunIsValid) {
  absl::StatusOr<DemoOptions> opts = Parse({"--steps", "1"});
  ASSERT_TRUE(opts.ok()) << opts.status();
  const TrainSpec train = MakeTrainSpec(*opts, opts->stage, opts->accum);
  EXPECT_TRUE(train.Validate().ok()) << train.Validate();
  EXPECT_EQ(train.schedule.warmup_steps, 0);
  EXPECT_EQ(train.schedule.total_steps, 1);
}

// From two steps on, the warm-up is what it always was: 5% of the steps,
// at least one.
TEST(DemoOptions, LongerRunsKeepTheirWarmup) {
  for (int64_t steps : {2, 3, 19, 20, 21, 39, 40, 200, 1000, 12345}) {
    DemoOptions opts;
    opts.steps = steps;
    const TrainSpec train = MakeTrainSpec(opts, 2, 1);
    EXPECT_EQ(train.schedule.warmup_steps, std::max<int64_t>(1, steps / 20)) << steps;
    EXPECT_TRUE(train.Validate().ok()) << steps;
  }
}

TEST(DemoOptions, VariantFlagsSetTheModel) {
  absl::StatusOr<DemoOptions> opts =
      Parse({"--vocab", "64", "--lora", "4", "--lora-alpha", "8", "--adapter-lr-scale", "2",
             "--adapter-weight-decay=0.5", "--recompute"});
  ASSERT_TRUE(opts.ok()) << opts.status();
  EXPECT_EQ(opts->model.vocab, 64);
  EXPECT_EQ(opts->model.lora_rank, 4);
  EXPECT_EQ(opts->model.LoraScale(), 2.0f);
  EXPECT_EQ(opts->model.adapter_lr_scale, 2.0);
  ASSERT_TRUE(opts->model.adapter_weight_decay.has_value());
  EXPECT_EQ(*opts->model.adapter_weight_decay, 0.5);
  EXPECT_TRUE(opts->model.recompute);
  // The spec carries the groups: adapters with lr_scale and their decay,
  // the base frozen, the head tied to the embedding.
  const ModelSpec spec = BuildModelSpec(opts->model);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  ASSERT_EQ(spec.units.size(), 2u + opts->model.blocks);
  EXPECT_EQ(spec.units.front().name, "embed");
  EXPECT_FALSE(spec.units.front().params[0].trainable);
  const ParamSpec& head = spec.units.back().params[kHeadWeight];
  ASSERT_TRUE(head.tied_to.has_value());
  EXPECT_EQ(head.tied_to->unit, "embed");
  const UnitSpec& block = spec.units[1];
  ASSERT_EQ(block.params.size(), static_cast<size_t>(kNumLoraBlockParams));
  EXPECT_FALSE(block.params[kW1].trainable);
  EXPECT_TRUE(block.params[kLoraA1].trainable);
  EXPECT_EQ(block.params[kLoraB2].lr_scale, 2.0);
  EXPECT_EQ(block.params[kLoraB2].weight_decay, 0.5);
}

TEST(DemoOptions, MachineLetsThePlannerChooseTheTier) {
  absl::StatusOr<DemoOptions> opts =
      Parse({"--mem-cap", "16MiB", "--machine", "m.json", "--offload-dir", "/scratch/swap"});
  ASSERT_TRUE(opts.ok()) << opts.status();
  EXPECT_EQ(opts->machine, "m.json");
  EXPECT_TRUE(ChoosesOffload(*opts));
  // The planner may choose nvme: its directory is accepted before the choice.
  EXPECT_EQ(opts->offload.dir, "/scratch/swap");
  EXPECT_EQ(opts->offload.optimizer, MemoryTier::kDevice);
  // Without --machine the tier stays the device's, and --offload-dir alone
  // is refused as before.
  absl::StatusOr<DemoOptions> no_machine = Parse({"--mem-cap", "16MiB", "--offload-dir", "/x"});
  ASSERT_FALSE(no_machine.ok());
  EXPECT_NE(no_machine.status().message().find("--offload-dir"), std::string::npos);
  // A tier given by hand is refused with --mem-cap: the planner chooses it.
  absl::StatusOr<DemoOptions> both =
      Parse({"--mem-cap", "16MiB", "--machine", "m.json", "--offload", "optimizer=host"});
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("chooses the optimizer's tier itself"), std::string::npos)
      << both.status();
}

TEST(DemoOptions, RefusesVariantsWhereTheyDoNotRun) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const Case cases[] = {
      {{"--vocab", "32", "--tp", "2"}, "--vocab"},
      {{"--lora", "2", "--pp", "2"}, "--lora"},
      {{"--recompute", "--mem-cap", "16MiB"}, "--recompute"},
      {{"--lora", "2", "--device", "cuda"}, "--lora"},
      {{"--lora-alpha", "4"}, "give --lora R"},
      {{"--adapter-lr-scale", "3"}, "give --lora R"},
      {{"--vocab", "1"}, "--vocab"},
      {{"--machine", "machine.json"}, "give it with --mem-cap SIZE"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DemoOptions> opts = Parse(c.args);
    ASSERT_FALSE(opts.ok()) << c.args[0];
    EXPECT_NE(opts.status().message().find(c.says), std::string::npos) << opts.status();
  }
}

// --lora above --hidden is refused naming both; --lora = --hidden is the
// largest rank accepted.
TEST(DemoOptions, LoraRankIsAtMostTheWidth) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t hidden = std::uniform_int_distribution<int64_t>(4, 512)(rng);
  const int64_t lora = std::uniform_int_distribution<int64_t>(hidden + 1, 2 * hidden)(rng);
  absl::StatusOr<DemoOptions> refused =
      Parse({"--hidden", std::to_string(hidden), "--lora", std::to_string(lora)});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(std::to_string(lora) + " exceeds the hidden width " +
                                            std::to_string(hidden)),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(Parse({"--hidden", std::to_string(hidden), "--lora", std::to_string(hidden)}).ok());
}

// The memory check: the engine's part is the planner's, and a machine one
// byte short of the estimate refuses the run naming both figures.
TEST(DemoResources, EstimateIsThePlannersAndTheMachineBoundsIt) {
  std::mt19937_64 rng(std::random_device{}());
  auto draw = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t hidden = 8 * draw(1, 32);
    std::vector<std::string> args = {
        "--hidden",      std::to_string(hidden),      "--blocks", std::to_string(draw(1, 6)),
        "--micro-batch", std::to_string(draw(1, 64)), "--ranks",  std::to_string(draw(1, 8)),
        "--stage",       std::to_string(draw(0, 3))};
    if (draw(0, 1) == 1) {
      args.insert(args.end(), {"--vocab", std::to_string(draw(2, 500)), "--lora",
                               std::to_string(draw(1, hidden))});
    }
    absl::StatusOr<DemoOptions> opts = Parse(args);
    ASSERT_TRUE(opts.ok()) << opts.status();
    absl::StatusOr<DemoMemoryEstimate> e = EstimateDemoMemory(*opts, opts->ranks, opts->ranks);
    ASSERT_TRUE(e.ok()) << e.status();
    absl::StatusOr<BufferPlan> plan = PlanEngineBuffers(
        BuildModelSpec(opts->model), MakeTrainSpec(*opts, opts->stage, opts->accum), opts->ranks);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(e->engine_bytes, static_cast<double>(plan->total_bytes()));
    EXPECT_GE(e->trainer_bytes, MlpTrainer::PlannedActivationBytes(opts->model));
    const double total = e->total_bytes();
    EXPECT_GE(total, opts->ranks * (e->engine_bytes + e->trainer_bytes));
    examples::MachineMemory machine{static_cast<int64_t>(std::floor(total)) - 1, "a test machine"};
    const absl::Status refused = CheckDemoMemory(*opts, opts->ranks, opts->ranks, machine);
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
    for (const std::string& part :
         {"the run needs about " + examples::FormatBytes(total),
          "this machine has " + examples::FormatBytes(static_cast<double>(machine.bytes)) +
              " (a test machine)",
          std::string("--hidden")}) {
      EXPECT_NE(refused.message().find(part), std::string::npos) << part << ": " << refused;
    }
    machine.bytes = static_cast<int64_t>(std::ceil(total));
    EXPECT_TRUE(CheckDemoMemory(*opts, opts->ranks, opts->ranks, machine).ok());
  }
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard
