// The checkpoint directory on a cluster's bad day: ranks that save into
// different directories, a re-save interrupted between its renames, the
// leftovers of killed saves and prunes, `latest` and manifest files that are
// FIFOs, devices or huge, an unwritable directory, a rolled-back `latest`
// and a step that is a symlink out of the directory. Each test goes through
// the public API (Engine::Save/Load, InspectCheckpoint) on the example MLP
// run on local ranks, so that it runs against any version of the engine.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/checkpoint/file_ops.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

class CheckpointRecoveryTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    cfg_ = SmallMlp();
  }

  // On `world` local ranks: Load `load` (or the initial weights), train
  // `steps` steps, then Save into dir_of(rank) and wait for the checkpoint.
  // Returns each rank's status of the save (Save, then WaitForCheckpoint).
  absl::StatusOr<std::vector<absl::Status>> TrainThenSave(
      int world, const std::string& load, int steps, const std::function<std::string(int)>& dir_of,
      int keep_last = 2) {
    RunConfig run;
    run.world = world;
    run.stage = 2;
    run.precision = Precision::kBf16Mixed;
    run.steps = 8;
    return OnTrainedRanks(cfg_, run, load, steps, [&](int rank, Engine& engine) {
      CheckpointOptions options;
      options.keep_last = keep_last;
      ZS_RETURN_IF_ERROR(engine.Save(dir_of(rank), "{}", options));
      return engine.WaitForCheckpoint();
    });
  }

  // The same directory for every rank.
  absl::Status SaveInto(const std::string& root, const std::string& load, int steps,
                        int keep_last = 2, int world = 2) {
    ZS_ASSIGN_OR_RETURN(std::vector<absl::Status> saved,
                        TrainThenSave(
                            world, load, steps, [&](int) { return root; }, keep_last));
    for (const absl::Status& s : saved) ZS_RETURN_IF_ERROR(s);
    return absl::OkStatus();
  }

  // Load on 2 ranks, no training: the checkpoint's description.
  absl::StatusOr<CheckpointInfo> LoadOnly(const std::string& path) {
    RunConfig run;
    run.world = 2;
    run.stage = 2;
    run.precision = Precision::kBf16Mixed;
    const TrainSpec train = MakeTrainSpec(run);
    const ModelSpec spec = mlp::BuildModelSpec(cfg_);
    CheckpointInfo info;
    std::mutex mu;
    ZS_RETURN_IF_ERROR(RunLocalRanks(
        2,
        [&](int rank, Communicator& comm) -> absl::Status {
          auto device = CreateCpuDevice();
          ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
          ZS_ASSIGN_OR_RETURN(CheckpointInfo mine, engine->Load(path));
          std::lock_guard<std::mutex> lock(mu);
          if (rank == 0) info = mine;
          return absl::OkStatus();
        },
        CommOptions{absl::Seconds(30)}));
    return info;
  }

  mlp::MlpConfig cfg_;
};

// A sound checkpoint `path` (InspectCheckpoint finds no problem), at `step`.
void ExpectSound(const std::string& path, int64_t step) {
  std::vector<std::string> problems;
  absl::StatusOr<CheckpointInfo> info = InspectCheckpoint(path, &problems);
  ASSERT_TRUE(info.ok()) << path << ": " << info.status();
  EXPECT_TRUE(problems.empty()) << path << ": " << absl::StrJoin(problems, "; ");
  EXPECT_EQ(info->step, step) << path;
}

// Runs `call` on another thread and waits at most 20 s for it. When it has
// not returned, `unblock` is run (to release a reader stuck on a FIFO) and
// the test fails: the call blocked.
template <typename T>
T WithinSeconds(const std::function<T()>& call, const std::function<void()>& unblock,
                const std::string& what) {
  std::packaged_task<T()> task(call);
  std::future<T> result = task.get_future();
  std::thread runner(std::move(task));
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << what << " blocked for 20 s";
    unblock();
  }
  runner.join();
  return result.get();
}

// Opening a FIFO for writing releases a reader blocked in open().
void ReleaseFifoReader(const std::string& fifo) {
  const int fd = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  if (fd >= 0) close(fd);
}

