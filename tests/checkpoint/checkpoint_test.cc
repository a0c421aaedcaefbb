// Engine::Save / Load: exact resume, resharding to other world sizes and
// stages, refusal of damaged or foreign checkpoints, and the directory's
// life cycle. Runs the example MLP on local ranks (fresh seed per run).
#include "zeroshard/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/safetensors.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/runtime/engine_impl.h"
#include "gtest/gtest.h"
#include "kernels/cpu/crc32c.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

constexpr int kSteps = 10;

// A fresh directory under /tmp, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/zs_checkpoint_test_XXXXXX";
    path_ = mkdtemp(name);
  }
  ~TempDir() { internal::RemoveTree(path_).IgnoreError(); }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return internal::JoinPath(path_, name); }

 private:
  std::string path_;
};

struct Leg {
  RunConfig run;     // world, stage, precision, accum, clipping
  int steps = 0;     // optimizer steps this leg trains
  std::string load;  // a checkpoint to Load instead of the initial weights
  std::string save;  // a directory to Save into after the last step
  bool background = true;
  int keep_last = 2;
  // > 0: also Save after every save_every-th step, training on while the
  // write is in flight (the next Save completes it).
  int save_every = 0;
  bool keep_snapshot = true;
};

struct LegResult {
  std::vector<std::vector<std::vector<float>>> params;  // [unit][param], GetParam on rank 0
  std::vector<double> losses;
  std::vector<StepResult> steps;
  double loss_scale = 0;
  int64_t engine_steps = 0;
  CheckpointInfo loaded;
  // The engine's loss-scale counters right after Load (or Start) and at the
  // end of the leg.
  internal::EngineImpl::LossScaleState scale_at_start, scale_at_end;
};

TrainSpec LegTrainSpec(const Leg& leg) {
  RunConfig run = leg.run;
  // Warm-up over the first 4 of 10 steps, so that a save at step 2 or 3
  // lands in the middle of it.
  run.steps = kSteps;
  TrainSpec train = MakeTrainSpec(run);
  // fp16: a scale that overflows at first, backs off with hysteresis and
  // grows back within the run, so that every loss-scale counter is live at
  // the save.
  train.loss_scale.initial_scale = 1 << 17;
  train.loss_scale.hysteresis = 2;
  train.loss_scale.growth_interval = 2;
  return train;
}

absl::StatusOr<LegResult> RunLeg(const mlp::MlpConfig& cfg, const Leg& leg) {
  LegResult result;
  std::mutex mu;
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  const TrainSpec train = LegTrainSpec(leg);
  ZS_RETURN_IF_ERROR(RunLocalRanks(
      leg.run.world,
      [&](int rank, Communicator& comm) -> absl::Status {
        auto device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
        CheckpointInfo info;
        if (leg.load.empty()) {
          ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, cfg));
        } else {
          ZS_ASSIGN_OR_RETURN(info, engine->Load(leg.load));
        }
        ZS_RETURN_IF_ERROR(engine->Start(mlp::TrainerSettings(cfg)));
        auto* impl = dynamic_cast<internal::EngineImpl*>(engine.get());
        if (impl == nullptr) return absl::InternalError("not an EngineImpl");
        const internal::EngineImpl::LossScaleState scale_at_start = impl->loss_scale_state();
        mlp::MlpTrainer trainer(cfg, *engine, comm);
        std::vector<double> losses;
        std::vector<StepResult> steps;
        CheckpointOptions options;
        options.background = leg.background;
        options.keep_last = leg.keep_last;
        options.keep_snapshot = leg.keep_snapshot;
        auto save = [&] {
          return engine->Save(leg.save, absl::StrFormat("{\"sampler_step\": %d}", engine->steps()),
                              options);
        };
        for (int s = 0; s < leg.steps; ++s) {
          ZS_ASSIGN_OR_RETURN(double loss, trainer.TrainStep());
          losses.push_back(loss);
          steps.push_back(trainer.last_step());
          if (leg.save_every > 0 && (s + 1) % leg.save_every == 0) ZS_RETURN_IF_ERROR(save());
        }
        if (!leg.save.empty()) {
          if (leg.save_every == 0 || leg.steps % leg.save_every != 0) ZS_RETURN_IF_ERROR(save());
          ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
        }
        std::vector<std::vector<std::vector<float>>> params(spec.units.size());
        for (size_t u = 0; u < spec.units.size(); ++u) {
          for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
            ZS_ASSIGN_OR_RETURN(auto values,
                                engine->GetParam(static_cast<int>(u), static_cast<int>(p)));
            params[u].push_back(std::move(values));
          }
        }
        if (rank != 0) return absl::OkStatus();
        std::lock_guard<std::mutex> lock(mu);
        result.params = std::move(params);
        result.losses = losses;
        result.steps = steps;
        result.loss_scale = engine->loss_scale();
        result.engine_steps = engine->steps();
        result.loaded = info;
        result.scale_at_start = scale_at_start;
        result.scale_at_end = impl->loss_scale_state();
        return absl::OkStatus();
      },
      CommOptions{absl::Seconds(60)}));
  return result;
}

