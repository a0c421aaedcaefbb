// Runs the built `zeroshard inspect` and `zeroshard export` on a checkpoint
// written by a 2-rank engine: what they print, their exit codes on sound,
// damaged and foreign input, and that a failed export leaves no file.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/command_runner.h"
#include "tests/runtime/engine_test_util.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

using Result = CommandResult;

class CheckpointCliTest : public ScratchDirTest {
 protected:
  Result Run(const std::string& args) const {
    // A command that blocks (on a FIFO, say) ends after 60 s with exit 124.
    return RunCommand("timeout 60 " + std::string(ZS_BINARY) + " " + args);
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
    absl::StatusOr<std::string> bytes = ReadTestFile(file);
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

// Every file a checkpoint holds, with its bytes: to tell that nothing changed.
std::vector<std::pair<std::string, std::string>> Snapshot(const std::string& root) {
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> stack = {root};
  while (!stack.empty()) {
    const std::string dir = stack.back();
    stack.pop_back();
    auto names = internal::ListDirectory(dir);
    if (!names.ok()) continue;
    for (const std::string& name : *names) {
      const std::string path = dir + "/" + name;
      struct stat st;
      if (lstat(path.c_str(), &st) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        stack.push_back(path);
      } else {
        files.push_back({path, *ReadTestFile(path)});
      }
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST_F(CheckpointCliTest, ExportRefusesEveryOutputThatWouldChangeTheCheckpoint) {
  const std::string root = Sub("ckpt");
  SaveCheckpoint(root);
  const std::string step = root + "/step_00000003";
  ASSERT_EQ(symlink((step + "/rank_00001.bin").c_str(), Sub("link_to_rank_file").c_str()), 0);
  ASSERT_EQ(link((step + "/rank_00000.bin").c_str(), Sub("hard_link_to_rank_file").c_str()), 0);
  const auto before = Snapshot(root);
  // The checkpoint's own files by every spelling: plain, through `..` and
  // `.`, a symlink, a hard link; and files inside the checkpoint directory.
  for (const std::string& out :
       {step + "/manifest.json", step + "/rank_00001.bin", root + "/latest",
        root + "/../ckpt/./latest", root + "/step_00000003/../step_00000003/rank_00000.bin",
        Sub("link_to_rank_file"), Sub("hard_link_to_rank_file"), root + "/model.safetensors",
        step + "/model.safetensors"}) {
    for (const std::string& source : {root, step}) {
      Result r = Run("export " + source + " --out " + out);
      EXPECT_EQ(r.exit_code, 2) << source << " --out " << out << ": " << r.out << r.err;
      EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
      EXPECT_TRUE(absl::StrContains(r.err, "checkpoint")) << r.err;
    }
  }
  EXPECT_TRUE(Snapshot(root) == before) << "a refused export changed the checkpoint";
  std::vector<std::string> problems;
  ASSERT_TRUE(InspectCheckpoint(root, &problems).ok());
  EXPECT_TRUE(problems.empty());
  Result named = Run("export " + root + " --out " + step + "/manifest.json");
  std::printf("refused: %s", named.err.c_str());
}

TEST_F(CheckpointCliTest, AFailedExportLeavesNoTemporaryBehind) {
  const std::string root = Sub("ckpt");
  SaveCheckpoint(root);
  // An existing directory as the output: refused, nothing written beside it.
  const std::string existing = Sub("existing_dir");
  ASSERT_EQ(mkdir(existing.c_str(), 0755), 0);
  Result r = Run("export " + root + " --out " + existing);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "is a directory")) << r.err;
  EXPECT_FALSE(Exists(existing + ".tmp")) << "the export left its temporary";
  // The atomic writer itself: a rename that fails (the path is a non-empty
  // directory) removes the temporary it wrote.
  const std::string busy = Sub("busy_dir");
  ASSERT_EQ(mkdir(busy.c_str(), 0755), 0);
  std::ofstream(busy + "/keep") << "x";
  absl::Status written = internal::WriteFileAtomically(busy, std::string(1 << 20, 'z'));
  EXPECT_FALSE(written.ok());
  EXPECT_FALSE(Exists(busy + ".tmp")) << "WriteFileAtomically left its temporary";
  const std::vector<float> data(static_cast<size_t>(3 * 256), 1.5f);
  auto rank_file = internal::WriteRankFile(busy, 0, 1, {256}, data);
  EXPECT_FALSE(rank_file.ok());
  EXPECT_FALSE(Exists(busy + ".tmp")) << "WriteRankFile left its temporary";
}

TEST_F(CheckpointCliTest, RepeatedFlagsAreRefusedAndUntrustedTextIsQuotedShortly) {
  const std::string root = Sub("ckpt");
  SaveCheckpoint(root);
  Result twice = Run("export " + root + " --out " + Sub("a") + " --out " + Sub("b"));
  EXPECT_EQ(twice.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(twice.err, "--out is given twice")) << twice.err;
  EXPECT_FALSE(Exists(Sub("a")) || Exists(Sub("b")));
  Result dtype_twice = Run("export " + root + " --out " + Sub("a") + " --dtype fp32 --dtype bf16");
  EXPECT_EQ(dtype_twice.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(dtype_twice.err, "--dtype is given twice")) << dtype_twice.err;

  // `latest` replaced by 50 MB of text: one short line, exit 2.
  std::ofstream(root + "/latest", std::ios::trunc) << std::string(50 << 20, 'x');
  Result huge = Run("inspect " + root);
  EXPECT_EQ(huge.exit_code, 2);
  EXPECT_LT(huge.err.size(), 600u) << huge.err.substr(0, 600);
  EXPECT_TRUE(absl::StrContains(huge.err, "at most 256 bytes")) << huge.err.substr(0, 600);
  // A FIFO: refused, not waited on (the test would hang).
  ASSERT_EQ(unlink((root + "/latest").c_str()), 0);
  ASSERT_EQ(mkfifo((root + "/latest").c_str(), 0644), 0);
  Result fifo = Run("inspect " + root);
  EXPECT_EQ(fifo.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(fifo.err, "FIFO")) << fifo.err;
  Result fifo_export = Run("export " + root + " --out " + Sub("out.safetensors"));
  EXPECT_EQ(fifo_export.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(fifo_export.err, "FIFO")) << fifo_export.err;
}

}  // namespace
}  // namespace zeroshard::testing
