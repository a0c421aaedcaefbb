// Tied params, frozen params, SetTrainable and several live gathers, through
// the public API on a tiny language model whose head is tied to its
// embedding (tests/runtime/tiny_lm.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/runtime/tiny_lm.h"
#include "tests/test_seed.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

struct TinyRun {
  int world = 1;
  int stage = 0;
  int accum = 1;
  int steps = 3;
  TinyOptions model;
  TrainerOptions trainer;
  int max_gathered_units = 1;
  int prefetch_units = 1;
  std::string save_dir;  // saved after the last step
  std::string load_dir;  // loaded instead of the initial values
  // Before step s (1-based) of this run: SetTrainable(mid, w, flag) on the
  // ranks `on_rank` accepts.
  std::vector<std::pair<int, bool>> toggles;  // (step, flag)
  std::function<bool(int rank)> toggle_on_rank = [](int) { return true; };
};

struct Result {
  std::vector<std::vector<std::vector<float>>> params;  // rank 0's GetParam, at the end
  std::vector<StepResult> steps;
  std::vector<int64_t> collectives_per_step;
  int64_t model_state_bytes = 0;
  int64_t comm_buffer_bytes = 0;  // staging, tied accumulators, gather pool
  int64_t planned_model_state_bytes = 0;
  int64_t planned_comm_buffer_bytes = 0;
  int64_t planned_gather_pool_bytes = 0;
};

TrainSpec TinyTrain(const TinyRun& run) {
  TrainSpec train;
  train.zero_stage = run.stage;
  train.grad_accum_steps = run.accum;
  train.optimizer.lr = 1e-2;
  train.optimizer.weight_decay = 0.05;
  train.max_gathered_units = run.max_gathered_units;
  train.prefetch_units = run.prefetch_units;
  return train;
}

absl::StatusOr<Result> Train(uint64_t seed, const TinyRun& run) {
  const ModelSpec spec = TinySpec(run.model);
  const TrainSpec train = TinyTrain(run);
  std::vector<Result> results(run.world);
  const absl::Status status =
      RunLocalRanks(run.world, [&](int rank, Communicator& comm) -> absl::Status {
        std::unique_ptr<Device> device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Create(spec, train, *device, comm));
        if (run.load_dir.empty()) {
          for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
            for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
              const ParamSpec& ps = spec.units[u].params[p];
              if (ps.tied_to.has_value()) continue;  // set through its owner
              const int id = u == static_cast<int>(spec.units.size()) - 1 ? kHead : u;
              ZS_RETURN_IF_ERROR(e->SetParam(u, p, InitValues(seed, id, p, ps.NumElements())));
            }
          }
        } else {
          ZS_RETURN_IF_ERROR(e->Load(run.load_dir).status());
        }
        ZS_RETURN_IF_ERROR(e->Start());
        Result& out = results[rank];
        int64_t before = 0;
        for (int s = 1; s <= run.steps; ++s) {
          for (const auto& [at, flag] : run.toggles) {
            if (s == at && run.toggle_on_rank(rank))
              ZS_RETURN_IF_ERROR(e->SetTrainable(kMid, 0, flag));
          }
          const int64_t step = e->steps() + 1;
          for (int m = 0; m < run.accum; ++m) {
            ZS_RETURN_IF_ERROR(
                MicroBatch(*e, spec, MakeBatch(seed, step, rank * run.accum + m), run.trainer));
          }
          ZS_ASSIGN_OR_RETURN(StepResult r, e->Step());
          out.steps.push_back(r);
          out.collectives_per_step.push_back(e->Stats().collectives - before);
          before = e->Stats().collectives;
        }
        if (!run.save_dir.empty()) {
          ZS_RETURN_IF_ERROR(e->Save(run.save_dir, "{}"));
          ZS_RETURN_IF_ERROR(e->WaitForCheckpoint());
        }
        for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
          out.params.emplace_back();
          for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
            ZS_ASSIGN_OR_RETURN(std::vector<float> v, e->GetParam(u, p));
            out.params.back().push_back(std::move(v));
          }
        }
        out.model_state_bytes = e->ledger().current_model_states();
        out.comm_buffer_bytes = e->ledger().current(MemoryCategory::kCommBuffers);
        ZS_ASSIGN_OR_RETURN(BufferPlan plan, PlanEngineBuffers(spec, train, run.world));
        out.planned_model_state_bytes = plan.model_state_bytes();
        out.planned_comm_buffer_bytes = plan.BytesIn(MemoryCategory::kCommBuffers);
        const PlannedBuffer* pool = plan.Find(kParamGatherBuffer);
        out.planned_gather_pool_bytes = pool == nullptr ? 0 : pool->bytes();
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return results[0];
}