bool SameParams(const LegResult& a, const LegResult& b) {
  RunResult x, y;
  x.params = a.params;
  y.params = b.params;
  return BitwiseEqual(x, y);
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

RunConfig Config(int world, int stage, Precision precision, int accum = 1) {
  RunConfig run;
  run.world = world;
  run.stage = stage;
  run.precision = precision;
  run.accum = accum;
  run.max_grad_norm = 1.0;  // active on the first steps of this task
  return run;
}

TEST(CheckpointTest, ResumeIsBitwiseIdenticalForEveryStagePrecisionAndWorldSize) {
  const mlp::MlpConfig cfg = SmallMlp();
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    for (int world = 1; world <= 4; ++world) {
      for (int stage = 0; stage <= 3; ++stage) {
        const std::string what = absl::StrFormat(
            "%s world %d stage %d, %s", PrecisionName(precision), world, stage, SeedTrace());
        TempDir dir;
        Leg whole{Config(world, stage, precision), kSteps, "", ""};
        auto reference = RunLeg(cfg, whole);
        ASSERT_TRUE(reference.ok()) << reference.status() << " " << what;
        // Save at step 3 (in the warm-up; clipping active), load, go on.
        const int k = 3;
        Leg first{Config(world, stage, precision), k, "", dir.path()};
        first.background = (world + stage) % 2 == 0;  // both write modes across the matrix
        auto before = RunLeg(cfg, first);
        ASSERT_TRUE(before.ok()) << before.status() << " " << what;
        Leg second{Config(world, stage, precision), kSteps - k, dir.path(), ""};
        auto after = RunLeg(cfg, second);
        ASSERT_TRUE(after.ok()) << after.status() << " " << what;
        EXPECT_EQ(after->loaded.step, k) << what;
        EXPECT_EQ(after->loaded.trainer_state, "{\"sampler_step\":3}") << what;
        EXPECT_EQ(after->engine_steps, kSteps) << what;
        EXPECT_TRUE(SameParams(*after, *reference)) << "weights differ: " << what;
        for (int s = k; s < kSteps; ++s) {
          EXPECT_TRUE(SameBits(after->losses[s - k], reference->losses[s]))
              << "loss of step " << s + 1 << ": " << what;
          EXPECT_TRUE(SameBits(after->steps[s - k].lr, reference->steps[s].lr)) << what;
          EXPECT_TRUE(SameBits(after->steps[s - k].loss_scale, reference->steps[s].loss_scale))
              << what;
        }
        EXPECT_TRUE(SameBits(after->loss_scale, reference->loss_scale)) << what;
        // Every counter of the dynamic loss scale comes back as it was saved.
        EXPECT_EQ(after->scale_at_start, before->scale_at_end) << what;
        int clipped_before_k = 0;
        for (int s = 0; s < k; ++s) clipped_before_k += reference->steps[s].clip_coef < 1.0;
        EXPECT_GT(clipped_before_k, 0) << "clipping never active before the save: " << what;
        if (precision == Precision::kFp16Mixed) {
          // The loss-scale state at the save is not the initial one (an
          // overflow, a clean step or a change of scale happened).
          const auto& saved = before->scale_at_end;
          EXPECT_TRUE(saved.scale != (1 << 17) || saved.hysteresis_left != 2 ||
                      saved.clean_steps != 0)
              << what;
        }
      }
    }
  }
}

// Weights of a run that loaded `dir` and trained no step.
absl::StatusOr<LegResult> LoadOnly(const mlp::MlpConfig& cfg, const RunConfig& run,
                                   const std::string& dir) {
  Leg leg{run, 0, dir, ""};
  return RunLeg(cfg, leg);
}