TEST_F(CheckpointRecoveryTest, RanksSavingIntoDifferentDirectoriesFailOnEveryRankAndCommitNothing) {
  // A good checkpoint first, in A, that keep_last = 1 would prune.
  const std::string a = Sub("ckA");
  const std::string b = Sub("ckB");
  ASSERT_TRUE(SaveInto(a, "", 1, /*keep_last=*/1).ok());
  // Ranks 0 and 1 in A, rank 2 in B: what ranks on machines without a
  // shared file system do with the same relative path.
  auto saved = TrainThenSave(
      3, a, 1, [&](int rank) { return rank < 2 ? a : b; }, /*keep_last=*/1);
  ASSERT_TRUE(saved.ok()) << saved.status();
  for (int r = 0; r < 3; ++r) {
    const absl::Status& s = (*saved)[r];
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << "rank " << r << ": " << s;
    EXPECT_NE(s.message().find("rank 2 does not see the checkpoint directory"), std::string::npos)
        << "rank " << r << ": " << s;
    EXPECT_NE(s.message().find(a), std::string::npos) << s;
    EXPECT_NE(s.message().find(b), std::string::npos) << s;
    EXPECT_NE(s.message().find("shared file system"), std::string::npos) << s;
  }
  std::printf("refused on every rank: %s\n", std::string((*saved)[0].message()).c_str());
  // Nothing committed, nothing pruned: A's latest still names its good step.
  EXPECT_EQ(ReadText(a + "/latest"), "step_00000001\n");
  ExpectSound(a, 1);
  EXPECT_FALSE(internal::PathExists(a + "/step_00000002"));
  EXPECT_FALSE(internal::PathExists(b + "/latest"));
}

TEST_F(CheckpointRecoveryTest, RanksReachingTheSameDirectoryByOtherPathsSaveAndResume) {
  const std::string root = Sub("shared");
  ASSERT_TRUE(internal::MakeDirectories(root).ok());
  const std::string link = Sub("link_to_shared");
  ASSERT_EQ(symlink(root.c_str(), link.c_str()), 0);
  // The same directory spelled three ways: plainly, through a symlink, and
  // with "./" and a trailing slash.
  const std::string dotted = dir_ + "/./shared/";
  auto saved = TrainThenSave(3, "", 2, [&](int rank) {
    return rank == 0 ? root : rank == 1 ? link : dotted;
  });
  ASSERT_TRUE(saved.ok()) << saved.status();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE((*saved)[r].ok()) << "rank " << r << ": " << (*saved)[r];
  ExpectSound(root, 2);
  absl::StatusOr<CheckpointInfo> info = LoadOnly(link);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 2);
  EXPECT_EQ(info->world_size, 3);
}

TEST_F(CheckpointRecoveryTest, AReSaveInterruptedBetweenItsRenamesStillLoadsTheStepLatestNames) {
  const std::string root = Sub("ckpt");
  ASSERT_TRUE(SaveInto(root, "", 1).ok());
  // What a crash leaves between the two renames of a re-save of step 1 on a
  // file system that cannot exchange directories: the old step moved aside,
  // the new one still under its partial name, `latest` naming step 1.
  const std::string step = root + "/step_00000001";
  ASSERT_TRUE(internal::RenamePath(step, step + ".replaced").ok());
  ASSERT_EQ(std::system(("cp -r " + step + ".replaced " + step + ".partial").c_str()), 0);
  ASSERT_EQ(ReadText(root + "/latest"), "step_00000001\n");

  absl::StatusOr<CheckpointInfo> info = LoadOnly(root);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 1);
  EXPECT_EQ(info->path, step + ".replaced");
  ExpectSound(root, 1);
  // The next save tidies: only `latest` and the complete steps stay.
  ASSERT_TRUE(SaveInto(root, root, 1).ok());
  EXPECT_EQ(Entries(root), (std::vector<std::string>{"latest", "step_00000002"}));
  ExpectSound(root, 2);
}

TEST_F(CheckpointRecoveryTest, TheNextSaveRemovesWhatKilledSavesAndPrunesLeftBehind) {
  const std::string root = Sub("ckpt");
  ASSERT_TRUE(SaveInto(root, "", 1).ok());
  ASSERT_TRUE(SaveInto(root, root, 1).ok());
  // A prune killed after it removed step 1's manifest (rank files left);
  // a `.replaced` and a `.deleting` step; a `.partial` of a later step; a
  // `latest.tmp`.
  ASSERT_EQ(unlink((root + "/step_00000001/manifest.json").c_str()), 0);
  for (const char* leftover :
       {"/step_00000002.replaced", "/step_00000000.deleting", "/step_00000007.partial"}) {
    ASSERT_EQ(std::system(("cp -r " + root + "/step_00000002 " + root + leftover).c_str()), 0);
  }
  std::ofstream(root + "/latest.tmp") << "step_00000001\n";
  ExpectSound(root, 2);
  ASSERT_TRUE(SaveInto(root, root, 1).ok());
  EXPECT_EQ(Entries(root), (std::vector<std::string>{"latest", "step_00000002", "step_00000003"}));
  ExpectSound(root, 3);
  ExpectSound(root + "/step_00000002", 2);
}

