// The step-time split (StepTimes, zeroshard/engine.h): every part >= 0 and
// the parts add up to the total exactly, on every rank and every step:
// StepTimeline on a fake clock (exact values), then the engine on 1-4 local
// ranks, stages 0-3, with accumulation, ranks that arrive late at Start,
// honest and dishonest wait reports, and the steps after a Save, a GetParam
// and a Load.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/src/runtime/step_timeline.h"
#include "gtest/gtest.h"
#include "tests/runtime/synthetic_trainer.h"
#include "zeroshard/communicator.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

using internal::StepTimeline;

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(ms); }

// Every part >= 0, the six add up to the total, hidden = busy - exposed
// clamped (per step; a sum of steps holds the sum of the clamped values).
void ExpectHonest(const StepTimes& t, const std::string& where, bool totals = false) {
  const std::pair<const char*, absl::Duration> parts[] = {
      {"compute", t.compute},           {"exposed_comm", t.exposed_comm},
      {"optimizer", t.optimizer},       {"input_wait", t.input_wait},
      {"engine_other", t.engine_other}, {"pipeline_bubble", t.pipeline_bubble}};
  absl::Duration sum;
  for (const auto& [name, d] : parts) {
    EXPECT_GE(d, absl::ZeroDuration()) << where << ": " << name << " " << d;
    sum += d;
  }
  EXPECT_EQ(sum, t.total) << where << ": compute " << t.compute << " exposed " << t.exposed_comm
                          << " optimizer " << t.optimizer << " input " << t.input_wait << " other "
                          << t.engine_other << " bubble " << t.pipeline_bubble;
  const absl::Duration hidden = std::max(absl::ZeroDuration(), t.comm_busy - t.exposed_comm);
  if (totals) {
    EXPECT_GE(t.hidden_comm, hidden) << where;
  } else {
    EXPECT_EQ(t.hidden_comm, hidden) << where;
  }
  EXPECT_GE(t.unplaced_wait, absl::ZeroDuration()) << where;
}

// The fake clock of the StepTimeline tests (one thread).
absl::Duration fake_now;
absl::Duration FakeNow() { return fake_now; }

TEST(StepTimelineTest, BooksEachIntervalOnceAndClampsReportedWaits) {
  fake_now = Ms(1000);
  StepTimeline tl(&FakeNow);
  // Before BeginSteps (Load, Start's exchanges): no step's.
  tl.EnterCall();
  fake_now += Ms(50);
  tl.AddCommWait(Ms(40));
  tl.ExitCall();
  tl.AddInputWait(Ms(500));
  tl.BeginSteps();  // t = 1050

  fake_now += Ms(10);      // trainer: 10 ms, all of it waiting for data
  tl.AddInputWait(Ms(4));  // honest
  tl.AddInputWait(Ms(9));  // 6 of the 10 ms are unclaimed: 3 ms too many
  tl.EnterCall();          // a call with a nested call (Save -> WaitForCheckpoint)
  fake_now += Ms(2);
  tl.EnterCall();
  fake_now += Ms(3);
  tl.AddCommWait(Ms(3));
  tl.ExitCall();
  fake_now += Ms(1);
  tl.ExitCall();               // 6 ms engine, 3 of them comm
  tl.AddPipelineWait(Ms(5));   // overlapped the call: nothing outside is left
  fake_now += Ms(7);           // trainer compute
  tl.AddPipelineWait(Ms(-1));  // ignored
  tl.EnterCall();              // Step
  fake_now += Ms(4);
  tl.AddOptimizer(Ms(4));
  const StepTimes t = tl.EndStep(Ms(8));  // t = 1077
  fake_now += Ms(1);                      // Step's tail: the next step's
  tl.ExitCall();

  EXPECT_EQ(t.total, Ms(27));
  EXPECT_EQ(t.input_wait, Ms(10));
  EXPECT_EQ(t.pipeline_bubble, Ms(0));
  EXPECT_EQ(t.exposed_comm, Ms(3));
  EXPECT_EQ(t.optimizer, Ms(4));
  EXPECT_EQ(t.engine_other, Ms(3));
  EXPECT_EQ(t.compute, Ms(7));
  EXPECT_EQ(t.comm_busy, Ms(8));
  EXPECT_EQ(t.hidden_comm, Ms(5));
  EXPECT_EQ(t.unplaced_wait, Ms(3 + 5));
  ExpectHonest(t, "step 1");

  fake_now += Ms(2);
  const absl::Duration before_call = fake_now;
  tl.EnterCall();
  fake_now += Ms(1);
  tl.AddCommWait(Ms(1));
  const StepTimes t2 = tl.EndStep(Ms(0));
  tl.ExitCall();
  EXPECT_EQ(t2.total, Ms(4));
  EXPECT_EQ(t2.engine_other, Ms(1));  // step 1's tail
  EXPECT_EQ(t2.exposed_comm, Ms(1));
  EXPECT_EQ(t2.compute, before_call - Ms(1078));  // from Step's end
  EXPECT_EQ(t2.hidden_comm, Ms(0));
  ExpectHonest(t2, "step 2");
}

