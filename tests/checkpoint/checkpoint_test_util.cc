#include "tests/checkpoint/checkpoint_test_util.h"

#include <stdlib.h>

#include <fstream>
#include <mutex>
#include <sstream>

#include "engine/src/checkpoint/file_ops.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {

void ScratchDirTest::SetUp() {
  char name[] = "/tmp/zs_checkpoint_XXXXXX";
  ASSERT_NE(mkdtemp(name), nullptr);
  dir_ = name;
}

void ScratchDirTest::TearDown() { internal::RemoveTree(dir_).IgnoreError(); }

std::string ScratchDirTest::Sub(const std::string& name) const {
  return internal::JoinPath(dir_, name);
}

absl::StatusOr<std::string> ReadTestFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string ReadText(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTestFile(path);
  return text.ok() ? *text : std::string();
}

std::vector<std::string> Entries(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = internal::ListDirectory(dir);
  return names.ok() ? *names : std::vector<std::string>{};
}

absl::StatusOr<std::vector<absl::Status>> OnTrainedRanks(
    const mlp::MlpConfig& cfg, const RunConfig& run, const std::string& load, int steps,
    const std::function<absl::Status(int rank, Engine& engine)>& body) {
  const TrainSpec train = MakeTrainSpec(run);
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  std::vector<absl::Status> results(run.world,
                                    absl::InternalError("the rank did not reach the call"));
  std::mutex mu;
  ZS_RETURN_IF_ERROR(RunLocalRanks(
      run.world,
      [&](int rank, Communicator& comm) -> absl::Status {
        auto device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
        if (load.empty()) {
          ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, cfg));
        } else {
          ZS_RETURN_IF_ERROR(engine->Load(load).status());
        }
        ZS_RETURN_IF_ERROR(engine->Start(mlp::TrainerSettings(cfg)));
        mlp::MlpTrainer trainer(cfg, *engine, comm);
        for (int s = 0; s < steps; ++s) ZS_RETURN_IF_ERROR(trainer.TrainStep().status());
        const absl::Status status = body(rank, *engine);
        std::lock_guard<std::mutex> lock(mu);
        results[rank] = status;
        return absl::OkStatus();
      },
      CommOptions{absl::Seconds(30)}));
  return results;
}

}  // namespace zeroshard::testing