std::string FirstDifference(const Result& a, const Result& b) {
  for (size_t u = 0; u < a.params.size(); ++u) {
    for (size_t p = 0; p < a.params[u].size(); ++p) {
      for (size_t i = 0; i < a.params[u][p].size(); ++i) {
        if (std::memcmp(&a.params[u][p][i], &b.params[u][p][i], sizeof(float)) != 0) {
          return absl::StrFormat("unit %d param %d element %d: %.9g vs %.9g", u, p, i,
                                 a.params[u][p][i], b.params[u][p][i]);
        }
      }
    }
  }
  return "";
}

TEST(TiedFrozenTest, TrainsBitwiseLikeOneRankAtEveryStageAndWorldSize) {
  const uint64_t seed = Seed();
  for (int world : {2, 3, 4}) {
    TinyRun base;
    base.accum = world;  // one rank, the same micro-batches
    auto baseline = Train(seed, base);
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE(absl::StrFormat("world %d stage %d; %s", world, stage, SeedTrace()));
      TinyRun run;
      run.world = world;
      run.stage = stage;
      auto result = Train(seed, run);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(FirstDifference(*result, *baseline), "");
      // The frozen params never move.
      EXPECT_EQ(result->params[kMid][1], InitValues(seed, kMid, 1, kHidden * kHidden));
      EXPECT_EQ(result->params[kScale][0], InitValues(seed, kScale, 0, kHidden));
      // The alias reads its owner.
      EXPECT_EQ(result->params[kHead][0], result->params[kEmbed][0]);
      EXPECT_EQ(result->model_state_bytes, result->planned_model_state_bytes);
    }
  }
}

// The tied param's gradient: double-precision reference of the mean over
// the world's micro-batches of (head use + embedding use).
struct Reference {
  double norm = 0;          // the global norm of the averaged gradient
  double norm_one_use = 0;  // the same with only the head's use of E
};
Reference ReferenceNorm(uint64_t seed, int micro_batches) {
  auto init = [&](int u, int p, int64_t n) {
    const std::vector<float> v = InitValues(seed, u, p, n);
    return std::vector<double>(v.begin(), v.end());
  };
  const std::vector<double> E = init(kEmbed, 0, kVocab * kHidden);
  const std::vector<double> W = init(kMid, 0, kHidden * kHidden);
  const std::vector<double> F = init(kMid, 1, kHidden * kHidden);
  const std::vector<double> b = init(kMid, 2, kHidden);
  const std::vector<double> g = init(kScale, 0, kHidden);
  const std::vector<double> bias = init(kHead, 1, kVocab);
  std::vector<double> dEh(E.size()), dEe(E.size()), dW(W.size()), db(kHidden), dbias(kVocab);
  for (int m = 0; m < micro_batches; ++m) {
    const Batch batch = MakeBatch(seed, 1, m);
    for (int i = 0; i < kBatch; ++i) {
      const int t = batch.tokens[i];
      std::vector<double> x(kHidden), z(kHidden), y(kHidden), dl(kVocab), dz(kHidden);
      for (int k = 0; k < kHidden; ++k) x[k] = E[t * kHidden + k];
      for (int r = 0; r < kHidden; ++r) {
        z[r] = b[r];
        for (int c = 0; c < kHidden; ++c) z[r] += (W[r * kHidden + c] + F[r * kHidden + c]) * x[c];
        y[r] = g[r] * z[r];
      }
      for (int v = 0; v < kVocab; ++v) {
        double s = bias[v];
        for (int k = 0; k < kHidden; ++k) s += E[v * kHidden + k] * y[k];
        dl[v] = (s - batch.target[i][v]) / kBatch / micro_batches;
        dbias[v] += dl[v];
        for (int k = 0; k < kHidden; ++k) dEh[v * kHidden + k] += dl[v] * y[k];
      }
      for (int k = 0; k < kHidden; ++k) {
        double s = 0;
        for (int v = 0; v < kVocab; ++v) s += E[v * kHidden + k] * dl[v];
        dz[k] = g[k] * s;
      }
      for (int r = 0; r < kHidden; ++r) {
        db[r] += dz[r];
        for (int c = 0; c < kHidden; ++c) dW[r * kHidden + c] += dz[r] * x[c];
      }
      for (int c = 0; c < kHidden; ++c) {
        double s = 0;
        for (int r = 0; r < kHidden; ++r) s += (W[r * kHidden + c] + F[r * kHidden + c]) * dz[r];
        dEe[t * kHidden + c] += s;
      }
    }
  }
  double rest = 0, both = 0, one = 0;
  for (double v : dW) rest += v * v;
  for (double v : db) rest += v * v;
  for (double v : dbias) rest += v * v;
  for (size_t k = 0; k < E.size(); ++k) {
    both += (dEh[k] + dEe[k]) * (dEh[k] + dEe[k]);
    one += dEh[k] * dEh[k];
  }
  return {std::sqrt(rest + both), std::sqrt(rest + one)};
}