// One step of the synthetic model with the trainer's own time and waits:
// reports that are true (after a sleep outside the engine) and reports that
// are not (a wait never waited, one that spans GradView).
absl::StatusOr<StepResult> StepWithWaits(Engine& engine, const ModelSpec& spec) {
  engine.RecordInputWait(Ms(30));  // not waited: the step holds almost nothing yet
  absl::SleepFor(absl::Microseconds(300));
  engine.RecordInputWait(absl::Microseconds(200));
  const int units = static_cast<int>(spec.units.size());
  for (int micro = 0; micro < engine.train().grad_accum_steps; ++micro) {
    for (int u = 0; u < units; ++u) {
      ZS_RETURN_IF_ERROR(engine.Gather(u).status());
      ZS_RETURN_IF_ERROR(engine.Release(u));
    }
    for (int u = units - 1; u >= 0; --u) {
      ZS_RETURN_IF_ERROR(engine.Gather(u).status());
      const absl::Time spans_grad_view = absl::Now();
      ZS_ASSIGN_OR_RETURN(UnitView grads, engine.GradView(u));
      for (const TensorView& v : grads.params) {
        for (int64_t i = 0; i < v.numel; ++i) v.as<float>()[i] = 1e-3f * ((i + u + micro) % 7);
      }
      engine.RecordPipelineWait(absl::Now() - spans_grad_view);
      ZS_RETURN_IF_ERROR(engine.ReduceGrads(u));
      ZS_RETURN_IF_ERROR(engine.Release(u));
    }
  }
  return engine.Step();
}

// Rank 0 reaches Start (and each step) late, so the others wait inside
// Start() and in the step's collectives.
void LateOnRankZero(const Communicator& comm, absl::Duration d) {
  if (comm.rank() == 0) absl::SleepFor(d);
}

std::string TempDir() {
  char pattern[] = "/tmp/zs_step_times_XXXXXX";
  const char* dir = mkdtemp(pattern);
  return dir == nullptr ? std::string() : std::string(dir);
}

class StepTimesInvariantTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(StepTimesInvariantTest, PartsAreNonNegativeAndAddUpOnEveryRankAndStep) {
  const auto [stage, world, accum] = GetParam();
  const ModelSpec spec = testing::SyntheticSpec();
  const TrainSpec train = testing::SyntheticTrain(stage, Precision::kFp32, accum);
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  constexpr int kSteps = 4;

  // Fresh start, a Save between steps 2 and 3 (its time is step 3's), a
  // GetParam between steps 3 and 4.
  absl::Status run = RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
    for (size_t u = 0; u < spec.units.size(); ++u) {
      for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
        ZS_RETURN_IF_ERROR(engine->SetParam(static_cast<int>(u), static_cast<int>(p),
                                            testing::SyntheticInit(spec, u, p)));
      }
    }
    engine->RecordInputWait(absl::Seconds(1));  // before Start: no step's
    LateOnRankZero(comm, Ms(20));
    ZS_RETURN_IF_ERROR(engine->Start());
    for (int step = 1; step <= kSteps; ++step) {
      LateOnRankZero(comm, Ms(2));
      ZS_RETURN_IF_ERROR(StepWithWaits(*engine, spec).status());
      const StepTimes t = engine->Stats().last;
      ExpectHonest(t, absl::StrFormat("rank %d step %d", rank, step));
      // The trainer's 300 us sleep is outside the engine.
      EXPECT_GE(t.compute + t.input_wait + t.pipeline_bubble, absl::Microseconds(300));
      EXPECT_GT(t.unplaced_wait, absl::ZeroDuration()) << "the 30 ms never waited";
      if (step == 2) ZS_RETURN_IF_ERROR(engine->Save(dir, "{}"));
      if (step == 3) {
        ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
        ZS_RETURN_IF_ERROR(engine->GetParam(0, 0).status());
      }
    }
    const EngineStats stats = engine->Stats();
    EXPECT_EQ(stats.steps, kSteps);
    ExpectHonest(stats.totals, absl::StrFormat("rank %d totals", rank), /*totals=*/true);
    return engine->WaitForCheckpoint();
  });
  ASSERT_TRUE(run.ok()) << run;

  // Resumed from the checkpoint: the Load and the late Start are no step's.
  run = RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
    ZS_RETURN_IF_ERROR(engine->Load(dir).status());
    LateOnRankZero(comm, Ms(20));
    ZS_RETURN_IF_ERROR(engine->Start());
    for (int step = 1; step <= 2; ++step) {
      ZS_RETURN_IF_ERROR(StepWithWaits(*engine, spec).status());
      ExpectHonest(engine->Stats().last, absl::StrFormat("resumed rank %d step %d", rank, step));
    }
    ExpectHonest(engine->Stats().totals, absl::StrFormat("resumed rank %d totals", rank),
                 /*totals=*/true);
    return absl::OkStatus();
  });
  ASSERT_TRUE(run.ok()) << run;
  std::system(("rm -rf '" + dir + "'").c_str());
}

INSTANTIATE_TEST_SUITE_P(StagesRanksAccum, StepTimesInvariantTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(1, 2, 3, 4), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return absl::StrFormat("stage%d_%dranks_accum%d",
                                                  std::get<0>(info.param), std::get<1>(info.param),
                                                  std::get<2>(info.param));
                         });

}  // namespace
}  // namespace zeroshard
