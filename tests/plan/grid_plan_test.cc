// PlanGrid: which (tp, pp, dp, stage) candidates exist, their exact per-rank
// bytes (PlanEngineBuffers on every grid position's shard spec), the
// preference order and the choice under a cap, and the error when nothing
// fits. The engine's ledger is checked against these figures in
// grid_vs_ledger_test.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "gtest/gtest.h"
#include "tests/grid_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

TrainSpec BaseTrain() {
  TrainSpec train;
  train.precision = Precision::kBf16Mixed;
  train.grad_accum_steps = 2;
  return train;
}

absl::StatusOr<GridPlan> PlanFor(const ModelSpec& model, int world, int64_t cap) {
  return PlanGrid(model, BaseTrain(), world, cap);
}

TEST(PlanGridTest, CandidatesAreTheValidSplitsSizedOnEveryGridPosition) {
  // 4h = 20: tp 1, 2, 4 divide every split dimension, 8 does not; 3 units
  // allow pp 1 and 2 of the divisors of 8 / tp.
  const ModelSpec model = testing::MlpGridSpec(3, 5);
  auto plan = PlanFor(model, 8, int64_t{1} << 40);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::set<std::pair<int, int>> splits;
  for (const GridCandidate& c : plan->candidates) {
    splits.insert({c.tp, c.pp});
    EXPECT_EQ(c.tp * c.pp * c.dp, 8) << c.Label();
    ASSERT_EQ(static_cast<int>(c.stage_bytes.size()), c.pp);
    int64_t worst = 0;
    for (int pp_rank = 0; pp_rank < c.pp; ++pp_rank) {
      // Every tp rank of the stage: the plan's one figure is each one's bytes.
      for (int tp_rank = 0; tp_rank < c.tp; ++tp_rank) {
        auto shard = ShardModelSpec(model, c.tp, tp_rank, c.pp, pp_rank);
        ASSERT_TRUE(shard.ok()) << shard.status();
        TrainSpec train = BaseTrain();
        train.zero_stage = c.stage;
        // The grid keeps the dp-only run's global batch: accum x tp x pp.
        train.grad_accum_steps *= c.tp * c.pp;
        auto buffers = PlanEngineBuffers(*shard, train, c.dp);
        ASSERT_TRUE(buffers.ok()) << buffers.status();
        EXPECT_EQ(c.stage_bytes[pp_rank], buffers->total_bytes())
            << c.Label() << ", tp rank " << tp_rank << ", pp rank " << pp_rank;
      }
      worst = std::max(worst, c.stage_bytes[pp_rank]);
    }
    EXPECT_EQ(c.per_rank_bytes, worst) << c.Label();
    EXPECT_EQ(c.stage_bytes[c.worst_pp_stage], worst) << c.Label();
  }
  const std::set<std::pair<int, int>> expected = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 1}, {4, 2}};
  EXPECT_EQ(splits, expected);
  EXPECT_EQ(plan->candidates.size(), 4 * expected.size());
  // A large cap: stage 0 alone.
  EXPECT_EQ(plan->chosen, 0);
  EXPECT_EQ(plan->chosen_candidate().Label(), "tp 1 x pp 1 x dp 8, stage 0");
}

TEST(PlanGridTest, PrefersShardingThenFewestModelParallelRanksThenTpThenLowestStage) {
  const ModelSpec model = testing::MlpGridSpec(4, 32);
  auto all = PlanFor(model, 8, int64_t{1} << 40);
  ASSERT_TRUE(all.ok()) << all.status();
  const auto& c = all->candidates;
  for (size_t i = 1; i < c.size(); ++i) {
    EXPECT_LE(std::make_tuple(c[i - 1].tp * c[i - 1].pp, -c[i - 1].tp, c[i - 1].stage),
              std::make_tuple(c[i].tp * c[i].pp, -c[i].tp, c[i].stage))
        << c[i - 1].Label() << " before " << c[i].Label();
  }
  ASSERT_EQ(c[0].Label(), "tp 1 x pp 1 x dp 8, stage 0");
  ASSERT_EQ(c[3].Label(), "tp 1 x pp 1 x dp 8, stage 3");
  ASSERT_EQ(c[4].Label(), "tp 2 x pp 1 x dp 4, stage 0");
  ASSERT_EQ(c[8].Label(), "tp 1 x pp 2 x dp 4, stage 0");
  // Every cap from just below each candidate's need: the choice is the first
  // candidate in this order that fits, and nothing before it fits.
  for (const GridCandidate& target : c) {
    for (int64_t cap : {target.per_rank_bytes, target.per_rank_bytes - 1}) {
      auto plan = PlanFor(model, 8, cap);
      if (!plan.ok()) {
        EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
        for (const GridCandidate& other : c) EXPECT_GT(other.per_rank_bytes, cap);
        continue;
      }
      const int chosen = plan->chosen;
      EXPECT_LE(plan->chosen_candidate().per_rank_bytes, cap);
      EXPECT_TRUE(plan->candidates[chosen].fits);
      for (int i = 0; i < chosen; ++i) {
        EXPECT_GT(plan->candidates[i].per_rank_bytes, cap) << plan->candidates[i].Label();
        EXPECT_FALSE(plan->candidates[i].fits);
      }
    }
  }
  // Stage 1 alone: the description says what stage 0 needed.
  auto stage1 = PlanFor(model, 8, c[1].per_rank_bytes);
  ASSERT_TRUE(stage1.ok()) << stage1.status();
  EXPECT_EQ(stage1->chosen_candidate().Label(), "tp 1 x pp 1 x dp 8, stage 1");
  EXPECT_NE(stage1->description.find("; stage 0 alone need >= "), std::string::npos)
      << stage1->description;
}

