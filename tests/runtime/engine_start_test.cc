// The engine's start-up checks and API misuse: Start() refuses ranks that
// disagree, bad calls are errors, not crashes, and Create refuses a device
// its communicator cannot serve. (engine_test.cc: training equivalence.)
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

// Start() must refuse ranks that disagree, naming the rank, the field and
// both values.
struct Perturbation {
  std::function<void(TrainSpec&)> train;      // on the last rank
  std::function<void(ModelSpec&)> model;      // on the last rank
  std::function<void(mlp::MlpConfig&)> data;  // the last rank's trainer settings
  bool other_weights = false;                 // one weight of block.1 w2 on the last rank
};

absl::Status StartWithPerturbation(int world, const Perturbation& change) {
  const mlp::MlpConfig cfg = SmallMlp();
  return RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    const bool odd = rank == world - 1;
    auto device = CreateCpuDevice();
    RunConfig run;
    run.world = world;
    run.stage = 1;
    TrainSpec train = MakeTrainSpec(run);
    ModelSpec spec = mlp::BuildModelSpec(cfg);
    mlp::MlpConfig mine = cfg;
    if (odd && change.train) change.train(train);
    if (odd && change.model) change.model(spec);
    if (odd && change.data) change.data(mine);
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
    for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
      for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
        std::vector<float> w(spec.units[u].params[p].NumElements(), 0.01f);
        if (u < cfg.blocks && p < mlp::kNumBlockParams) {
          w = mlp::InitialParam(cfg, u, p);
          w.resize(spec.units[u].params[p].NumElements(), 0.01f);
        }
        if (odd && change.other_weights && u == 1 && p == mlp::kW2) w[5] += 1e-3f;
        ZS_RETURN_IF_ERROR(engine->SetParam(u, p, w));
      }
    }
    return engine->Start(mlp::TrainerSettings(mine));
  });
}