TEST(CheckpointTest, ReshardingToAnotherWorldSizeOrStageKeepsTheWeightsAndTheTrajectory) {
  const mlp::MlpConfig cfg = SmallMlp();
  struct Case {
    int from_world, from_stage, to_world, to_stage;
  };
  // The resharding list: 4->2, 2->3, 3->1, 1->4 ranks; stages 2->3,
  // 3->1, 0->2 (on 2 ranks), mixed with other stages on the way.
  const Case cases[] = {{4, 2, 2, 2}, {2, 1, 3, 3}, {3, 3, 1, 0}, {1, 0, 4, 1},
                        {2, 2, 2, 3}, {2, 3, 2, 1}, {2, 0, 2, 2}};
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    for (const Case& c : cases) {
      const std::string what = absl::StrFormat("%s: world %d stage %d -> world %d stage %d, %s",
                                               PrecisionName(precision), c.from_world, c.from_stage,
                                               c.to_world, c.to_stage, SeedTrace());
      TempDir dir;
      const int k = 4;
      Leg source{Config(c.from_world, c.from_stage, precision), k, "", dir.Sub("source")};
      auto saved = RunLeg(cfg, source);
      ASSERT_TRUE(saved.ok()) << saved.status() << " " << what;
      // 1. The same weights as the source run at step k, bit for bit.
      auto loaded = LoadOnly(cfg, Config(c.to_world, c.to_stage, precision), dir.Sub("source"));
      ASSERT_TRUE(loaded.ok()) << loaded.status() << " " << what;
      EXPECT_TRUE(SameParams(*loaded, *saved)) << "weights after the resharded load: " << what;
      EXPECT_EQ(loaded->loaded.world_size, c.from_world) << what;
      // 2. The continued run equals one that reached the same state on the
      //    new world size by another path: a checkpoint written by one rank
      //    (stage 0) from the same state, loaded there.
      Leg hop{Config(1, 0, precision), 0, dir.Sub("source"), dir.Sub("one_rank")};
      ASSERT_TRUE(RunLeg(cfg, hop).ok()) << what;
      Leg direct{Config(c.to_world, c.to_stage, precision), kSteps - k, dir.Sub("source"), ""};
      Leg via_one{Config(c.to_world, c.to_stage, precision), kSteps - k, dir.Sub("one_rank"), ""};
      auto a = RunLeg(cfg, direct);
      auto b = RunLeg(cfg, via_one);
      ASSERT_TRUE(a.ok() && b.ok()) << what;
      EXPECT_TRUE(SameParams(*a, *b)) << "continued runs differ: " << what;
      for (int s = 0; s < kSteps - k; ++s) {
        EXPECT_TRUE(SameBits(a->losses[s], b->losses[s])) << "step " << k + s + 1 << ": " << what;
      }
      // 3. Against the source run going on at its own world size, with the
      //    same global batch when the world sizes allow it (world x accum
      //    kept): the same trajectory up to the order of the sums.
      if ((c.from_world % c.to_world) == 0) {
        Leg whole{Config(c.from_world, c.from_stage, precision), kSteps, "", ""};
        Leg same_batch{Config(c.to_world, c.to_stage, precision, c.from_world / c.to_world),
                       kSteps - k, dir.Sub("source"), ""};
        auto reference = RunLeg(cfg, whole);
        auto resharded = RunLeg(cfg, same_batch);
        ASSERT_TRUE(reference.ok() && resharded.ok()) << what;
        RunResult x, y;
        x.params = resharded->params;
        y.params = reference->params;
        const double l2 = RelativeL2Difference(x, y);
        const double bound = precision == Precision::kFp32 ? 1e-6 : 5e-3;
        EXPECT_LE(l2, bound) << what;
        std::printf("%s: relative L2 weight difference after %d more steps: %.3g%s\n", what.c_str(),
                    kSteps - k, l2,
                    c.from_world == c.to_world ? " (same world: bitwise expected)" : "");
        if (c.from_world == c.to_world && precision == Precision::kFp32) {
          EXPECT_TRUE(SameParams(*resharded, *reference)) << what;
        }
      }
    }
  }
}

// Copies a step directory (for the corruption cases).
void CopyTree(const std::string& from, const std::string& to) {
  ASSERT_EQ(std::system(("cp -r '" + from + "' '" + to + "'").c_str()), 0);
}