TEST(TiedFrozenTest, TheTiedGradientIsTheSumOfBothUses) {
  for (int world : {1, 3}) {
    // Data the norm can tell the sum of both uses from one use by (their
    // norms differ by > 10x the tolerance): the first such of the seeds
    // from the test's seed on; almost always the first (a seed whose uses'
    // cross term nearly cancels the embedding use's own part is passed).
    uint64_t seed = Seed();
    Reference ref = ReferenceNorm(seed, world);
    for (int tries = 0; tries < 16 && std::abs(ref.norm - ref.norm_one_use) <= 1e-4 * ref.norm;
         ++tries) {
      ref = ReferenceNorm(++seed, world);
    }
    ASSERT_GT(std::abs(ref.norm - ref.norm_one_use), 1e-4 * ref.norm) << SeedTrace();
    const double tol = 1e-5 * ref.norm;
    for (int stage : {0, 2, 3}) {
      SCOPED_TRACE(
          absl::StrFormat("world %d stage %d, data seed %d; %s", world, stage, seed, SeedTrace()));
      TinyRun run;
      run.world = world;
      run.stage = stage;
      run.steps = 1;
      auto result = Train(seed, run);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_NEAR(result->steps[0].grad_norm, ref.norm, tol);
    }
  }
}

TEST(TiedFrozenTest, AnAllFrozenUnitIssuesNoCollective) {
  // The same model without the unit of frozen params issues exactly as many
  // collectives (stages 0-2, where that unit is not gathered): it reduces
  // nothing and all-gathers nothing.
  const uint64_t seed = Seed();
  for (int stage = 0; stage <= 2; ++stage) {
    SCOPED_TRACE(absl::StrFormat("stage %d; %s", stage, SeedTrace()));
    TinyRun with;
    with.world = 2;
    with.stage = stage;
    TinyRun without = with;
    without.model.scale_unit = false;
    auto a = Train(seed, with);
    auto b = Train(seed, without);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_GT(a->collectives_per_step[1], 0);
    EXPECT_EQ(a->collectives_per_step, b->collectives_per_step);
  }
}

