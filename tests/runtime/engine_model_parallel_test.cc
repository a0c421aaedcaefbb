// The engine on tp/pp shards: the global gradient norm is that of the full
// model's gradient (replicated params counted once), every shard clips by
// the same factor, and a non-finite gradient on one shard skips the step on
// every rank.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <ostream>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/grid_test_util.h"
#include "tests/runtime/local_grid.h"
#include "tests/test_seed.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

// The elements of `full` (row-major, shape `shape`) that tp rank `tp_rank`
// of `tp` holds when dimension `dim` is split (dim < 0: all of it).
std::vector<float> TpSlice(const std::vector<float>& full, const std::vector<int64_t>& shape,
                           int dim, int tp, int tp_rank) {
  if (dim < 0 || tp == 1) return full;
  int64_t outer = 1;
  int64_t inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t chunk = shape[dim] / tp * inner;
  std::vector<float> out;
  for (int64_t o = 0; o < outer; ++o) {
    const float* begin = full.data() + o * shape[dim] * inner + tp_rank * chunk;
    out.insert(out.end(), begin, begin + chunk);
  }
  return out;
}

struct NormCase {
  int tp, pp, dp, stage;
  // Each unit starts with a replicated layer norm "ln" [h]: the split
  // params after it start at element 64 of the unit, inside a norm block,
  // so the rank that does not count "ln" sums a partial block.
  bool norm_first = false;
};

void PrintTo(const NormCase& c, std::ostream* os) {
  *os << "tp " << c.tp << " x pp " << c.pp << " x dp " << c.dp << ", stage " << c.stage
      << (c.norm_first ? ", ln first" : "");
}

ModelSpec ModelFor(const NormCase& c) {
  ModelSpec model = testing::MlpGridSpec(4, 32);
  if (c.norm_first) {
    for (UnitSpec& unit : model.units) {
      unit.params.insert(unit.params.begin(), ParamSpec{"ln", {32}, true, -1});
    }
  }
  return model;
}

struct RankStep {
  StepResult result;
  bool ran = false;
};

// Runs one step of the grid with every rank writing its slice of `grads`
// (full model, [unit][param]); `poison` (world rank, or -1) writes a NaN
// into its first gradient element instead.
absl::StatusOr<std::vector<RankStep>> StepGrid(
    const ModelSpec& model, const NormCase& c,
    const std::vector<std::vector<std::vector<float>>>& grads, int poison) {
  const GridShape shape{c.dp, c.tp, c.pp};
  TrainSpec train;
  train.zero_stage = c.stage;
  train.max_grad_norm = 0.05;  // below the gradient's norm: every step clips
  std::vector<RankStep> out(shape.world());
  std::mutex mu;
  auto stages = PipelineStageUnits(model, c.pp);
  ZS_RETURN_IF_ERROR(stages.status());
  ZS_RETURN_IF_ERROR(testing::RunLocalGrid(shape, [&](const testing::GridRank& r) -> absl::Status {
    ZS_ASSIGN_OR_RETURN(ModelSpec shard, ShardModelSpec(model, c.tp, r.coord.tp, c.pp, r.coord.pp));
    const int first_unit = (*stages)[r.coord.pp].first;
    auto device = CreateCpuDevice();
    ModelParallelOptions parallel;
    parallel.group = r.model_parallel;
    parallel.count_replicated = r.coord.tp == 0;
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(shard, train, *device, *r.dp, parallel));
    for (size_t u = 0; u < shard.units.size(); ++u) {
      for (size_t p = 0; p < shard.units[u].params.size(); ++p) {
        std::vector<float> init(static_cast<size_t>(shard.units[u].params[p].NumElements()), 0.5f);
        ZS_RETURN_IF_ERROR(engine->SetParam(static_cast<int>(u), static_cast<int>(p), init));
      }
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    bool poisoned = false;
    ZS_ASSIGN_OR_RETURN(
        StepResult result,
        testing::StepWithGradients(*engine, [&](int u, int p, const TensorView& view) {
          const ParamSpec& full = model.units[first_unit + u].params[p];
          const std::vector<float> slice =
              TpSlice(grads[first_unit + u][p], full.shape, full.tp_split_dim, c.tp, r.coord.tp);
          std::memcpy(view.data, slice.data(), slice.size() * sizeof(float));
          if (r.rank == poison && !poisoned) {
            view.as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
            poisoned = true;
          }
        }));
    std::lock_guard<std::mutex> lock(mu);
    out[r.rank] = {result, true};
    return absl::OkStatus();
  }));
  return out;
}

class ModelParallelNormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(ModelParallelNormTest, NormIsTheFullGradientsAndEveryRankClipsAlike) {
  const NormCase c = GetParam();
  const ModelSpec model = ModelFor(c);
  std::mt19937_64 rng(testing::Seed());
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::vector<std::vector<float>>> grads(model.units.size());
  // The reference: the full gradient's norm in double, each param once.
  double sum_squares = 0.0;
  for (size_t u = 0; u < model.units.size(); ++u) {
    for (const ParamSpec& p : model.units[u].params) {
      std::vector<float> g(static_cast<size_t>(p.NumElements()));
      for (float& x : g) {
        x = normal(rng);
        sum_squares += static_cast<double>(x) * x;
      }
      grads[u].push_back(std::move(g));
    }
  }
  const double reference = std::sqrt(sum_squares);
  auto steps = StepGrid(model, c, grads, /*poison=*/-1);
  ASSERT_TRUE(steps.ok()) << steps.status();
  const StepResult& first = (*steps)[0].result;
  // Every dp rank writes the same gradient, so the mean is the gradient
  // itself, exactly (sums of 2 equal fp32 values); the engine's sum of
  // squares is exact, the reference's a double sum in another order: they
  // agree to a few ulps, 1e-12 relative is ample.
  EXPECT_NEAR(first.grad_norm, reference, 1e-12 * reference) << testing::SeedTrace();
  EXPECT_LT(first.clip_coef, 1.0);
  EXPECT_NEAR(first.clip_coef, 0.05 / (reference + 1e-6), 1e-12);
  for (size_t rank = 0; rank < steps->size(); ++rank) {
    const StepResult& s = (*steps)[rank].result;
    ASSERT_TRUE((*steps)[rank].ran) << "rank " << rank;
    // The same bits on every rank of every shard.
    EXPECT_EQ(s.grad_norm, first.grad_norm) << "rank " << rank;
    EXPECT_EQ(s.clip_coef, first.clip_coef) << "rank " << rank;
    EXPECT_FALSE(s.skipped) << "rank " << rank;
  }
}

TEST_P(ModelParallelNormTest, ANonFiniteGradientOnOneShardSkipsTheStepEverywhere) {
  const NormCase c = GetParam();
  const ModelSpec model = ModelFor(c);
  std::vector<std::vector<std::vector<float>>> grads(model.units.size());
  for (size_t u = 0; u < model.units.size(); ++u) {
    for (const ParamSpec& p : model.units[u].params) {
      grads[u].push_back(std::vector<float>(static_cast<size_t>(p.NumElements()), 1e-3f));
    }
  }
  const int world = c.tp * c.pp * c.dp;
  auto steps = StepGrid(model, c, grads, /*poison=*/world - 1);  // last tp rank, last stage
  ASSERT_TRUE(steps.ok()) << steps.status();
  for (size_t rank = 0; rank < steps->size(); ++rank) {
    EXPECT_TRUE((*steps)[rank].result.skipped) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Grids, ModelParallelNormTest,
                         ::testing::Values(NormCase{2, 1, 1, 0}, NormCase{2, 1, 2, 0},
                                           NormCase{2, 1, 2, 1}, NormCase{2, 1, 2, 2},
                                           NormCase{2, 1, 2, 3}, NormCase{2, 2, 1, 1},
                                           NormCase{1, 2, 2, 2}, NormCase{4, 1, 1, 3},
                                           NormCase{2, 1, 1, 0, true}, NormCase{2, 1, 2, 2, true},
                                           NormCase{2, 2, 2, 3, true}),
                         [](const ::testing::TestParamInfo<NormCase>& info) {
                           const NormCase& c = info.param;
                           return "tp" + std::to_string(c.tp) + "_pp" + std::to_string(c.pp) +
                                  "_dp" + std::to_string(c.dp) + "_stage" +
                                  std::to_string(c.stage) + (c.norm_first ? "_ln" : "");
                         });

// The step's wall time splits into parts that add up to the total, with the
// trainer's reported pipeline waits as their own part (not compute).
TEST(StepTimesTest, PartsAddUpWithThePipelineBubble) {
  const ModelSpec model = testing::MlpGridSpec(2, 16);
  const absl::Status run = RunLocalRanks(2, [&](int, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    TrainSpec train;
    train.zero_stage = 1;
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(model, train, *device, comm));
    for (size_t u = 0; u < model.units.size(); ++u) {
      for (size_t p = 0; p < model.units[u].params.size(); ++p) {
        std::vector<float> init(static_cast<size_t>(model.units[u].params[p].NumElements()), 0.1f);
        ZS_RETURN_IF_ERROR(engine->SetParam(static_cast<int>(u), static_cast<int>(p), init));
      }
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    absl::Duration bubbles;
    for (int step = 0; step < 3; ++step) {
      // The trainer's own work, bubbles included; waits are reported after
      // they happened (the engine books no more than the time outside its
      // calls so far).
      absl::SleepFor(absl::Milliseconds(5));
      engine->RecordInputWait(absl::Milliseconds(1));
      engine->RecordPipelineWait(absl::Milliseconds(2 + step));
      bubbles += absl::Milliseconds(2 + step);
      ZS_RETURN_IF_ERROR(testing::StepWithGradients(*engine, [](int, int, const TensorView& v) {
                           for (int64_t i = 0; i < v.numel; ++i) v.as<float>()[i] = 1e-3f;
                         }).status());
      const StepTimes t = engine->Stats().last;
      EXPECT_EQ(t.pipeline_bubble, absl::Milliseconds(2 + step));
      EXPECT_EQ(t.input_wait, absl::Milliseconds(1));
      EXPECT_EQ(t.compute + t.exposed_comm + t.optimizer + t.input_wait + t.engine_other +
                    t.pipeline_bubble,
                t.total);
      EXPECT_GE(t.compute, absl::ZeroDuration());
    }
    const StepTimes totals = engine->Stats().totals;
    EXPECT_EQ(totals.pipeline_bubble, bubbles);
    EXPECT_EQ(totals.compute + totals.exposed_comm + totals.optimizer + totals.input_wait +
                  totals.engine_other + totals.pipeline_bubble,
              totals.total);
    return absl::OkStatus();
  });
  EXPECT_TRUE(run.ok()) << run;
}

}  // namespace
}  // namespace zeroshard