void FlipByte(const std::string& file, int64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << file;
  f.seekg(offset);
  char byte = 0;
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  f.seekp(offset);
  f.write(&byte, 1);
}

// Edits step_dir/manifest.json's JSON and seals it with a fresh checksum,
// as the writer computes it (the CRC32C of dump(1) without the field): a
// manifest whose checksum holds but whose content lies.
void RewriteManifest(const std::string& step_dir,
                     const std::function<void(nlohmann::json& doc)>& edit) {
  const std::string path = step_dir + "/manifest.json";
  nlohmann::json doc = nlohmann::json::parse(*ReadTestFile(path));
  doc.erase("manifest_crc32c");
  edit(doc);
  const std::string body = doc.dump(1);
  doc["manifest_crc32c"] = kernels::Crc32c(body.data(), body.size());
  std::ofstream(path, std::ios::trunc) << doc.dump(1) << "\n";
}

TEST(CheckpointTest, DamagedOrForeignCheckpointsAreRefusedAndTheEngineIsUnchanged) {
  const mlp::MlpConfig cfg = SmallMlp();
  TempDir dir;
  const RunConfig run = Config(2, 2, Precision::kBf16Mixed);
  // Two complete checkpoints: step 2 and step 4 (the latest).
  Leg first{run, 2, "", dir.Sub("ckpt")};
  ASSERT_TRUE(RunLeg(cfg, first).ok());
  Leg second{run, 2, dir.Sub("ckpt"), dir.Sub("ckpt")};
  auto at4 = RunLeg(cfg, second);
  ASSERT_TRUE(at4.ok()) << at4.status();
  const std::string good = dir.Sub("ckpt/step_00000004");
  const std::string previous = dir.Sub("ckpt/step_00000002");
  auto manifest = internal::ReadManifest(good);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const int64_t data_begin = internal::TensorOffset(manifest->shard_numel, 1, 2);

  struct Damage {
    const char* name;
    std::function<void(const std::string& step_dir)> apply;
    absl::StatusCode code;
    const char* message;
  };
  const Damage cases[] = {
      {"a flipped byte in rank 1's data",
       [&](const std::string& d) { FlipByte(d + "/rank_00001.bin", data_begin + 9); },
       absl::StatusCode::kDataLoss, "rank_00001.bin: crc mismatch in unit 'block.1' tensor adam_v"},
      {"a truncated rank file",
       [](const std::string& d) { ASSERT_EQ(truncate((d + "/rank_00000.bin").c_str(), 1000), 0); },
       absl::StatusCode::kDataLoss, "rank_00000.bin: it has 1000 bytes"},
      {"a missing rank file",
       [](const std::string& d) { ASSERT_EQ(unlink((d + "/rank_00001.bin").c_str()), 0); },
       absl::StatusCode::kNotFound, "rank_00001.bin"},
      {"a flipped byte in the chunk index",
       [&](const std::string& d) {
         FlipByte(d + "/rank_00000.bin", internal::TensorOffset(manifest->shard_numel, 3, 0) + 2);
       },
       absl::StatusCode::kDataLoss, "crc mismatch in its chunk index"},
      {"a damaged manifest",
       [](const std::string& d) {
         std::ofstream(d + "/manifest.json", std::ios::trunc) << "{\"format\": \"zeroshard-chec";
       },
       absl::StatusCode::kDataLoss, "manifest.json: not a JSON object"},
      {"an edited manifest (step 4 -> 5, checksum not updated)",
       [](const std::string& d) {
         std::string text = *ReadTestFile(d + "/manifest.json");
         const size_t at = text.find("\"step\": 4,");
         ASSERT_NE(at, std::string::npos);
         text.replace(at, 10, "\"step\": 5,");
         std::ofstream(d + "/manifest.json", std::ios::trunc) << text;
       },
       absl::StatusCode::kDataLoss, "manifest.json: CRC32C mismatch"},
      {"a manifest naming another world size (checksum updated)",
       [&](const std::string& d) {
         internal::Manifest edited = *manifest;
         edited.world_size = 3;
         std::ofstream(d + "/manifest.json", std::ios::trunc) << internal::ManifestToJson(edited);
       },
       absl::StatusCode::kInvalidArgument, "field 'files' lists 2 files for a world of 3 ranks"},
      // Every byte of a rank file's header and trailer is checked, by Load
      // as by inspect: the reserved bytes, the tensor count.
      {"a flipped byte 45 of rank 1's header (reserved)",
       [](const std::string& d) { FlipByte(d + "/rank_00001.bin", 45); },
       absl::StatusCode::kDataLoss, "rank_00001.bin: its header's reserved bytes"},
      {"a flipped byte 25 of rank 0's header (tensors per unit)",
       [](const std::string& d) { FlipByte(d + "/rank_00000.bin", 25); },
       absl::StatusCode::kDataLoss,
       "its header's tensors per unit (bytes [24, 28)) holds 4099, expected 3"},
      // Manifest fields that lie under a valid checksum.
      {"a unit checksum that is not the file's (checksum updated)",
       [](const std::string& d) {
         RewriteManifest(d, [](nlohmann::json& doc) {
           auto& crc = doc["files"][1]["unit_crc32c"][2];
           crc = crc.get<uint32_t>() ^ 1u;
         });
       },
       absl::StatusCode::kDataLoss, "rank_00001.bin: crc mismatch in unit 'block.2'"},
      {"another model fingerprint (checksum updated)",
       [](const std::string& d) {
         RewriteManifest(
             d, [](nlohmann::json& doc) { doc["model"]["fingerprint"] = "0123456789abcdef"; });
       },
       absl::StatusCode::kInvalidArgument, "field 'model.fingerprint' is 0123456789abcdef"},
      {"another param count (checksum updated)",
       [](const std::string& d) {
         RewriteManifest(d, [](nlohmann::json& doc) {
           doc["model"]["num_params"] = doc["model"]["num_params"].get<int64_t>() + 1;
         });
       },
       absl::StatusCode::kInvalidArgument, "field 'model.num_params'"},
      {"another param alignment (checksum updated)",
       [](const std::string& d) {
         RewriteManifest(d, [](nlohmann::json& doc) { doc["layout"]["param_alignment"] = 32; });
       },
       absl::StatusCode::kInvalidArgument, "field 'layout.param_alignment' is 32"},
      {"the tensors in another order (checksum updated)",
       [](const std::string& d) {
         RewriteManifest(d, [](nlohmann::json& doc) {
           doc["layout"]["tensors"] = {"adam_m", "master", "adam_v"};
         });
       },
       absl::StatusCode::kInvalidArgument, "field 'layout.tensors'"},
      {"a field no zeroshard manifest has (checksum updated)",
       [](const std::string& d) {
         RewriteManifest(d, [](nlohmann::json& doc) { doc["train"]["dropout"] = 0.1; });
       },
       absl::StatusCode::kInvalidArgument, "'train' holds a field 'dropout'"},
      {"a trainer state nested 100 levels deep (checksum updated)",
       [](const std::string& d) {
         RewriteManifest(d, [](nlohmann::json& doc) {
           nlohmann::json deep = 1;
           for (int i = 0; i < 100; ++i) deep = nlohmann::json::array({deep});
           doc["trainer_state"]["deep"] = deep;
         });
       },
       absl::StatusCode::kDataLoss, "levels deep, more than the 40 a manifest has"},
      {"a half-written step (no manifest)",
       [](const std::string& d) { ASSERT_EQ(unlink((d + "/manifest.json").c_str()), 0); },
       absl::StatusCode::kFailedPrecondition, "not a complete checkpoint"},
  };
  for (const Damage& damage : cases) {
    const std::string copy = dir.Sub(std::string("damaged_") + std::to_string(&damage - cases));
    CopyTree(good, copy);
    damage.apply(copy);
    auto refused = LoadOnly(cfg, run, copy);
    if (refused.ok()) {
      ADD_FAILURE() << damage.name << " was loaded";
      continue;
    }
    EXPECT_EQ(refused.status().code(), damage.code) << damage.name << ": " << refused.status();
    EXPECT_NE(refused.status().message().find(damage.message), std::string::npos)
        << damage.name << ": " << refused.status();
    std::printf("refused, %s: %s\n", damage.name, std::string(refused.status().message()).c_str());
    // InspectCheckpoint finds it too (or refuses the manifest).
    std::vector<std::string> problems;
    auto inspected = InspectCheckpoint(copy, &problems);
    EXPECT_TRUE(!inspected.ok() || !problems.empty()) << damage.name;
  }
  // Another model, another optimizer, not a checkpoint at all.
  mlp::MlpConfig wider = cfg;
  wider.hidden += 8;
  auto other_model = LoadOnly(wider, run, good);
  EXPECT_EQ(other_model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other_model.status().message().find("belongs to another model"), std::string::npos)
      << other_model.status();
  std::printf("refused, another model: %s\n", std::string(other_model.status().message()).c_str());
  Leg other_optimizer{run, 0, good, ""};
  {
    const ModelSpec spec_for_beta = mlp::BuildModelSpec(cfg);
    absl::Status beta = RunLocalRanks(2, [&](int, Communicator& comm) -> absl::Status {
      auto device = CreateCpuDevice();
      TrainSpec train = LegTrainSpec(other_optimizer);
      train.optimizer.beta2 = 0.95;
      ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec_for_beta, train, *device, comm));
      return engine->Load(good).status();
    });
    EXPECT_EQ(beta.code(), absl::StatusCode::kInvalidArgument) << beta;
    EXPECT_NE(beta.message().find("the Adam moments do not carry over"), std::string::npos) << beta;
    std::printf("refused, another optimizer: %s\n", std::string(beta.message()).c_str());
  }
  {
    auto not_a_checkpoint = LoadOnly(cfg, run, dir.path());
    EXPECT_EQ(not_a_checkpoint.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(not_a_checkpoint.status().message().find("is not a zeroshard checkpoint"),
              std::string::npos)
        << not_a_checkpoint.status();
    std::printf("refused, not a checkpoint: %s\n",
                std::string(not_a_checkpoint.status().message()).c_str());
  }

  // A refused load leaves the engine as it was: on the same engines, a
  // damaged load, then the previous checkpoint, then training, equals
  // loading the previous checkpoint directly.
  const std::string damaged = dir.Sub("damaged_0");
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  std::vector<std::vector<float>> after_retry;
  std::mutex mu;
  absl::Status retried = RunLocalRanks(2, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    Leg leg{run, 0, "", ""};
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, LegTrainSpec(leg), *device, comm));
    const absl::StatusOr<CheckpointInfo> bad = engine->Load(damaged);
    if (bad.ok()) return absl::InternalError("the damaged checkpoint loaded");
    ZS_RETURN_IF_ERROR(engine->Load(previous).status());
    ZS_RETURN_IF_ERROR(engine->Start(mlp::TrainerSettings(cfg)));
    mlp::MlpTrainer trainer(cfg, *engine, comm);
    ZS_RETURN_IF_ERROR(trainer.TrainStep().status());
    ZS_ASSIGN_OR_RETURN(std::vector<float> w, engine->GetParam(1, mlp::kW1));
    std::lock_guard<std::mutex> lock(mu);
    if (rank == 0) after_retry.push_back(std::move(w));
    return absl::OkStatus();
  });
  ASSERT_TRUE(retried.ok()) << retried;
  Leg clean{run, 1, previous, ""};
  auto direct = RunLeg(cfg, clean);
  ASSERT_TRUE(direct.ok());
  ASSERT_EQ(after_retry.size(), 1u);
  EXPECT_EQ(std::memcmp(after_retry[0].data(), direct->params[1][mlp::kW1].data(),
                        after_retry[0].size() * sizeof(float)),
            0)
      << "a refused load changed the engine";
}