TEST_F(CheckpointRecoveryTest, ALatestOrManifestThatIsAFifoADeviceOrHugeIsRefusedAtOnce) {
  const std::string good = Sub("good");
  ASSERT_TRUE(SaveInto(good, "", 1).ok());
  struct Case {
    const char* name;
    std::function<std::string(const std::string& root)> make;  // returns a FIFO to release
    const char* message;
  };
  const Case cases[] = {
      {"`latest` is a FIFO",
       [](const std::string& root) {
         const std::string fifo = root + "/latest";
         unlink(fifo.c_str());
         EXPECT_EQ(mkfifo(fifo.c_str(), 0644), 0);
         return fifo;
       },
       "FIFO"},
      {"manifest.json is a FIFO",
       [](const std::string& root) {
         const std::string fifo = root + "/step_00000001/manifest.json";
         unlink(fifo.c_str());
         EXPECT_EQ(mkfifo(fifo.c_str(), 0644), 0);
         return fifo;
       },
       "FIFO"},
      {"`latest` is a symlink to /dev/zero",
       [](const std::string& root) {
         const std::string latest = root + "/latest";
         unlink(latest.c_str());
         EXPECT_EQ(symlink("/dev/zero", latest.c_str()), 0);
         return std::string();
       },
       "/dev/zero"},
      {"manifest.json is a symlink to /dev/zero",
       [](const std::string& root) {
         const std::string manifest = root + "/step_00000001/manifest.json";
         unlink(manifest.c_str());
         EXPECT_EQ(symlink("/dev/zero", manifest.c_str()), 0);
         return std::string();
       },
       "manifest.json"},
      {"`latest` is 1 GB",
       [](const std::string& root) {
         EXPECT_EQ(truncate((root + "/latest").c_str(), int64_t{1} << 30), 0);
         return std::string();
       },
       "at most 256 bytes"},
      {"manifest.json is 1 GB",
       [](const std::string& root) {
         EXPECT_EQ(truncate((root + "/step_00000001/manifest.json").c_str(), int64_t{1} << 30), 0);
         return std::string();
       },
       "is at most"},
  };
  for (const Case& c : cases) {
    const std::string root = Sub(absl::StrFormat("case_%d", &c - cases));
    ASSERT_EQ(std::system(("cp -r " + good + " " + root).c_str()), 0);
    const std::string fifo = c.make(root);
    auto release = [&] {
      if (!fifo.empty()) ReleaseFifoReader(fifo);
    };
    const auto begin = std::chrono::steady_clock::now();
    const absl::StatusOr<CheckpointInfo> loaded = WithinSeconds<absl::StatusOr<CheckpointInfo>>(
        [&] { return LoadOnly(root); }, release, std::string("Load: ") + c.name);
    EXPECT_FALSE(loaded.ok()) << c.name << " was loaded";
    EXPECT_NE(loaded.status().message().find(c.message), std::string::npos)
        << c.name << ": " << loaded.status();
    EXPECT_LT(loaded.status().message().size(), 1000u) << c.name;
    std::vector<std::string> problems;
    const absl::StatusOr<CheckpointInfo> inspected = WithinSeconds<absl::StatusOr<CheckpointInfo>>(
        [&] { return InspectCheckpoint(root, &problems); }, release,
        std::string("InspectCheckpoint: ") + c.name);
    EXPECT_FALSE(inspected.ok()) << c.name << " was inspected";
    EXPECT_NE(inspected.status().message().find(c.message), std::string::npos)
        << c.name << ": " << inspected.status();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    EXPECT_LT(seconds, 10.0) << c.name << " took " << seconds << " s to refuse";
    std::printf("refused in %.3f s, %s: %s\n", seconds, c.name,
                std::string(loaded.status().message()).c_str());
  }
}

