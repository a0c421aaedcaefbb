// Stage 3, prefetch, fp16 dynamic loss scaling and the collective-sequence
// check, on a synthetic trainer whose gradients and gather order the tests
// control.
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/runtime/synthetic_trainer.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

struct SyntheticRun {
  std::vector<std::vector<float>> params;  // rank 0, after the last step
  std::vector<StepResult> steps;           // rank 0
  std::vector<StepResult> rank1_steps;     // rank 1 (when world > 1)
  EngineStats stats;                       // rank 0
};

absl::StatusOr<SyntheticRun> RunSynthetic(int world, const TrainSpec& train, int steps,
                                          const SyntheticHooks& hooks = {}) {
  const ModelSpec spec = SyntheticSpec();
  SyntheticRun run;
  std::mutex mu;
  ZS_RETURN_IF_ERROR(RunLocalRanks(
      world,
      [&](int rank, Communicator& comm) -> absl::Status {
        auto device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
        ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
        std::vector<StepResult> results;
        for (int s = 0; s < steps; ++s) {
          ZS_ASSIGN_OR_RETURN(StepResult r, SyntheticStep(*engine, spec, hooks));
          results.push_back(r);
        }
        ZS_ASSIGN_OR_RETURN(auto params, AllParams(*engine, spec));
        std::lock_guard<std::mutex> lock(mu);
        if (rank == 0) {
          run.params = std::move(params);
          run.steps = results;
          run.stats = engine->Stats();
        }
        if (rank == 1) run.rank1_steps = results;
        return absl::OkStatus();
      },
      CommOptions{absl::Seconds(20)}));
  return run;
}

bool SameBits(const SyntheticRun& a, const SyntheticRun& b) {
  if (a.params.size() != b.params.size()) return false;
  for (size_t i = 0; i < a.params.size(); ++i) {
    if (a.params[i].size() != b.params[i].size() ||
        std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * 4) != 0) {
      return false;
    }
  }
  return true;
}

TEST(Stage3Test, BitwiseIdenticalToStagesZeroToTwoOnEveryWorldSize) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    for (int world = 1; world <= 4; ++world) {
      auto reference = RunSynthetic(world, SyntheticTrain(0, precision), 6);
      ASSERT_TRUE(reference.ok()) << reference.status();
      for (int stage = 1; stage <= 3; ++stage) {
        auto run = RunSynthetic(world, SyntheticTrain(stage, precision), 6);
        ASSERT_TRUE(run.ok()) << run.status();
        EXPECT_TRUE(SameBits(*run, *reference))
            << PrecisionName(precision) << " world " << world << " stage " << stage;
      }
    }
  }
}

TEST(Stage3Test, PrefetchDepthAndPersistentUnitsDoNotChangeTheResult) {
  TrainSpec train = SyntheticTrain(3, Precision::kBf16Mixed);
  train.prefetch_units = 0;
  auto on_demand = RunSynthetic(3, train, 6);
  ASSERT_TRUE(on_demand.ok()) << on_demand.status();
  EXPECT_FALSE(on_demand->stats.prefetch_active);
  for (int depth : {1, 2, 3}) {
    train.prefetch_units = depth;
    auto run = RunSynthetic(3, train, 6);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE(SameBits(*run, *on_demand)) << "prefetch " << depth;
    EXPECT_TRUE(run->stats.prefetch_active) << "prefetch " << depth;
  }
  // The 7-element norm unit stays replicated; the others are sharded.
  train.prefetch_units = 1;
  train.persistent_unit_numel = 64;
  auto persistent = RunSynthetic(3, train, 6);
  ASSERT_TRUE(persistent.ok()) << persistent.status();
  EXPECT_TRUE(SameBits(*persistent, *on_demand));
}

