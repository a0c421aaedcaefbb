// Param groups through the whole engine (fp32): a model with three groups
// (the optimizer's settings, a scaled learning rate with its own weight
// decay, an adapter with a larger rate and no decay) and no_decay params,
// trained for a few steps with a warm-up + cosine schedule on gradients the
// test writes itself (fresh random noise per step and micro-batch, plus a
// term in the weights). Every stage 0-3 on 2-4 ranks (one micro-batch each)
// trains bitwise like one rank accumulating the same micro-batches, and
// every run stays within a stated tolerance of a double-precision AdamW
// with torch's param-group semantics.
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "examples/common/rng.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

using ::zeroshard::examples::SplitMix64;

constexpr int kSteps = 6;
constexpr double kWeightTerm = 0.1;  // gradient = noise + kWeightTerm * weight

// In [-1, 1), a pure function of the test seed and (a, b, c, d).
float Uniform(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(SplitMix64(a ^ Seed()) ^ b) ^ c) ^ d);
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0);
}

// Sizes not multiples of the alignment, so that group boundaries fall
// inside ranks' shards.
ModelSpec GroupedSpec() {
  ModelSpec spec;
  spec.units.push_back({"embed", {{"w", {37, 24}, false}, {"b", {24}, true}}});
  spec.units.push_back({"block.0", {{"w", {48, 40}, false}, {"b", {48}, true}}});
  spec.units.push_back({"block.1", {{"w", {40, 48}, false}, {"a", {5, 48}, false}}});
  spec.units.push_back({"head", {{"w", {40, 48}, false}, {"b", {11}, true}}});
  // Group "scaled": embed.w and block.1.w.
  for (ParamSpec* p : {&spec.units[0].params[0], &spec.units[2].params[0]}) {
    p->lr_scale = 0.25;
    p->weight_decay = 0.2;
  }
  // Group "adapter": block.1.a.
  spec.units[2].params[1].lr_scale = 2.0;
  spec.units[2].params[1].weight_decay = 0.0;
  return spec;
}

TrainSpec GroupedTrain(int stage, int accum) {
  TrainSpec t;
  t.zero_stage = stage;
  t.precision = Precision::kFp32;
  t.grad_accum_steps = accum;
  t.optimizer.kind = OptimizerKind::kAdamW;
  t.optimizer.lr = 2e-2;
  t.optimizer.weight_decay = 0.05;
  t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
  t.schedule.warmup_steps = 2;
  t.schedule.total_steps = kSteps;
  t.schedule.min_lr_ratio = 0.1;
  return t;
}

float Init(int unit, int param, int64_t i) { return 0.5f * Uniform(7, unit, param, i); }
// The noise of micro-batch `micro` (over all ranks) of step `step`: its
// sign is shared by the step's micro-batches and its magnitude is in
// [0.5, 1], so that no mean gradient comes near 0. (Near 0, Adam's update
// g / sqrt(g^2) is a sign, and fp32 rounding of the mean could flip it
// against the double reference: a difference of 2 * lr that no tolerance
// for rounding covers.)
float Noise(int64_t step, int micro, int unit, int param, int64_t i) {
  const float sign = Uniform(2000 + step, unit, param, i) < 0 ? -1.0f : 1.0f;
  return sign * (0.75f + 0.25f * Uniform(1000 + step, micro, unit * 16 + param, i));
}

using Params = std::vector<std::vector<float>>;

// How a run starts and ends: `steps` steps from Init, or from the
// checkpoint `load_dir` (rank 0's Load result in `loaded`); saved into
// `save_dir` at the end when given.
struct RunOptions {
  int world = 1;
  int accum = 1;
  int stage = 0;
  int steps = kSteps;
  std::string load_dir;
  std::string save_dir;
  CheckpointInfo* loaded = nullptr;
};