TEST(EngineStartTest, NamesTheTrainSpecFieldAndBothValues) {
  Perturbation change;
  change.train = [](TrainSpec& t) {
    t.optimizer.lr *= 2;
    t.grad_accum_steps = 3;
  };
  const absl::Status status = StartWithPerturbation(3, change);
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  const std::string message(status.message());
  EXPECT_NE(message.find("rank 2 differs from rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("train spec optimizer.lr (rank 0: 0.003, rank 2: 0.006)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("train spec grad_accum_steps (rank 0: 1, rank 2: 3)"), std::string::npos)
      << message;
}

TEST(EngineStartTest, NamesADifferentUnitCount) {
  Perturbation change;
  change.model = [](ModelSpec& spec) { spec.units.push_back({"extra", {{"w", {8}, false}}}); };
  const absl::Status status = StartWithPerturbation(2, change);
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  const std::string message(status.message());
  EXPECT_NE(message.find("model spec: number of units (rank 0: 3, rank 1: 4)"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("count"), std::string::npos) << "a size mismatch of the exchange itself";
}

TEST(EngineStartTest, NamesTheUnitWhoseShapeDiffers) {
  Perturbation change;
  change.model = [](ModelSpec& spec) { spec.units[1].params[1].shape[0] += 1; };  // block.1 b1
  const absl::Status status = StartWithPerturbation(2, change);
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  const std::string message(status.message());
  const mlp::MlpConfig cfg = SmallMlp();
  const int64_t elements = mlp::BuildModelSpec(cfg).units[1].NumElements();
  EXPECT_NE(message.find(absl::StrFormat("unit 1 ('block.1' here): rank 0 has %d elements, rank "
                                         "1 has %d",
                                         elements, elements + 1)),
            std::string::npos)
      << message;
}

// A param group (lr_scale, weight_decay) or a trainable flag that differs on
// one rank: the spec's fingerprint covers them, and the unit is named.
TEST(EngineStartTest, NamesTheUnitWhoseParamGroupOrTrainableFlagDiffers) {
  std::mt19937_64 rng(Seed());
  const int param = static_cast<int>(rng() % mlp::kNumBlockParams);
  const double value = std::ldexp(static_cast<double>(1 + rng() % 255), -8);
  const std::vector<std::pair<const char*, std::function<void(ParamSpec&)>>> changes = {
      {"lr_scale", [&](ParamSpec& p) { p.lr_scale = value; }},
      {"trainable", [](ParamSpec& p) { p.trainable = false; }},
      {"weight_decay",
       [&](ParamSpec& p) {
         p.no_decay = false;
         p.weight_decay = value;
       }},
  };
  for (const auto& [field, change_param] : changes) {
    SCOPED_TRACE(::testing::Message()
                 << field << " of block.1 param " << param << "; " << SeedTrace());
    Perturbation change;
    change.model = [&, change_param = change_param](ModelSpec& spec) {
      change_param(spec.units[1].params[param]);
    };
    const int world = 2 + static_cast<int>(rng() % 3);
    const absl::Status status = StartWithPerturbation(world, change);
    ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    const std::string message(status.message());
    EXPECT_NE(message.find(absl::StrFormat(
                  "rank %d differs from rank 0 in model spec (unit and param names, shapes, "
                  "no_decay, tp_split_dim, trainable, tied_to, lr_scale, weight_decay)",
                  world - 1)),
              std::string::npos)
        << message;
    EXPECT_NE(message.find(absl::StrFormat(
                  "rank %d differs from rank 0 in unit 1 ('block.1' here): same element count, "
                  "but its name or its params' names, shapes, no_decay, tp_split_dim, "
                  "trainable, tied_to, lr_scale or weight_decay differ",
                  world - 1)),
              std::string::npos)
        << message;
    // Only that unit.
    EXPECT_EQ(message.find("unit 0 ("), std::string::npos) << message;
    EXPECT_EQ(message.find("unit 2 ("), std::string::npos) << message;
  }
}

TEST(EngineStartTest, NamesTheParamWhoseInitialWeightsDiffer) {
  Perturbation change;
  change.other_weights = true;
  const absl::Status status = StartWithPerturbation(2, change);
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("initial weights of unit 'block.1', param 'w2'"),
            std::string::npos)
      << status;
}

TEST(EngineStartTest, NamesTheTrainerSettingAndBothValues) {
  Perturbation change;
  change.data = [](mlp::MlpConfig& cfg) { cfg.micro_batch *= 2; };
  const absl::Status status = StartWithPerturbation(4, change);
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  const mlp::MlpConfig cfg = SmallMlp();
  EXPECT_NE(
      status.message().find(absl::StrFormat(
          "rank 3 differs from rank 0 in trainer setting micro_batch (rank 0: %d, rank 3: %d)",
          cfg.micro_batch, 2 * cfg.micro_batch)),
      std::string::npos)
      << status;
  Perturbation seed;
  seed.data = [](mlp::MlpConfig& cfg) { cfg.data_seed += 1; };
  EXPECT_NE(StartWithPerturbation(2, seed).message().find("trainer setting data_seed"),
            std::string::npos);
}

TEST(EngineStartTest, AgreeingRanksStart) { EXPECT_TRUE(StartWithPerturbation(4, {}).ok()); }

TEST(EngineStartTest, RefusesBadSettingsAndNonFiniteWeights) {
  const mlp::MlpConfig cfg = SmallMlp();
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  const absl::Status status = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    RunConfig run;
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, MakeTrainSpec(run), *device, comm));
    for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
      std::vector<float> w = mlp::InitialParam(cfg, 2, mlp::kW1);
      w[17] = bad;
      const absl::Status set = engine->SetParam(2, mlp::kW1, w);
      EXPECT_EQ(set.code(), absl::StatusCode::kInvalidArgument) << set;
      EXPECT_NE(set.message().find("SetParam(block.2.w1): element 17"), std::string::npos) << set;
      EXPECT_NE(set.message().find("must be finite"), std::string::npos) << set;
    }
    ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, cfg));
    const TrainerSetting twice[] = {TrainerSetting::Int("seed", 1), TrainerSetting::Int("seed", 2)};
    EXPECT_NE(engine->Start(twice).message().find("'seed' is given twice"), std::string::npos);
    const TrainerSetting unnamed[] = {TrainerSetting::Real("", 1.0)};
    EXPECT_NE(engine->Start(unnamed).message().find("has no name"), std::string::npos);
    return engine->Start(mlp::TrainerSettings(cfg));
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(EngineApiTest, MisuseIsAnErrorNotACrash) {
  const mlp::MlpConfig cfg = SmallMlp();
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  absl::Status status = RunLocalRanks(1, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    RunConfig run;
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, MakeTrainSpec(run), *device, comm));
    EXPECT_EQ(engine->Gather(0).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(engine->Start().message().find("never set"), std::string::npos);
    ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, cfg));
    EXPECT_EQ(engine->SetParam(0, 0, std::vector<float>(3)).code(),
              absl::StatusCode::kInvalidArgument);
    ZS_RETURN_IF_ERROR(engine->Start());
    EXPECT_EQ(engine->Gather(99).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(engine->ReduceGrads(0).code(), absl::StatusCode::kFailedPrecondition);
    auto step = engine->Step();
    EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(step.status().message().find("block.0"), std::string::npos) << step.status();
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Issue 17: Release of a unit that was never gathered returned OK at stage
// 1 (resident units returned early) but FailedPrecondition at stage 3. It
// is a trainer bug at every stage: a Release without its Gather, and a
// second Release, fail with the same message at stages 0, 1, 2 and 3.
TEST(EngineApiTest, ReleaseWithoutItsGatherFailsAlikeAtEveryStage) {
  const mlp::MlpConfig cfg = SmallMlp();
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  // Units drawn from the test seed: one never gathered, one released twice.
  const int never = static_cast<int>(Seed() % cfg.blocks);
  const int twice = static_cast<int>((Seed() / cfg.blocks) % cfg.blocks);
  const int other = (twice + 1) % cfg.blocks;
  const std::string name_never = spec.units[never].name;
  const std::string name_twice = spec.units[twice].name;
  const std::string name_other = spec.units[other].name;
  std::vector<std::vector<std::string>> messages;  // [stage][case], rank 0
  for (int stage = 0; stage <= 3; ++stage) {
    std::vector<std::string> got(3);
    RunConfig run;
    run.world = 2;
    run.stage = stage;
    const absl::Status status =
        RunLocalRanks(run.world, [&](int rank, Communicator& comm) -> absl::Status {
          auto device = CreateCpuDevice();
          ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, MakeTrainSpec(run), *device, comm));
          ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, cfg));
          ZS_RETURN_IF_ERROR(engine->Start());
          std::vector<absl::Status> refused;
          refused.push_back(engine->Release(never));  // never gathered
          ZS_RETURN_IF_ERROR(engine->Gather(twice).status());
          ZS_RETURN_IF_ERROR(engine->Release(twice));
          refused.push_back(engine->Release(twice));  // released already
          ZS_RETURN_IF_ERROR(engine->Gather(other).status());
          refused.push_back(engine->Release(twice));  // another unit is gathered
          ZS_RETURN_IF_ERROR(engine->Release(other));
          for (size_t k = 0; k < refused.size(); ++k) {
            EXPECT_EQ(refused[k].code(), absl::StatusCode::kFailedPrecondition)
                << "stage " << stage << " case " << k << ": " << refused[k] << "; " << SeedTrace();
            if (rank == 0) got[k] = std::string(refused[k].message());
          }
          // The engine is unharmed: a full micro-batch and a step still run.
          for (int u = 0; u < cfg.blocks; ++u) {
            ZS_RETURN_IF_ERROR(engine->Gather(u).status());
            ZS_RETURN_IF_ERROR(engine->Release(u));
          }
          for (int u = cfg.blocks - 1; u >= 0; --u) {
            ZS_RETURN_IF_ERROR(engine->Gather(u).status());
            ZS_ASSIGN_OR_RETURN(const UnitView g, engine->GradView(u));
            for (const TensorView& t : g.params) {
              std::fill(t.as<float>(), t.as<float>() + t.numel, 0.01f * (rank + 1));
            }
            ZS_RETURN_IF_ERROR(engine->ReduceGrads(u));
            ZS_RETURN_IF_ERROR(engine->Release(u));
          }
          return engine->Step().status();
        });
    ASSERT_TRUE(status.ok()) << "stage " << stage << ": " << status;
    messages.push_back(got);
  }
  const std::string remedy = "; every Release follows a Gather of the same unit, once";
  EXPECT_EQ(messages[0][0],
            "Release(" + name_never + "): the unit is not gathered (no unit is gathered)" + remedy);
  EXPECT_EQ(messages[0][1],
            "Release(" + name_twice + "): the unit is not gathered (no unit is gathered)" + remedy);
  EXPECT_EQ(messages[0][2], "Release(" + name_twice + "): the unit is not gathered ('" +
                                name_other + "' is gathered)" + remedy);
  for (int stage = 1; stage <= 3; ++stage) {
    EXPECT_EQ(messages[stage], messages[0]) << "stage " << stage << " vs stage 0";
  }
}