TEST(Stage3Test, ChangedGatherOrderIsAnErrorNamingTheGather) {
  TrainSpec train = SyntheticTrain(3, Precision::kFp32);
  train.prefetch_units = 2;
  SyntheticHooks swap;
  // From step 3 on, every rank gathers block.3 before block.1 in the forward.
  swap.forward_unit = [](int64_t step, int, int unit) {
    if (step < 2) return unit;
    return unit == 1 ? 3 : unit == 3 ? 1 : unit;
  };
  auto swapped = RunSynthetic(2, train, 5, swap);
  ASSERT_FALSE(swapped.ok());
  EXPECT_EQ(swapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(swapped.status().message().find(
                "Gather(block.3) at step 3: stage-3 gather 2 of the step is unit 'block.3', but "
                "the first step's was 'block.1'"),
            std::string::npos)
      << swapped.status();
  // Without prefetch there is no order to keep: the same run trains.
  train.prefetch_units = 0;
  auto on_demand = RunSynthetic(2, train, 5, swap);
  ASSERT_TRUE(on_demand.ok()) << on_demand.status();
}

TEST(SequenceCheckTest, ARankGatheringADifferentUnitFailsWithinSecondsNamingIt) {
  for (int prefetch : {0, 1}) {
    TrainSpec train = SyntheticTrain(3, Precision::kFp32);
    train.prefetch_units = prefetch;
    SyntheticHooks diverge;
    // At step 3, rank 1 gathers block.3 (same size) where the others gather block.1.
    diverge.forward_unit = [](int64_t step, int rank, int unit) {
      return step == 2 && rank == 1 && unit == 1 ? 3 : unit;
    };
    const auto begin = std::chrono::steady_clock::now();
    auto run = RunSynthetic(3, train, 5, diverge);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    ASSERT_FALSE(run.ok()) << "prefetch " << prefetch;
    EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition) << run.status();
    EXPECT_LT(seconds, 10.0) << run.status();
    const std::string message(run.status().message());
    EXPECT_NE(message.find("rank"), std::string::npos) << message;
    if (prefetch == 0) {
      // Same sizes and counts: the unit tag every gather carries tells the
      // two all-gathers apart at once (block.1 is tag 2, block.3 tag 4).
      EXPECT_TRUE(message.find("tag 4 vs 2") != std::string::npos ||
                  message.find("tag 2 vs 4") != std::string::npos)
          << message;
      EXPECT_NE(message.find("the ranks move different data"), std::string::npos) << message;
    }
    std::printf("prefetch %d: failed after %.2f s: %s\n", prefetch, seconds, message.c_str());
  }
}

// Two ranks of a synthetic run: create, start and train one step, then
// `then(rank, engine)`; the first error of any rank.
absl::Status AfterOneStep(const TrainSpec& train,
                          const std::function<absl::Status(int rank, Engine& engine)>& then) {
  const ModelSpec spec = SyntheticSpec();
  return RunLocalRanks(
      2,
      [&](int rank, Communicator& comm) -> absl::Status {
        auto device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
        ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
        ZS_RETURN_IF_ERROR(SyntheticStep(*engine, spec).status());
        return then(rank, *engine);
      },
      CommOptions{absl::Seconds(20)});
}

TEST(SequenceCheckTest, DivergenceTheCommunicatorCannotSeeIsCaughtAtTheStep) {
  // Between steps, rank 0 reads a param (GetParam: an fp32 all-gather of
  // block.1's shards, tagged with the unit) while rank 1 gathers block.1 for
  // compute: the same all-gather on the wire. Only the engine's record of
  // what each collective was for differs, and the next Step() says so.
  TrainSpec train = SyntheticTrain(3, Precision::kFp32);
  train.prefetch_units = 0;
  const ModelSpec spec = SyntheticSpec();
  const absl::Status status = AfterOneStep(train, [&](int rank, Engine& engine) -> absl::Status {
    if (rank == 0) {
      ZS_RETURN_IF_ERROR(engine.GetParam(1, 0).status());
    } else {
      ZS_RETURN_IF_ERROR(engine.Gather(1).status());
      ZS_RETURN_IF_ERROR(engine.Release(1));
    }
    return SyntheticStep(engine, spec).status();
  });
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("collective sequence check at step 2"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("rank(s) 1"), std::string::npos) << status;
}