TEST_F(CheckpointRecoveryTest, ALatestHoldingGarbageIsQuotedShortlyAndEscaped) {
  const std::string root = Sub("ckpt");
  ASSERT_TRUE(SaveInto(root, "", 1).ok());
  // 200 bytes of text with control characters: what a `latest` overwritten
  // by another file holds.
  std::string garbage = "root:x:0:0:root:/root:/bin/bash\n\x01\x02";
  while (garbage.size() < 200) garbage += "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n";
  std::ofstream(root + "/latest", std::ios::trunc | std::ios::binary) << garbage;
  const absl::StatusOr<CheckpointInfo> loaded = LoadOnly(root);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  const std::string message(loaded.status().message());
  EXPECT_LT(message.size(), 500u) << message;
  EXPECT_EQ(message.find('\x01'), std::string::npos) << "a control byte reached the message";
  EXPECT_NE(message.find("'root:x:0:0:root:/root:/bin/bash\\n"), std::string::npos) << message;
  std::printf("refused: %s\n", message.c_str());
}

TEST_F(CheckpointRecoveryTest, AnUnwritableDirectoryFailsTheFirstSaveOnEveryRankWithItsCause) {
  // sysfs refuses new directories to everyone, root included.
  const std::string root = absl::StrFormat("/sys/zeroshard_test_%d/ckpt", getpid());
  auto saved = TrainThenSave(2, "", 1, [&](int) { return root; });
  ASSERT_TRUE(saved.ok()) << saved.status();
  for (int r = 0; r < 2; ++r) {
    const absl::Status& s = (*saved)[r];
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << "rank " << r << ": " << s;
    EXPECT_NE(s.message().find("/sys/zeroshard_test_"), std::string::npos) << s;
    EXPECT_EQ(s.message().find("previous one"), std::string::npos)
        << "there is no previous checkpoint to speak of: " << s;
  }
  std::printf("refused on every rank: %s\n", std::string((*saved)[0].message()).c_str());
}

TEST_F(CheckpointRecoveryTest, ALatestRolledBackToAnOlderStepLoadsItAndPruningSparesIt) {
  const std::string root = Sub("ckpt");
  ASSERT_TRUE(SaveInto(root, "", 1, 3).ok());
  ASSERT_TRUE(SaveInto(root, root, 1, 3).ok());
  ASSERT_TRUE(SaveInto(root, root, 1, 3).ok());
  // The documented rollback: write an older step's name into `latest`.
  std::ofstream(root + "/latest", std::ios::trunc) << "step_00000001\n";
  absl::StatusOr<CheckpointInfo> info = LoadOnly(root);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 1);
  ExpectSound(root, 1);
  // Training on from step 1 re-saves step 2 (keeping 2): the step rolled
  // back to stays, and so does step 3 of the abandoned run (newer than the
  // one saved), until the run reaches and replaces it.
  ASSERT_TRUE(SaveInto(root, root, 1, 2).ok());
  EXPECT_EQ(Entries(root), (std::vector<std::string>{"latest", "step_00000001", "step_00000002",
                                                     "step_00000003"}));
  ExpectSound(root, 2);
  ExpectSound(root + "/step_00000001", 1);
}

TEST_F(CheckpointRecoveryTest, AStepThatIsASymlinkOutOfTheDirectoryIsRefused) {
  const std::string elsewhere = Sub("elsewhere");
  ASSERT_TRUE(SaveInto(elsewhere, "", 1).ok());
  const std::string root = Sub("ckpt");
  ASSERT_TRUE(internal::MakeDirectories(root).ok());
  ASSERT_EQ(symlink((elsewhere + "/step_00000001").c_str(), (root + "/step_00000001").c_str()), 0);
  std::ofstream(root + "/latest") << "step_00000001\n";
  const absl::StatusOr<CheckpointInfo> loaded = LoadOnly(root);
  ASSERT_FALSE(loaded.ok()) << "a step outside the checkpoint directory was loaded";
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition) << loaded.status();
  EXPECT_NE(loaded.status().message().find("outside the checkpoint directory"), std::string::npos)
      << loaded.status();
  std::vector<std::string> problems;
  EXPECT_FALSE(InspectCheckpoint(root, &problems).ok());
  // The step itself, named directly, is a checkpoint like any other.
  absl::StatusOr<CheckpointInfo> direct = LoadOnly(elsewhere + "/step_00000001");
  ASSERT_TRUE(direct.ok()) << direct.status();
  std::printf("refused: %s\n", std::string(loaded.status().message()).c_str());
}

}  // namespace
}  // namespace zeroshard::testing
