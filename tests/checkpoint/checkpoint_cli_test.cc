// Runs the built `zeroshard inspect` and `zeroshard export` on a checkpoint
// written by a 2-rank engine: what they print, their exit codes on sound,
// damaged and foreign input, and that a failed export leaves no file.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/safetensors.h"
#include "engine/src/common/bounded_read.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/runtime/engine_test_util.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class CheckpointCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zs_checkpoint_cli_test_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { internal::RemoveTree(dir_).IgnoreError(); }

  std::string Sub(const std::string& name) const { return internal::JoinPath(dir_, name); }

  Result Run(const std::string& args) const {
    const std::string err_path = Sub("stderr.txt");
    const std::string command = std::string(ZS_BINARY) + " " + args + " 2>" + err_path;
    Result r;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
    const int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream err(err_path);
    std::stringstream text;
    text << err.rdbuf();
    r.err = text.str();
    return r;
  }

  // Trains the small MLP 3 steps on 2 ranks (stage 2, bf16) and saves into
  // `root`; returns rank 0's GetParam of every param.
  std::vector<std::vector<float>> SaveCheckpoint(const std::string& root) {
    const mlp::MlpConfig cfg = SmallMlp();
    const ModelSpec spec = mlp::BuildModelSpec(cfg);
    RunConfig run;
    run.world = 2;
    run.stage = 2;
    run.precision = Precision::kBf16Mixed;
    const TrainSpec train = MakeTrainSpec(run);
    std::vector<std::vector<float>> params;
    std::mutex mu;
    absl::Status status = RunLocalRanks(2, [&](int rank, Communicator& comm) -> absl::Status {
      auto device = CreateCpuDevice();
      ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
      ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, cfg));
      ZS_RETURN_IF_ERROR(engine->Start(mlp::TrainerSettings(cfg)));
      mlp::MlpTrainer trainer(cfg, *engine, comm);
      for (int s = 0; s < 3; ++s) ZS_RETURN_IF_ERROR(trainer.TrainStep().status());
      ZS_RETURN_IF_ERROR(engine->Save(root, R"({"sampler": {"epoch": 0, "next": 96}})"));
      ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
      std::vector<std::vector<float>> mine;
      for (size_t u = 0; u < spec.units.size(); ++u) {
        for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
          ZS_ASSIGN_OR_RETURN(auto values,
                              engine->GetParam(static_cast<int>(u), static_cast<int>(p)));
          mine.push_back(std::move(values));
        }
      }
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        params = std::move(mine);
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
    return params;
  }

  std::string dir_;
};

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

void FlipByte(const std::string& file, int64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << file;
  f.seekg(offset);
  char byte = 0;
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x01);
  f.seekp(offset);
  f.write(&byte, 1);
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TEST_F(CheckpointCliTest, InspectPrintsASoundCheckpointAndNamesEachProblem) {
  const std::string root = Sub("ckpt");
  SaveCheckpoint(root);
  const mlp::MlpConfig cfg = SmallMlp();
  const ModelSpec spec = mlp::BuildModelSpec(cfg);

  Result sound = Run("inspect " + root);
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_EQ(sound.err, "");
  EXPECT_TRUE(absl::StrContains(sound.out, "step        3\n")) << sound.out;
  EXPECT_TRUE(absl::StrContains(sound.out, "2 rank(s), ZeRO stage 2, bf16")) << sound.out;
  EXPECT_TRUE(absl::StrContains(
      sound.out, absl::StrFormat("%d params in %d units", spec.NumParams(), spec.units.size())))
      << sound.out;
  EXPECT_TRUE(absl::StrContains(sound.out, R"({"sampler":{"epoch":0,"next":96}})")) << sound.out;
  EXPECT_TRUE(absl::StrContains(sound.out, "checksums   all sound")) << sound.out;

  // Two damaged places: a byte of rank 0's data, rank 1's file cut short.
  const std::string step = root + "/step_00000003";
  auto manifest = internal::ReadManifest(step);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  FlipByte(step + "/rank_00000.bin", internal::TensorOffset(manifest->shard_numel, 2, 1) + 5);
  ASSERT_EQ(truncate((step + "/rank_00001.bin").c_str(), 4096), 0);
  Result damaged = Run("inspect " + root);
  EXPECT_EQ(damaged.exit_code, 1) << damaged.err;
  EXPECT_TRUE(absl::StrContains(damaged.out, "checksums   DAMAGED")) << damaged.out;
  const std::vector<std::string> problems = Lines(damaged.err);
  ASSERT_EQ(problems.size(), 2u) << damaged.err;
  EXPECT_TRUE(absl::StrContains(problems[0], "rank_00000.bin")) << problems[0];
  EXPECT_TRUE(absl::StrContains(problems[0], "unit 'block.2' tensor adam_m")) << problems[0];
  EXPECT_TRUE(absl::StrContains(problems[1], "rank_00001.bin: it has 4096 bytes")) << problems[1];

  // No manifest to read: one line, exit 2.
  ASSERT_EQ(unlink((step + "/manifest.json").c_str()), 0);
  Result half = Run("inspect " + step);
  EXPECT_EQ(half.exit_code, 2);
  EXPECT_EQ(Lines(half.err).size(), 1u) << half.err;
  EXPECT_TRUE(absl::StrContains(half.err, "not a complete checkpoint")) << half.err;

  Result foreign = Run("inspect " + dir_);
  EXPECT_EQ(foreign.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(foreign.err, "is not a zeroshard checkpoint")) << foreign.err;
  EXPECT_EQ(Run("inspect").exit_code, 2);
  EXPECT_EQ(Run("inspect a b").exit_code, 2);
}