TEST(GetParamTest, RanksAskingForDifferentUnitsOfEqualSizeAreRefused) {
  // block.1 and block.3 have the same shapes, so their stage-3 shard
  // all-gathers have the same count and dtype; the unit tag tells them apart.
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    std::vector<std::string> messages(2);
    const absl::Status status =
        AfterOneStep(SyntheticTrain(3, precision), [&](int rank, Engine& engine) -> absl::Status {
          // The same unit on every rank works...
          ZS_ASSIGN_OR_RETURN(std::vector<float> same, engine.GetParam(1, 0));
          // ...a different one fails on every rank, without a value.
          const absl::StatusOr<std::vector<float>> mixed = engine.GetParam(rank == 0 ? 1 : 3, 0);
          EXPECT_FALSE(mixed.ok()) << "rank " << rank << " got values for a mixed-up GetParam";
          messages[rank] = std::string(mixed.status().message());
          return mixed.status();
        });
    ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(messages[0].find("GetParam(block.1.w)"), std::string::npos) << messages[0];
    EXPECT_NE(messages[1].find("GetParam(block.3.w)"), std::string::npos) << messages[1];
    EXPECT_NE(messages[0].find("tag 2 vs 4"), std::string::npos) << messages[0];
    EXPECT_NE(messages[1].find("tag 4 vs 2"), std::string::npos) << messages[1];
  }
}

TrainSpec Fp16SyntheticTrain(int stage, int hysteresis) {
  TrainSpec t = SyntheticTrain(stage, Precision::kFp16Mixed);
  t.loss_scale.initial_scale = 1024;
  t.loss_scale.hysteresis = hysteresis;
  t.loss_scale.growth_interval = 1000;
  return t;
}

SyntheticHooks InjectInf(int64_t at_step, int on_rank) {
  SyntheticHooks h;
  h.after_grads = [=](int64_t step, int rank, int unit, UnitView& g) {
    if (step == at_step && rank == on_rank && unit == 1) {
      g.params[0].as<uint16_t>()[5] = 0x7c00;  // fp16 +inf
    }
  };
  return h;
}

TEST(LossScaleTest, InfOnOneRankSkipsTheStepOnAllRanksAndHalvesTheScale) {
  for (int stage : {2, 3}) {
    auto run = RunSynthetic(2, Fp16SyntheticTrain(stage, /*hysteresis=*/1), 5, InjectInf(2, 1));
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->steps.size(), 5u);
    for (const auto* steps : {&run->steps, &run->rank1_steps}) {
      for (int s = 0; s < 5; ++s) {
        EXPECT_EQ((*steps)[s].skipped, s == 2) << "stage " << stage << " step " << s + 1;
      }
      EXPECT_EQ((*steps)[2].loss_scale, 1024.0);
      EXPECT_EQ((*steps)[3].loss_scale, 512.0);
    }
    EXPECT_EQ(run->stats.skipped_steps, 1);
    EXPECT_EQ(run->stats.loss_scale, 512.0);
    // The skipped step left the weights alone: a run stopped before the bad
    // step and one stopped right after it agree bit for bit.
    auto before = RunSynthetic(2, Fp16SyntheticTrain(stage, 1), 2);
    auto through = RunSynthetic(2, Fp16SyntheticTrain(stage, 1), 3, InjectInf(2, 1));
    ASSERT_TRUE(before.ok() && through.ok());
    EXPECT_TRUE(SameBits(*before, *through)) << "the skipped step changed the weights";
  }
}