TEST(CheckpointTest, TheDirectoryKeepsTheLastKCompleteStepsAndLatestNamesTheNewest) {
  const mlp::MlpConfig cfg = SmallMlp();
  TempDir dir;
  const std::string root = dir.Sub("ckpt");
  const RunConfig run = Config(3, 3, Precision::kFp32);
  // Steps 1..5, one save after each, keeping 2; a leftover half-written step.
  ASSERT_TRUE(internal::MakeDirectories(root + "/step_00000000.partial").ok());
  std::string load;
  for (int s = 1; s <= 5; ++s) {
    Leg leg{run, 1, load, root};
    leg.keep_last = 2;
    ASSERT_TRUE(RunLeg(cfg, leg).ok()) << "step " << s;
    load = root;
  }
  auto names = internal::ListDirectory(root);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"latest", "step_00000004", "step_00000005"}));
  EXPECT_EQ(*ReadTestFile(root + "/latest"), "step_00000005\n");
  auto resolved = ResolveCheckpoint(root);
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(*resolved, root + "/step_00000005");
  std::vector<std::string> problems;
  auto info = InspectCheckpoint(root, &problems);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(problems.empty()) << problems.front();
  EXPECT_EQ(info->step, 5);
  EXPECT_EQ(info->world_size, 3);
  EXPECT_EQ(info->zero_stage, 3);
}