// `world` ranks of `accum` micro-batches each; rank r's micro-batch k is
// micro-batch r * accum + k of the step. Every param at the end.
absl::StatusOr<Params> Train(const ModelSpec& spec, const RunOptions& run) {
  Params result;
  std::mutex mu;
  ZS_RETURN_IF_ERROR(RunLocalRanks(run.world, [&](int rank, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine,
                        Engine::Create(spec, GroupedTrain(run.stage, run.accum), *device, comm));
    const int units = static_cast<int>(spec.units.size());
    if (run.load_dir.empty()) {
      for (int u = 0; u < units; ++u) {
        for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
          std::vector<float> w(spec.units[u].params[p].NumElements());
          for (size_t i = 0; i < w.size(); ++i) w[i] = Init(u, p, i);
          ZS_RETURN_IF_ERROR(engine->SetParam(u, p, w));
        }
      }
    } else {
      ZS_ASSIGN_OR_RETURN(CheckpointInfo info, engine->Load(run.load_dir));
      if (rank == 0 && run.loaded != nullptr) *run.loaded = info;
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    for (int s = 0; s < run.steps; ++s) {
      const int64_t step = engine->steps();
      for (int k = 0; k < run.accum; ++k) {
        const int micro = rank * run.accum + k;
        for (int u = 0; u < units; ++u) {  // the forward's gathers
          ZS_RETURN_IF_ERROR(engine->Gather(u).status());
          ZS_RETURN_IF_ERROR(engine->Release(u));
        }
        for (int u = units - 1; u >= 0; --u) {
          ZS_ASSIGN_OR_RETURN(UnitView w, engine->Gather(u));
          ZS_ASSIGN_OR_RETURN(UnitView g, engine->GradView(u));
          for (size_t p = 0; p < g.params.size(); ++p) {
            const float* weights = w.params[p].as<float>();
            float* grads = g.params[p].as<float>();
            for (int64_t i = 0; i < g.params[p].numel; ++i) {
              grads[i] = Noise(step, micro, u, static_cast<int>(p), i) +
                         static_cast<float>(kWeightTerm) * weights[i];
            }
          }
          ZS_RETURN_IF_ERROR(engine->ReduceGrads(u));
          ZS_RETURN_IF_ERROR(engine->Release(u));
        }
      }
      ZS_RETURN_IF_ERROR(engine->Step().status());
    }
    if (!run.save_dir.empty()) {
      ZS_RETURN_IF_ERROR(engine->Save(run.save_dir, "{}", CheckpointOptions{}));
      ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
    }
    Params params;
    for (int u = 0; u < units; ++u) {
      for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
        ZS_ASSIGN_OR_RETURN(std::vector<float> v, engine->GetParam(u, p));
        params.push_back(std::move(v));
      }
    }
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(params);
    }
    return absl::OkStatus();
  }));
  return result;
}

// The same training in double: the mean gradient of the `micro_batches`
// micro-batches, AdamW with torch's param groups (lr = schedule(step) *
// lr_scale; p *= 1 - lr * weight_decay, the group's decay: its own, 0 for
// no_decay, else the optimizer's). `ignore_groups`: every param with the
// optimizer's settings (the negative control). `later`: the groups of the
// steps from `later_from` on (0-based; a resume with other groups).
std::vector<std::vector<double>> Reference(const ModelSpec& spec, int micro_batches,
                                           bool ignore_groups, const ModelSpec* later = nullptr,
                                           int64_t later_from = kSteps) {
  const TrainSpec train = GroupedTrain(0, 1);
  const OptimizerSpec& o = train.optimizer;
  std::vector<std::vector<double>> p, m, v;
  for (size_t u = 0; u < spec.units.size(); ++u) {
    for (size_t q = 0; q < spec.units[u].params.size(); ++q) {
      const size_t n = static_cast<size_t>(spec.units[u].params[q].NumElements());
      p.emplace_back(n);
      for (size_t i = 0; i < n; ++i) p.back()[i] = Init(u, q, i);
      m.emplace_back(n, 0.0);
      v.emplace_back(n, 0.0);
    }
  }
  for (int64_t step = 0; step < kSteps; ++step) {
    const int64_t t = step + 1;
    const double lr = train.schedule.LrAt(t, o.lr);
    const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    size_t k = 0;
    for (size_t u = 0; u < spec.units.size(); ++u) {
      for (size_t q = 0; q < spec.units[u].params.size(); ++q, ++k) {
        const ParamSpec& param =
            (later != nullptr && step >= later_from ? *later : spec).units[u].params[q];
        double group_lr = lr * param.lr_scale;
        double decay = param.no_decay ? 0.0 : param.weight_decay.value_or(o.weight_decay);
        if (ignore_groups) {
          group_lr = lr;
          decay = param.no_decay ? 0.0 : o.weight_decay;
        }
        for (size_t i = 0; i < p[k].size(); ++i) {
          double g = 0.0;
          for (int micro = 0; micro < micro_batches; ++micro) {
            g += Noise(step, micro, u, q, i) + kWeightTerm * p[k][i];
          }
          g /= micro_batches;
          m[k][i] = o.beta1 * m[k][i] + (1 - o.beta1) * g;
          v[k][i] = o.beta2 * v[k][i] + (1 - o.beta2) * g * g;
          p[k][i] *= 1 - group_lr * decay;
          p[k][i] -= group_lr / bc1 * m[k][i] / (std::sqrt(v[k][i] / bc2) + o.eps);
        }
      }
    }
  }
  return p;
}

double MaxAbsDifference(const Params& a, const std::vector<std::vector<double>>& b) {
  double worst = 0.0;
  for (size_t k = 0; k < a.size(); ++k) {
    for (size_t i = 0; i < a[k].size(); ++i) worst = std::max(worst, std::fabs(a[k][i] - b[k][i]));
  }
  return worst;
}

bool Bitwise(const Params& a, const Params& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].size() != b[k].size() ||
        std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