TEST(LossScaleTest, HysteresisGrowthAndMinimum) {
  // Hysteresis 2: the first overflow keeps the scale, the second halves it.
  SyntheticHooks twice;
  twice.after_grads = [](int64_t step, int rank, int unit, UnitView& g) {
    if ((step == 1 || step == 3) && rank == 0 && unit == 0) g.params[0].as<uint16_t>()[0] = 0x7e00;
  };
  auto run = RunSynthetic(2, Fp16SyntheticTrain(3, /*hysteresis=*/2), 5, twice);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->steps[1].skipped, true);
  EXPECT_EQ(run->steps[2].loss_scale, 1024.0);
  EXPECT_EQ(run->steps[4].loss_scale, 512.0);

  // Growth after growth_interval clean steps.
  TrainSpec grow = Fp16SyntheticTrain(2, 1);
  grow.loss_scale.growth_interval = 2;
  auto grown = RunSynthetic(2, grow, 5);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->steps[0].loss_scale, 1024.0);
  EXPECT_EQ(grown->steps[2].loss_scale, 2048.0);
  EXPECT_EQ(grown->steps[4].loss_scale, 4096.0);

  // Overflow on every step at the minimum scale ends in a clear error.
  TrainSpec stuck = Fp16SyntheticTrain(2, 1);
  stuck.loss_scale.min_scale = 256;
  stuck.loss_scale.max_skips_at_min_scale = 3;
  SyntheticHooks always;
  always.after_grads = [](int64_t, int rank, int unit, UnitView& g) {
    if (rank == 1 && unit == 0) g.params[0].as<uint16_t>()[0] = 0x7c00;
  };
  auto failed = RunSynthetic(2, stuck, 10, always);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("minimum loss scale"), std::string::npos)
      << failed.status();
}

TEST(LossScaleTest, Bf16SkipsNonFiniteStepsWithoutAScale) {
  SyntheticHooks nan;
  nan.after_grads = [](int64_t step, int rank, int unit, UnitView& g) {
    if (step == 1 && rank == 1 && unit == 2) g.params[0].as<uint16_t>()[3] = 0x7fc0;  // bf16 NaN
  };
  auto run = RunSynthetic(2, SyntheticTrain(3, Precision::kBf16Mixed), 3, nan);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->steps[1].skipped);
  EXPECT_FALSE(run->steps[2].skipped);
  EXPECT_EQ(run->stats.loss_scale, 1.0);
}

TEST(WeightDecayTest, NoDecayParamsAreExemptOnEveryShardLayout) {
  // With zero gradients Adam's step is exactly zero, so after one step a
  // decayed param is p * (1 - lr * wd) (in fp32) and a no_decay param is
  // unchanged, whichever rank's shard (or decay run) holds each element.
  SyntheticHooks zero;
  zero.after_grads = [](int64_t, int, int, UnitView& g) {
    for (TensorView& t : g.params) {
      std::memset(t.data, 0, static_cast<size_t>(t.numel) * DTypeSize(t.dtype));
    }
  };
  const ModelSpec spec = SyntheticSpec();
  for (int world : {1, 3, 4}) {
    for (int stage : {0, 1, 3}) {
      const TrainSpec train = SyntheticTrain(stage, Precision::kFp32);
      auto run = RunSynthetic(world, train, 1, zero);
      ASSERT_TRUE(run.ok()) << run.status();
      const float factor =
          static_cast<float>(1.0 - train.optimizer.lr * train.optimizer.weight_decay);
      size_t tensor = 0;
      for (size_t u = 0; u < spec.units.size(); ++u) {
        for (size_t p = 0; p < spec.units[u].params.size(); ++p, ++tensor) {
          const std::vector<float> init = SyntheticInit(spec, u, p);
          const bool no_decay = spec.units[u].params[p].no_decay;
          for (size_t i = 0; i < init.size(); ++i) {
            const float expected = no_decay ? init[i] : init[i] * factor;
            ASSERT_EQ(run->params[tensor][i], expected)
                << "world " << world << " stage " << stage << " " << spec.units[u].name << "."
                << spec.units[u].params[p].name << "[" << i << "]";
          }
        }
      }
    }
  }
}