TEST_F(CheckpointCliTest, ExportWritesTheWeightsOrNothing) {
  const std::string root = Sub("ckpt");
  const std::vector<std::vector<float>> params = SaveCheckpoint(root);
  const ModelSpec spec = mlp::BuildModelSpec(SmallMlp());

  for (const char* dtype : {"fp32", "bf16"}) {
    const std::string file = Sub(absl::StrFormat("model_%s.safetensors", dtype));
    Result r = Run(absl::StrFormat("export %s --out %s --dtype %s", root, file, dtype));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(absl::StrContains(
        r.out, absl::StrFormat("wrote %s: %d tensors, %s", file, params.size(), dtype)))
        << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "of weights held at once")) << r.out;
    absl::StatusOr<std::string> bytes = internal::ReadRegularFile(file, int64_t{1} << 30, "a test file");
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto index = internal::ParseSafetensorsHeader(*bytes, static_cast<int64_t>(bytes->size()));
    ASSERT_TRUE(index.ok()) << index.status();
    ASSERT_EQ(index->tensors.size(), params.size());
    size_t i = 0;
    for (const UnitSpec& unit : spec.units) {
      for (const ParamSpec& p : unit.params) {
        const std::vector<float>& want = params[i++];
        const std::string name = unit.name + "." + p.name;
        const internal::SafetensorsEntry* entry = nullptr;
        for (const auto& e : index->tensors) {
          if (e.name == name) entry = &e;
        }
        ASSERT_NE(entry, nullptr) << name;
        const char* data = bytes->data() + index->data_start + entry->begin;
        for (size_t k = 0; k < want.size(); ++k) {
          if (std::string(dtype) == "fp32") {
            float got;
            std::memcpy(&got, data + 4 * k, 4);
            ASSERT_EQ(std::memcmp(&got, &want[k], 4), 0) << name << "[" << k << "]";
          } else {
            uint16_t got;
            std::memcpy(&got, data + 2 * k, 2);
            ASSERT_EQ(got, Fp32ToBf16(want[k])) << name << "[" << k << "]";
          }
        }
      }
    }
  }

  // A damaged checkpoint: exit 2, one line naming the file, nothing written
  // (neither the file nor its temporary).
  const std::string step = root + "/step_00000003";
  auto manifest = internal::ReadManifest(step);
  ASSERT_TRUE(manifest.ok());
  FlipByte(step + "/rank_00001.bin", internal::TensorOffset(manifest->shard_numel, 2, 0) + 8);
  const std::string broken = Sub("broken.safetensors");
  Result r = Run("export " + root + " --out " + broken);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.err, "rank_00001.bin: crc mismatch in unit 'block.2' tensor master"))
      << r.err;
  EXPECT_FALSE(Exists(broken));
  EXPECT_FALSE(Exists(broken + ".tmp"));

  // Bad usage: exit 2 with one line.
  for (const std::string& args :
       {std::string("export"), "export " + root, "export " + root + " --out",
        "export " + root + " --out x --dtype fp16", "export " + root + " --out x --bogus"}) {
    Result bad = Run(args);
    EXPECT_EQ(bad.exit_code, 2) << args;
    EXPECT_EQ(Lines(bad.err).size(), 1u) << args << ": " << bad.err;
  }
}

}  // namespace
}  // namespace zeroshard::testing