// Saves in flight while training goes on: each checkpoint holds the state of
// its own step, not a later one (the snapshot is reused from save to save).
TEST(CheckpointTest, BackgroundSavesWhileTrainingHoldTheirOwnStep) {
  const mlp::MlpConfig cfg = SmallMlp();
  for (bool keep_snapshot : {true, false}) {
    TempDir dir;
    const RunConfig run = Config(2, 2, Precision::kBf16Mixed);
    Leg leg{run, 5, "", dir.Sub("ckpt")};
    leg.save_every = 1;
    leg.keep_last = 5;
    leg.keep_snapshot = keep_snapshot;
    ASSERT_TRUE(RunLeg(cfg, leg).ok());
    for (int k = 1; k <= 5; ++k) {
      const std::string what =
          absl::StrFormat("step %d, keep_snapshot %d, %s", k, keep_snapshot, SeedTrace());
      Leg reference{run, k, "", ""};
      auto want = RunLeg(cfg, reference);
      ASSERT_TRUE(want.ok()) << want.status();
      auto loaded = LoadOnly(cfg, run, dir.Sub(absl::StrFormat("ckpt/step_%08d", k)));
      ASSERT_TRUE(loaded.ok()) << loaded.status() << " " << what;
      EXPECT_EQ(loaded->loaded.step, k) << what;
      EXPECT_TRUE(SameParams(*loaded, *want)) << "weights of the checkpoint: " << what;
    }
  }
}