TEST(EngineApiTest, RejectsInvalidTrainSpecs) {
  const ModelSpec spec = mlp::BuildModelSpec(SmallMlp());
  auto device = CreateCpuDevice();
  absl::Status status = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    TrainSpec t;
    t.zero_stage = 4;
    EXPECT_NE(Engine::Create(spec, t, *device, comm).status().message().find("zero_stage"),
              std::string::npos);
    t.zero_stage = 1;
    t.optimizer.eps = 0;
    EXPECT_NE(Engine::Create(spec, t, *device, comm).status().message().find("eps"),
              std::string::npos);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok());
}

}  // namespace
}  // namespace zeroshard::testing

namespace zeroshard::testing {
namespace {

// A device that says it holds GPU memory (its memory is the host's: only
// its kind matters here).
class PretendGpuDevice final : public Device {
 public:
  explicit PretendGpuDevice(std::string name = "cuda:7") : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  bool host_accessible() const override { return false; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override { return cpu_->CreateStream(); }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override { return cpu_->CreateEvent(); }
  absl::Status CopyAsync(void* dst, const void* src, int64_t bytes, Stream& stream) override {
    return cpu_->CopyAsync(dst, src, bytes, stream);
  }
  absl::Status ZeroAsync(void* dst, int64_t bytes, Stream& stream) override {
    return cpu_->ZeroAsync(dst, bytes, stream);
  }

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t bytes) override { return std::calloc(1, bytes); }
  void RawFree(void* ptr) override { std::free(ptr); }