TEST(TiedFrozenTest, FrozenParamsAreRefusedByNameAndHaveNoGradientView) {
  const ModelSpec spec = TinySpec();
  const absl::Status status = RunLocalRanks(2, [&](int, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    TinyRun run;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                        Engine::Create(spec, TinyTrain(run), *device, comm));
    const absl::Status alias = e->SetParam(kHead, 0, std::vector<float>(kVocab * kHidden, 0.5f));
    EXPECT_EQ(alias.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(alias.message().find("set embed.weight instead"), std::string::npos) << alias;
    for (int u = 0; u < kNumUnits; ++u) {
      for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
        if (u == kHead && p == 0) continue;
        ZS_RETURN_IF_ERROR(
            e->SetParam(u, p, InitValues(1, u, p, spec.units[u].params[p].NumElements())));
      }
    }
    ZS_RETURN_IF_ERROR(e->Start());
    const absl::Status view = e->GradView(kScale).status();
    EXPECT_EQ(view.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(view.message().find("GradView(scale): every param of the unit is frozen"),
              std::string::npos)
        << view;
    EXPECT_EQ(e->ReduceGrads(kScale).code(), absl::StatusCode::kFailedPrecondition);
    ZS_ASSIGN_OR_RETURN(UnitView mid, e->GradView(kMid));
    EXPECT_NE(mid.params[0].data, nullptr);
    EXPECT_EQ(mid.params[1].data, nullptr);  // f is frozen
    EXPECT_EQ(mid.params[1].numel, 0);
    const absl::Status frozen = e->SetTrainable(kMid, 1, true);
    EXPECT_EQ(frozen.code(), absl::StatusCode::kFailedPrecondition) << frozen;  // mid-step
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(TiedFrozenTest, SetTrainableFreezesAndUnfreezesBetweenStepsOnEveryRank) {
  const uint64_t seed = Seed();
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(absl::StrFormat("stage %d; %s", stage, SeedTrace()));
    // Frozen before step 2: w after 3 steps equals w after 1 step.
    TinyRun one;
    one.world = 2;
    one.stage = stage;
    one.steps = 1;
    auto after_one = Train(seed, one);
    ASSERT_TRUE(after_one.ok()) << after_one.status();
    TinyRun frozen = one;
    frozen.steps = 3;
    frozen.toggles = {{2, false}};
    auto after_three = Train(seed, frozen);
    ASSERT_TRUE(after_three.ok()) << after_three.status();
    EXPECT_EQ(after_three->params[kMid][0], after_one->params[kMid][0]);
    EXPECT_NE(after_three->params[kMid][2], after_one->params[kMid][2]);  // b trains on
    // Unfrozen before step 4: w moves on from there.
    TinyRun thaw = frozen;
    thaw.steps = 4;
    thaw.toggles = {{2, false}, {4, true}};
    auto thawed = Train(seed, thaw);
    ASSERT_TRUE(thawed.ok()) << thawed.status();
    EXPECT_NE(thawed->params[kMid][0], after_one->params[kMid][0]);
    // A call on one rank only is refused on every rank, naming the call.
    TinyRun lopsided = one;
    lopsided.steps = 2;
    lopsided.toggles = {{2, false}};
    lopsided.toggle_on_rank = [](int rank) { return rank == 0; };
    // (The caller's error names SetTrainable; the other rank's, its own
    // collective that met SetTrainable's exchange.)
    auto refused = Train(seed, lopsided);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_NE(refused.status().message().find("every rank must issue the same collectives"),
              std::string::npos)
        << refused.status();
  }
}

TEST(TiedFrozenTest, Stage3WithRecomputeAndHeldUnitsTrainsLikeStage0) {
  const uint64_t seed = Seed();
  TinyRun base;
  base.world = 2;
  auto stage0 = Train(seed, base);
  ASSERT_TRUE(stage0.ok()) << stage0.status();
  for (int held : {1, 2}) {
    for (int prefetch : {0, 1, 3}) {
      SCOPED_TRACE(absl::StrFormat("held %d prefetch %d; %s", held, prefetch, SeedTrace()));
      TinyRun run = base;
      run.stage = 3;
      run.trainer.recompute = true;
      run.trainer.hold_embed = held == 2;
      run.max_gathered_units = held;
      run.prefetch_units = prefetch;
      auto result = Train(seed, run);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(FirstDifference(*result, *stage0), "");
      EXPECT_EQ(result->comm_buffer_bytes, result->planned_comm_buffer_bytes);
      // The pool holds the units held at once (the head reads two segments:
      // its bias and the tied weight), plus the prefetch, capped at the
      // sharded segments (embed.weight, mid's w and b, mid's frozen f,
      // scale's g, head.bias).
      const int64_t slot_bytes = 4 * 256;  // the largest segment (23 x 10 -> 256 elements)
      const int64_t slots = std::min<int64_t>(2 * held + prefetch, 5);
      EXPECT_EQ(result->planned_gather_pool_bytes, slots * slot_bytes);
    }
  }
  // Holding two units with max_gathered_units 1 is a named error.
  TinyRun over = base;
  over.stage = 3;
  over.trainer.hold_embed = true;
  auto refused = Train(seed, over);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_gathered_units"), std::string::npos)
      << refused.status();
}

std::string ScratchDir() {
  char pattern[] = "/tmp/zs_tied_frozen_XXXXXX";
  const char* dir = mkdtemp(pattern);
  return dir == nullptr ? std::string() : std::string(dir);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(TiedFrozenTest, CheckpointsHoldTheTieOnceAndResumeBitwiseOnAnotherStage) {
  const uint64_t seed = Seed();
  const std::string dir = ScratchDir();
  ASSERT_FALSE(dir.empty());
  TinyRun uninterrupted;
  uninterrupted.world = 2;
  uninterrupted.steps = 4;
  auto whole = Train(seed, uninterrupted);
  ASSERT_TRUE(whole.ok()) << whole.status();
  TinyRun first = uninterrupted;
  first.stage = 1;
  first.steps = 2;
  first.save_dir = dir;
  const auto saved = Train(seed, first);
  ASSERT_TRUE(saved.ok()) << saved.status();
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(absl::StrFormat("resumed at stage %d; %s", stage, SeedTrace()));
    TinyRun second = uninterrupted;
    second.stage = stage;
    second.steps = 2;
    second.load_dir = dir;
    auto resumed = Train(seed, second);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(FirstDifference(*resumed, *whole), "");
  }
  // The manifest lists the storage segments: embed.weight (tied), mid's
  // trainable and frozen params, scale (frozen), head.bias.
  const nlohmann::json manifest =
      nlohmann::json::parse(ReadFile(dir + "/step_00000002/manifest.json"));
  EXPECT_EQ(manifest["model"]["segments"].size(), 5u);
  EXPECT_EQ(manifest["files"][0]["unit_crc32c"].size(), 5u);
  // The export writes the tied weight once, under its owner's name, and
  // records the tie; the frozen params are there with their values.
  const std::string out = dir + ".safetensors";
  ExportStats stats;
  const absl::Status exported = ExportSafetensors(dir, out, DType::kFloat32, &stats);
  ASSERT_TRUE(exported.ok()) << exported;
  const std::string file = ReadFile(out);
  ASSERT_GT(file.size(), 8u);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, header_bytes));
  EXPECT_TRUE(header.contains("embed.weight"));
  EXPECT_FALSE(header.contains("head.weight"));
  EXPECT_TRUE(header.contains("mid.f"));
  EXPECT_TRUE(header.contains("scale.g"));
  EXPECT_EQ(header["__metadata__"]["zeroshard_tied"], "head.weight=embed.weight");
  EXPECT_EQ(stats.tensors, 6);  // embed.weight, mid.w, mid.b, mid.f, scale.g, head.bias
  const nlohmann::json& f = header["mid.f"];
  const int64_t begin = f["data_offsets"][0].get<int64_t>();
  std::vector<float> values(kHidden * kHidden);
  std::memcpy(values.data(), file.data() + 8 + header_bytes + begin, values.size() * 4);
  EXPECT_EQ(values, InitValues(seed, kMid, 1, kHidden * kHidden));
  std::filesystem::remove_all(dir);
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace zeroshard::testing