TEST(CheckpointTest, ExportWritesTheEnginesMasterWeightsAsSafetensors) {
  const mlp::MlpConfig cfg = SmallMlp();
  TempDir dir;
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    const std::string ckpt = dir.Sub(std::string("ckpt_") + PrecisionName(precision));
    Leg leg{Config(3, 3, precision), 4, "", ckpt};
    auto trained = RunLeg(cfg, leg);
    ASSERT_TRUE(trained.ok()) << trained.status();
    const ModelSpec spec = mlp::BuildModelSpec(cfg);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const std::string file = dir.Sub(std::string("model_") + DTypeName(dtype) + ".safetensors");
      ExportStats stats;
      ASSERT_TRUE(ExportSafetensors(ckpt, file, dtype, &stats).ok());
      const std::string bytes = *ReadTestFile(file);
      auto index = internal::ParseSafetensorsHeader(bytes, static_cast<int64_t>(bytes.size()));
      ASSERT_TRUE(index.ok()) << index.status();
      EXPECT_EQ(stats.bytes_written, static_cast<int64_t>(bytes.size()));
      EXPECT_EQ(index->metadata.at("zeroshard_step"), "4");
      // Memory bounded by the largest unit: one unit's fp32 values.
      int64_t largest = 0;
      for (const UnitSpec& u : spec.units) largest = std::max(largest, u.NumElements());
      EXPECT_LE(stats.peak_buffer_bytes, 4 * (largest + 4 * internal::kParamAlignment));
      int found = 0;
      for (const internal::SafetensorsEntry& e : index->tensors) {
        // "block.<u>.<param>": the engine's value of that param, exactly.
        for (size_t u = 0; u < spec.units.size(); ++u) {
          for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
            if (e.name != spec.units[u].name + "." + spec.units[u].params[p].name) continue;
            ++found;
            EXPECT_EQ(e.shape, spec.units[u].params[p].shape) << e.name;
            const std::vector<float>& want = trained->params[u][p];
            const char* data = bytes.data() + index->data_start + e.begin;
            if (dtype == DType::kFloat32) {
              ASSERT_EQ(e.end - e.begin, static_cast<int64_t>(want.size() * 4)) << e.name;
              EXPECT_EQ(std::memcmp(data, want.data(), want.size() * 4), 0) << e.name;
            } else {
              ASSERT_EQ(e.end - e.begin, static_cast<int64_t>(want.size() * 2)) << e.name;
              for (size_t i = 0; i < want.size(); ++i) {
                uint16_t h;
                std::memcpy(&h, data + 2 * i, 2);
                ASSERT_EQ(h, Fp32ToBf16(want[i])) << e.name << "[" << i << "]";
              }
            }
          }
        }
      }
      EXPECT_EQ(found, static_cast<int>(spec.units.size()) * mlp::kNumBlockParams);
    }
  }
}

}  // namespace
}  // namespace zeroshard::testing