// An evaluation pass between steps gathers in its own order (here the
// reverse of the step's) and sees the last step's params; with prefetch on,
// the same gathers outside eval mode fail the next step, and the run with
// eval passes ends bitwise where the run without them does.
TEST(Stage3Test, EvalPassesGatherInTheirOwnOrderAndChangeNothing) {
  const ModelSpec spec = SyntheticSpec();
  TrainSpec train = SyntheticTrain(3, Precision::kFp32);
  train.prefetch_units = 2;
  auto plain = RunSynthetic(2, train, 4);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (bool eval_mode : {true, false}) {
    std::vector<std::vector<float>> params;
    absl::Status status = RunLocalRanks(
        2,
        [&](int rank, Communicator& comm) -> absl::Status {
          auto device = CreateCpuDevice();
          ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
          ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
          const int units = static_cast<int>(spec.units.size());
          for (int s = 0; s < 4; ++s) {
            ZS_RETURN_IF_ERROR(SyntheticStep(*engine, spec).status());
            if (eval_mode) ZS_RETURN_IF_ERROR(engine->SetEvalMode(true));
            for (int u = units - 1; u >= 0; --u) {
              ZS_ASSIGN_OR_RETURN(UnitView view, engine->Gather(u));
              if (eval_mode && u == 0) {
                // The training calls are refused inside the pass.
                EXPECT_EQ(engine->GradView(u).status().code(),
                          absl::StatusCode::kFailedPrecondition);
                EXPECT_EQ(engine->SetEvalMode(false).code(), absl::StatusCode::kFailedPrecondition);
              }
              (void)view;
              ZS_RETURN_IF_ERROR(engine->Release(u));
            }
            if (eval_mode) {
              EXPECT_EQ(engine->Step().status().code(), absl::StatusCode::kFailedPrecondition);
              ZS_RETURN_IF_ERROR(engine->SetEvalMode(false));
            }
          }
          // What the eval pass saw is what GetParam gives: compare unit 1's
          // first param through a last pass.
          ZS_ASSIGN_OR_RETURN(std::vector<float> got, engine->GetParam(1, 0));
          ZS_RETURN_IF_ERROR(engine->SetEvalMode(true));
          ZS_ASSIGN_OR_RETURN(UnitView view, engine->Gather(1));
          EXPECT_EQ(std::memcmp(view.params[0].data, got.data(), got.size() * sizeof(float)), 0);
          ZS_RETURN_IF_ERROR(engine->Release(1));
          ZS_RETURN_IF_ERROR(engine->SetEvalMode(false));
          ZS_ASSIGN_OR_RETURN(auto all, AllParams(*engine, spec));
          if (rank == 0) params = std::move(all);
          EXPECT_TRUE(engine->Stats().prefetch_active);
          return absl::OkStatus();
        },
        CommOptions{absl::Seconds(20)});
    if (eval_mode) {
      ASSERT_TRUE(status.ok()) << status;
      SyntheticRun with_eval;
      with_eval.params = std::move(params);
      EXPECT_TRUE(SameBits(with_eval, *plain));
    } else {
      // The same gathers as part of the step: the order check refuses them.
      EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    }
  }
}

TEST(Stage3Test, MisuseIsAnError) {
  const ModelSpec spec = SyntheticSpec();
  absl::Status status = RunLocalRanks(2, [&](int, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine,
                        Engine::Create(spec, SyntheticTrain(3, Precision::kFp32), *device, comm));
    ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
    ZS_RETURN_IF_ERROR(engine->Gather(0).status());
    auto second = engine->Gather(1);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("block.0"), std::string::npos) << second.status();
    EXPECT_EQ(engine->Release(1).code(), absl::StatusCode::kFailedPrecondition);
    ZS_RETURN_IF_ERROR(engine->Release(0));
    TrainSpec tiny = SyntheticTrain(3, Precision::kFp32);
    tiny.max_live_gather_bytes = 100;
    auto device2 = CreateCpuDevice();
    auto refused = Engine::Create(spec, tiny, *device2, comm);
    EXPECT_NE(refused.status().message().find("max_live_gather_bytes"), std::string::npos)
        << refused.status();
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace zeroshard::testing