 private:
  std::string name_;
  std::unique_ptr<Device> cpu_ = CreateCpuDevice();
};

// A local group on one GPU's memory and an engine on another GPU: refused by
// name (the sum kernels on the group's GPU could not read the engine's
// buffers). In a build without CUDA the group itself cannot be made.
TEST(EngineCreateTest, AnEngineOnAnotherGpuThanItsGroupIsRefused) {
  PretendGpuDevice group_gpu("cuda:7");
  PretendGpuDevice engine_gpu("cuda:3");
  CommOptions options;
  options.device = &group_gpu;
  auto group = CreateLocalGroup(1, options);
  if (!group.ok()) {
    EXPECT_EQ(group.status().code(), absl::StatusCode::kUnimplemented) << group.status();
    EXPECT_NE(group.status().message().find("built without CUDA"), std::string::npos)
        << group.status();
    return;
  }
  RunConfig run;
  auto engine =
      Engine::Create(mlp::BuildModelSpec(SmallMlp()), MakeTrainSpec(run), engine_gpu, *(*group)[0]);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("the engine's device is cuda:3 but the 'local' "
                                           "communicator's group moves cuda:7's memory"),
            std::string::npos)
      << engine.status();
}

TEST(EngineCreateTest, ADeviceWhoseMemoryTheCommunicatorCannotMoveIsRefused) {
  auto group = CreateLocalGroup(1);
  ASSERT_TRUE(group.ok());
  PretendGpuDevice device;
  RunConfig run;
  auto engine =
      Engine::Create(mlp::BuildModelSpec(SmallMlp()), MakeTrainSpec(run), device, *(*group)[0]);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("cuda:7 holds GPU memory, but the 'local' communicator "
                                           "moves host memory"),
            std::string::npos)
      << engine.status();
  EXPECT_EQ(device.ledger().current_total(), 0);
}

}  // namespace
}  // namespace zeroshard::testing