// fp32 against double after kSteps steps: measured 1.3e-7 to 2e-7 (params
// of magnitude ~0.5, updates ~1e-2), bounded at about ten times that; a
// wrong group moves params by ~6e-2 (the control below).
constexpr double kTolerance = 2e-6;

TEST(EngineParamGroupsTest, EveryStageAndWorldSizeTrainsBitwiseAndMatchesTheDoubleReference) {
  const ModelSpec spec = GroupedSpec();
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  for (int world = 1; world <= 4; ++world) {
    auto baseline = Train(spec, {1, world, 0});
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    const double error = MaxAbsDifference(*baseline, Reference(spec, world, false));
    const double control = MaxAbsDifference(*baseline, Reference(spec, world, true));
    std::printf(
        "%d micro-batch(es) on one rank: max |fp32 - double reference| %.3g (tolerance %.0e); "
        "against a reference without groups %.3g\n",
        world, error, kTolerance, control);
    EXPECT_LE(error, kTolerance) << SeedTrace();
    EXPECT_GT(control, 100 * kTolerance) << "the groups changed nothing; " << SeedTrace();
    if (world == 1) continue;
    for (int stage = 0; stage <= 3; ++stage) {
      auto result = Train(spec, {world, 1, stage});
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_TRUE(Bitwise(*result, *baseline))
          << "world " << world << " stage " << stage << " differs from one rank; " << SeedTrace();
    }
  }
}

// A checkpoint resumes with other param groups: Load lists each change, and
// the steps after it follow the new groups (the double reference switches
// groups at the same step). Trainable flags and ties decide what is
// stored: a model with others is refused, naming the param.
TEST(EngineParamGroupsTest, ResumeWithOtherGroupsIsReportedAndTrainsWithThem) {
  char pattern[] = "/tmp/zs_groups_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const ModelSpec spec = GroupedSpec();
  const int world = 2;
  const int first_leg = kSteps / 2;
  RunOptions save;
  save.world = world;
  save.stage = 1;
  save.steps = first_leg;
  save.save_dir = dir;
  ASSERT_TRUE(Train(spec, save).ok());

  ModelSpec regrouped = spec;
  regrouped.units[0].params[0].weight_decay.reset();  // embed.w: the optimizer's decay
  regrouped.units[1].params[1].no_decay = false;      // block.0.b decays
  regrouped.units[2].params[1].lr_scale = 0.5;        // block.1.a slower
  ASSERT_TRUE(regrouped.Validate().ok()) << regrouped.Validate();
  CheckpointInfo info;
  RunOptions resume;
  resume.world = world;
  resume.stage = 2;
  resume.steps = kSteps - first_leg;
  resume.load_dir = dir;
  resume.loaded = &info;
  auto resumed = Train(regrouped, resume);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(info.changed_settings,
            (std::vector<std::string>{"zero_stage 1 -> 2", "embed.w: weight_decay 0.2 -> unset",
                                      "block.0.b: no_decay true -> false",
                                      "block.1.a: lr_scale 2 -> 0.5"}));
  const double error =
      MaxAbsDifference(*resumed, Reference(spec, world, false, &regrouped, first_leg));
  const double unchanged = MaxAbsDifference(*resumed, Reference(spec, world, false));
  std::printf(
      "resumed with other groups: max |fp32 - double reference| %.3g; against the reference "
      "that keeps the old groups %.3g\n",
      error, unchanged);
  EXPECT_LE(error, kTolerance) << SeedTrace();
  EXPECT_GT(unchanged, 100 * kTolerance) << "the new groups changed nothing; " << SeedTrace();

  auto refused = [&](const ModelSpec& other) {
    RunOptions load = resume;
    load.steps = 0;
    load.loaded = nullptr;
    return Train(other, load).status();
  };
  ModelSpec frozen = spec;
  frozen.units[1].params[0].trainable = false;
  const absl::Status not_trainable = refused(frozen);
  EXPECT_EQ(not_trainable.code(), absl::StatusCode::kInvalidArgument) << not_trainable;
  EXPECT_NE(not_trainable.message().find("param 'block.0.w' has trainable true in the "
                                         "checkpoint and false in this engine's model"),
            std::string::npos)
      << not_trainable;
  ModelSpec tied = spec;
  tied.units[3].params[0] = spec.units[2].params[0];  // head.w: block.1.w's shape and group
  tied.units[3].params[0].name = "w";
  tied.units[3].params[0].tied_to = ParamRef{"block.1", "w"};
  ASSERT_TRUE(tied.Validate().ok()) << tied.Validate();
  const absl::Status other_tie = refused(tied);
  EXPECT_EQ(other_tie.code(), absl::StatusCode::kInvalidArgument) << other_tie;
  EXPECT_NE(other_tie.message().find("param 'head.w' is untied in the checkpoint and tied to "
                                     "'block.1.w' in this engine's model"),
            std::string::npos)
      << other_tie;
  std::system(("rm -rf '" + dir + "'").c_str());
}

}  // namespace
}  // namespace zeroshard::testing