TEST(PlanGridTest, FallsBackToTensorBeforePipelineWhenShardingAloneDoesNotFit) {
  // World 2: sharding alone (dp 2) or tp 2 / pp 2 with dp 1.
  const ModelSpec model = testing::MlpGridSpec(2, 64);
  auto all = PlanFor(model, 2, int64_t{1} << 40);
  ASSERT_TRUE(all.ok()) << all.status();
  int64_t alone = int64_t{1} << 62;
  int64_t tp2 = alone;
  int64_t pp2 = alone;
  for (const GridCandidate& c : all->candidates) {
    if (c.tp * c.pp == 1) alone = std::min(alone, c.per_rank_bytes);
    if (c.tp == 2) tp2 = std::min(tp2, c.per_rank_bytes);
    if (c.pp == 2) pp2 = std::min(pp2, c.per_rank_bytes);
  }
  // Both splits need less than sharding over 2 ranks at stage 3 (the stage 3
  // gather buffers of whole units), so a cap between them picks one.
  ASSERT_LT(std::max(tp2, pp2), alone);
  auto plan = PlanFor(model, 2, std::max(tp2, pp2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chosen_candidate().tp, 2) << plan->description;
  EXPECT_EQ(plan->chosen_candidate().pp, 1) << plan->description;
  std::printf("%s\n", plan->description.c_str());
  EXPECT_NE(plan->description.find("tp 2 x pp 1 x dp 1, stage "), std::string::npos);
  EXPECT_NE(plan->description.find("; stages 0-3 alone need >= "), std::string::npos)
      << plan->description;
}

TEST(PlanGridTest, NothingFitsIsResourceExhaustedWithTheSmallestNeed) {
  const ModelSpec model = testing::MlpGridSpec(2, 64);
  auto plan = PlanFor(model, 4, 1024);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(plan.status().message());
  EXPECT_NE(message.find("nothing fits 1.0 KiB per rank on 4 ranks"), std::string::npos) << message;
  EXPECT_NE(message.find("the smallest need is "), std::string::npos) << message;
  EXPECT_NE(message.find("would fit it"), std::string::npos) << message;
  EXPECT_EQ(PlanFor(model, 0, 1024).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanFor(model, 4, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// Every tier, every split: the three per-tier figures are the engine's own
// PlanEngineBuffers with TrainSpec::offload.optimizer set, on every pipeline
// stage's shard; the offloaded optimizer leaves the device.
TEST(PlanGridTest, OffloadCandidatesArePlanEngineBuffersPerTier) {
  std::mt19937_64 rng(testing::Seed());
  const int units = 2 + static_cast<int>(rng() % 3);
  const int64_t h = 8 * (1 + static_cast<int64_t>(rng() % 6));
  const ModelSpec model = testing::MlpGridSpec(units, h);
  TrainSpec base = BaseTrain();
  base.offload.chunk_numel = 1024 * (1 + static_cast<int64_t>(rng() % 4));
  GridOptions options;
  options.optimizer_tiers = {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme};
  auto plan = PlanGrid(model, base, 4, int64_t{1} << 40, options);
  ASSERT_TRUE(plan.ok()) << plan.status() << " " << testing::SeedTrace();
  std::map<std::tuple<int, int, int, int>, int64_t> device_bytes;  // (tp, pp, stage, tier)
  int per_tier[3] = {0, 0, 0};
  for (const GridCandidate& c : plan->candidates) {
    ++per_tier[static_cast<int>(c.optimizer_tier)];
    int64_t host = 0, nvme = 0;
    for (int pp_rank = 0; pp_rank < c.pp; ++pp_rank) {
      auto shard = ShardModelSpec(model, c.tp, 0, c.pp, pp_rank);
      ASSERT_TRUE(shard.ok()) << shard.status();
      TrainSpec train = base;
      train.zero_stage = c.stage;
      train.grad_accum_steps *= c.tp * c.pp;
      train.offload.optimizer = c.optimizer_tier;
      auto buffers = PlanEngineBuffers(*shard, train, c.dp);
      ASSERT_TRUE(buffers.ok()) << buffers.status();
      EXPECT_EQ(c.stage_bytes[pp_rank], buffers->total_bytes(MemoryTier::kDevice)) << c.Label();
      host = std::max(host, buffers->total_bytes(MemoryTier::kHost));
      nvme = std::max(nvme, buffers->total_bytes(MemoryTier::kNvme));
      const TrainSpec grid_train = GridTrainSpec(base, c);
      EXPECT_EQ(grid_train.offload.optimizer, c.optimizer_tier);
      EXPECT_EQ(grid_train.grad_accum_steps, train.grad_accum_steps);
    }
    EXPECT_EQ(c.host_bytes, host) << c.Label() << " " << testing::SeedTrace();
    EXPECT_EQ(c.nvme_bytes, nvme) << c.Label();
    switch (c.optimizer_tier) {
      case MemoryTier::kDevice:
        EXPECT_EQ(c.host_bytes, 0) << c.Label();
        EXPECT_EQ(c.nvme_bytes, 0) << c.Label();
        break;
      case MemoryTier::kHost:
        EXPECT_GT(c.host_bytes, 0) << c.Label();
        EXPECT_EQ(c.nvme_bytes, 0) << c.Label();
        EXPECT_NE(c.Label().find(", optimizer on host"), std::string::npos) << c.Label();
        break;
      default:
        EXPECT_GT(c.nvme_bytes, 0) << c.Label();
        EXPECT_GT(c.host_bytes, 0) << c.Label();  // the streaming chunks
        break;
    }
    device_bytes[{c.tp, c.pp, c.stage, static_cast<int>(c.optimizer_tier)}] = c.per_rank_bytes;
  }
  EXPECT_EQ(per_tier[0], per_tier[1]);
  EXPECT_EQ(per_tier[0], per_tier[2]);
  for (const auto& [key, bytes] : device_bytes) {
    const auto [tp, pp, stage, tier] = key;
    if (tier == 0) continue;
    // bf16: the fp32 master and both moments (12 bytes per param of the
    // shard) leave the device.
    EXPECT_LT(bytes, device_bytes.at({tp, pp, stage, 0}))
        << "tp " << tp << " pp " << pp << " stage " << stage << " tier " << tier;
  }
}

// The cap of the test below: every tensor/pipeline split's smallest need,
// and, at that cap, offload and a split fit while no device-tier
// sharding-alone candidate does.
struct TimeChoiceSetup {
  ModelSpec model = testing::MlpGridSpec(4, 32);
  GridOptions options;
  int64_t cap = 0;
};

TimeChoiceSetup MakeTimeChoiceSetup() {
  TimeChoiceSetup s;
  s.options.optimizer_tiers = {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme};
  auto all = PlanGrid(s.model, BaseTrain(), 4, int64_t{1} << 40, s.options);
  if (!all.ok()) return s;
  s.cap = int64_t{1} << 62;
  for (const GridCandidate& c : all->candidates) {
    if (c.model_parallel_ranks() > 1 && c.optimizer_tier == MemoryTier::kDevice) {
      s.cap = std::min(s.cap, c.per_rank_bytes);
    }
  }
  return s;
}

TEST(PlanGridTest, PicksTheFastestFitByTheStepTimeModel) {
  TimeChoiceSetup s = MakeTimeChoiceSetup();
  ASSERT_GT(s.cap, 0);
  std::mt19937_64 rng(testing::Seed());
  std::uniform_real_distribution<double> jitter(0.0, 0.1);
  const double offload_s = 1.0 + jitter(rng);
  const double split_s = 2.0 + jitter(rng);
  // A fake time model: offload cheap, splits dear; and the other way round.
  for (bool offload_faster : {true, false}) {
    GridOptions options = s.options;
    options.step_time = [&](const GridCandidate& c) -> absl::StatusOr<double> {
      const bool offloaded = c.optimizer_tier != MemoryTier::kDevice;
      const bool split = c.model_parallel_ranks() > 1;
      double t = 5.0 + 0.01 * c.stage;
      if (offloaded && !split) t = offload_faster ? offload_s : split_s + 1.0;
      if (split && !offloaded) t = offload_faster ? split_s : offload_s - 0.5;
      return t + 0.001 * c.stage;
    };
    auto plan = PlanGrid(s.model, BaseTrain(), 4, s.cap, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(plan->by_time);
    bool offload_fits = false, device_alone_fits = false;
    for (const GridCandidate& c : plan->candidates) {
      EXPECT_TRUE(std::isfinite(c.step_seconds)) << c.Label();
      EXPECT_FALSE(c.reason.empty()) << c.Label();
      if (c.model_parallel_ranks() == 1) {
        if (c.optimizer_tier == MemoryTier::kDevice) device_alone_fits |= c.fits;
        if (c.optimizer_tier != MemoryTier::kDevice) offload_fits |= c.fits;
      }
    }
    ASSERT_TRUE(offload_fits) << "the test's cap must let offload fit";
    ASSERT_FALSE(device_alone_fits) << "the test's cap must exclude sharding alone";
    const GridCandidate& chosen = plan->chosen_candidate();
    // The fastest fit: no fitting candidate is faster.
    for (const GridCandidate& c : plan->candidates) {
      if (c.fits) EXPECT_GE(c.step_seconds, chosen.step_seconds) << c.Label();
      if (!c.fits) EXPECT_NE(c.reason.find("over the cap by"), std::string::npos) << c.reason;
    }
    EXPECT_EQ(chosen.reason, "chosen: the fastest that fits");
    if (offload_faster) {
      EXPECT_NE(chosen.optimizer_tier, MemoryTier::kDevice) << chosen.Label();
      EXPECT_EQ(chosen.model_parallel_ranks(), 1) << chosen.Label();
    } else {
      EXPECT_EQ(chosen.optimizer_tier, MemoryTier::kDevice) << chosen.Label();
      EXPECT_GT(chosen.model_parallel_ranks(), 1) << chosen.Label();
    }
    EXPECT_NE(plan->description.find("the fastest of "), std::string::npos) << plan->description;
  }
}

TEST(PlanGridTest, ABadStepTimeIsRefusedNamingTheCandidate) {
  TimeChoiceSetup s = MakeTimeChoiceSetup();
  GridOptions options = s.options;
  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), -1.0, std::numeric_limits<double>::infinity()}) {
    options.step_time = [bad](const GridCandidate& c) -> absl::StatusOr<double> {
      return c.optimizer_tier == MemoryTier::kNvme ? bad : 1.0;
    };
    auto plan = PlanGrid(s.model, BaseTrain(), 4, s.cap, options);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("optimizer on nvme"), std::string::npos)
        << plan.status();
  }
  options.step_time = [](const GridCandidate&) -> absl::StatusOr<double> {
    return absl::NotFoundError("no nvme rates in the profile");
  };
  auto plan = PlanGrid(s.model, BaseTrain(), 4, s.cap, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(plan.status().message().find("no nvme rates"), std::string::npos) << plan.status();
  options.optimizer_tiers.clear();
  EXPECT_EQ(PlanGrid(s.model, BaseTrain(), 4, s.cap, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A trainer's own split (GridOptions::shard_spec): each position is sized
// from the spec it returns (here ShardModelSpec's plus a unit only stage 0
// holds, as the GPT's tied alias), and a split it refuses with
// InvalidArgument (here tp 4) is no candidate; another error is PlanGrid's.
TEST(PlanGridTest, ATrainersShardSpecSizesEachPositionAndRefusesSplits) {
  const ModelSpec model = testing::MlpGridSpec(3, 5);
  GridOptions options;
  options.shard_spec = [&model](int tp, int pp, int pp_rank) -> absl::StatusOr<ModelSpec> {
    if (tp == 4) return absl::InvalidArgumentError("tp 4 does not divide the heads");
    ZS_ASSIGN_OR_RETURN(ModelSpec shard, ShardModelSpec(model, tp, 0, pp, pp_rank));
    if (pp_rank == 0) {
      UnitSpec extra;
      extra.name = "stage0_extra";
      extra.params.push_back({"w", {7, 3}});
      shard.units.push_back(extra);
    }
    return shard;
  };
  auto plan = PlanGrid(model, BaseTrain(), 8, int64_t{1} << 40, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::set<std::pair<int, int>> splits;
  for (const GridCandidate& c : plan->candidates) {
    splits.insert({c.tp, c.pp});
    for (int pp_rank = 0; pp_rank < c.pp; ++pp_rank) {
      auto shard = options.shard_spec(c.tp, c.pp, pp_rank);
      ASSERT_TRUE(shard.ok());
      auto buffers = PlanEngineBuffers(*shard, GridTrainSpec(BaseTrain(), c), c.dp);
      ASSERT_TRUE(buffers.ok()) << buffers.status();
      EXPECT_EQ(c.stage_bytes[pp_rank], buffers->total_bytes())
          << c.Label() << ", pp rank " << pp_rank;
    }
  }
  const std::set<std::pair<int, int>> expected = {{1, 1}, {1, 2}, {2, 1}, {2, 2}};
  EXPECT_EQ(splits, expected);
  options.shard_spec = [](int, int, int) -> absl::StatusOr<ModelSpec> {
    return absl::InternalError("broken trainer");
  };
  EXPECT_EQ(PlanGrid(model, BaseTrain(), 8, int64_t{1} << 40, options).status().code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace zeroshard
