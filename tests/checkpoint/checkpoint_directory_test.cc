// The directory agreement and the commit's checks: PrepareCheckpointDirectory
// (same directory on every rank, writable, nothing left behind), Save's
// verdict shared by every rank when one rank's arguments are wrong, the
// commit's refusal of a step whose rank files are not all there as their
// ranks wrote them, the note Load gives for an interrupted re-save, and the
// atomic writer's temporary.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/directory.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/runtime/engine_test_util.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

class CheckpointDirectoryTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    cfg_ = SmallMlp();
  }

  // body(rank, engine) on `world` local ranks, each with an engine started
  // and trained one step (stage 1); each rank's status of `body`.
  std::vector<absl::Status> OnRanks(int world,
                                    const std::function<absl::Status(int rank, Engine&)>& body) {
    RunConfig run;
    run.world = world;
    run.stage = 1;
    absl::StatusOr<std::vector<absl::Status>> results = OnTrainedRanks(cfg_, run, "", 1, body);
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? *results : std::vector<absl::Status>(world, results.status());
  }

  mlp::MlpConfig cfg_;
};

TEST_F(CheckpointDirectoryTest, PrepareCheckpointDirectoryFindsRanksThatSeeAnotherDirectory) {
  const std::string a = Sub("a");
  const std::string b = Sub("b");
  auto split = OnRanks(3, [&](int rank, Engine& engine) {
    return engine.PrepareCheckpointDirectory(rank == 1 ? b : a);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(split[r].code(), absl::StatusCode::kFailedPrecondition) << split[r];
    EXPECT_EQ(split[r].message(), split[0].message()) << "rank " << r << " reports otherwise";
    EXPECT_NE(split[r].message().find("rank 1 does not see the checkpoint directory rank 0 "
                                      "prepared at " +
                                      a),
              std::string::npos)
        << split[r];
  }
  // The same directory through a symlink: fine, and nothing is left in it.
  const std::string link = Sub("link");
  ASSERT_EQ(symlink(a.c_str(), link.c_str()), 0);
  auto same = OnRanks(3, [&](int rank, Engine& engine) {
    return engine.PrepareCheckpointDirectory(rank == 2 ? link : a);
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(same[r].ok()) << same[r];
  EXPECT_TRUE(Entries(a).empty()) << "left behind: " << Entries(a)[0];
  // A directory no rank can create: the cause's code on every rank.
  const std::string sys = absl::StrFormat("/sys/zeroshard_test_%d", getpid());
  auto denied =
      OnRanks(2, [&](int, Engine& engine) { return engine.PrepareCheckpointDirectory(sys); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(denied[r].code(), absl::StatusCode::kPermissionDenied) << denied[r];
  }
}

TEST_F(CheckpointDirectoryTest, OneRanksBadArgumentFailsTheSaveOnEveryRankWithoutAHang) {
  const std::string root = Sub("ckpt");
  // Rank 1 passes a trainer state that is not JSON; rank 0 a good one.
  auto saved = OnRanks(2, [&](int rank, Engine& engine) {
    absl::Status s = engine.Save(root, rank == 1 ? "not json" : "{}");
    if (s.ok()) s = engine.WaitForCheckpoint();
    return s;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(saved[r].code(), absl::StatusCode::kInvalidArgument) << "rank " << r << saved[r];
    EXPECT_NE(saved[r].message().find("Save: rank 1: the trainer state is not a JSON object"),
              std::string::npos)
        << saved[r];
  }
  // A trainer state past 1 MiB.
  const std::string big = "{\"blob\": \"" + std::string(int64_t{1} << 20, 'x') + "\"}";
  auto too_big = OnRanks(2, [&](int, Engine& engine) { return engine.Save(root, big); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(too_big[r].code(), absl::StatusCode::kInvalidArgument) << too_big[r];
    EXPECT_NE(too_big[r].message().find("more than the 1048576 a checkpoint holds"),
              std::string::npos)
        << too_big[r];
  }
  // A trainer state nested past 32 levels (writing and checksumming JSON
  // recurse once per level).
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += "{\"a\": ";
  deep += "1" + std::string(40, '}');
  auto too_deep = OnRanks(2, [&](int, Engine& engine) { return engine.Save(root, deep); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(too_deep[r].code(), absl::StatusCode::kInvalidArgument) << too_deep[r];
    EXPECT_NE(too_deep[r].message().find("nested 40 levels deep, more than 32"), std::string::npos)
        << too_deep[r];
  }
  EXPECT_FALSE(internal::PathExists(root + "/latest"));
}

TEST_F(CheckpointDirectoryTest, TheCommitRefusesAStepWhoseRankFilesAreNotAllThere) {
  const std::string root = Sub("ckpt");
  auto saved = OnRanks(3, [&](int, Engine& engine) {
    ZS_RETURN_IF_ERROR(engine.Save(root, "{}"));
    return engine.WaitForCheckpoint();
  });
  for (const absl::Status& s : saved) ASSERT_TRUE(s.ok()) << s;
  const std::string step1 = root + "/step_00000001";
  absl::StatusOr<internal::Manifest> manifest = internal::ReadManifest(step1);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  internal::Manifest next = *manifest;
  next.step = 2;
  next.applied_steps = 2;
  struct Case {
    const char* name;
    std::function<void(const std::string& partial)> damage;
    const char* message;
  };
  const Case cases[] = {
      {"rank 1's file missing",
       [](const std::string& p) { ASSERT_EQ(unlink((p + "/rank_00001.bin").c_str()), 0); },
       "the file of rank 1 is not in"},
      {"rank 0's file in the place of rank 2's",
       [](const std::string& p) {
         ASSERT_EQ(std::system(("cp " + p + "/rank_00000.bin " + p + "/rank_00002.bin").c_str()),
                   0);
       },
       "its header's rank (bytes [12, 16)) holds 0, expected 2"},
      {"ranks 0 and 2 missing",
       [](const std::string& p) {
         ASSERT_EQ(unlink((p + "/rank_00000.bin").c_str()), 0);
         ASSERT_EQ(unlink((p + "/rank_00002.bin").c_str()), 0);
       },
       "the files of ranks 0, 2 are not in"},
  };
  for (const Case& c : cases) {
    const std::string partial = root + "/step_00000002.partial";
    internal::RemoveTree(partial).IgnoreError();
    ASSERT_EQ(std::system(("cp -r " + step1 + " " + partial).c_str()), 0);
    ASSERT_EQ(unlink((partial + "/manifest.json").c_str()), 0);
    c.damage(partial);
    const absl::Status committed = internal::CommitCheckpointDirectory(
        root, partial, root + "/step_00000002", next, /*keep_last=*/1);
    EXPECT_EQ(committed.code(), absl::StatusCode::kFailedPrecondition) << c.name << committed;
    EXPECT_NE(committed.message().find(c.message), std::string::npos) << c.name << committed;
    EXPECT_NE(committed.message().find("same directory"), std::string::npos) << committed;
    // Nothing committed, nothing pruned.
    EXPECT_EQ(ReadText(root + "/latest"), "step_00000001\n") << c.name;
    EXPECT_FALSE(internal::PathExists(root + "/step_00000002")) << c.name;
    std::vector<std::string> problems;
    ASSERT_TRUE(InspectCheckpoint(root, &problems).ok()) << c.name;
    EXPECT_TRUE(problems.empty()) << c.name;
    std::printf("refused, %s: %s\n", c.name, std::string(committed.message()).c_str());
  }
}

TEST_F(CheckpointDirectoryTest, LoadSaysWhenItReadsTheStepAnInterruptedReSaveMovedAside) {
  const std::string root = Sub("ckpt");
  auto saved = OnRanks(2, [&](int, Engine& engine) {
    ZS_RETURN_IF_ERROR(engine.Save(root, "{}"));
    return engine.WaitForCheckpoint();
  });
  for (const absl::Status& s : saved) ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(internal::RenamePath(root + "/step_00000001", root + "/step_00000001.replaced").ok());
  std::string note;
  absl::StatusOr<std::string> resolved = internal::ResolveCheckpointWithNote(root, &note);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, root + "/step_00000001.replaced");
  EXPECT_NE(note.find("a re-save of the same step left as"), std::string::npos) << note;
  std::vector<std::string> problems;
  absl::StatusOr<CheckpointInfo> info = InspectCheckpoint(root, &problems);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->note, note);
  // Without the moved-aside step there is nothing to read.
  ASSERT_TRUE(internal::RemoveTree(root + "/step_00000001.replaced").ok());
  EXPECT_EQ(internal::ResolveCheckpointWithNote(root, &note).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointDirectoryTest, TheAtomicWriterNeverWritesIntoAFileLinkedToItsTemporary) {
  // A stale temporary that is a hard link to a file of value: the writer
  // drops the name and writes a new file.
  const std::string precious = Sub("precious");
  std::ofstream(precious) << "keep me";
  const std::string target = Sub("target");
  ASSERT_EQ(link(precious.c_str(), (target + ".tmp").c_str()), 0);
  ASSERT_TRUE(internal::WriteFileAtomically(target, "new contents").ok());
  EXPECT_EQ(ReadText(precious), "keep me");
  EXPECT_EQ(ReadText(target), "new contents");
  EXPECT_FALSE(internal::PathExists(target + ".tmp"));
  // Not committed: the temporary goes with the writer.
  {
    absl::StatusOr<internal::AtomicFile> file = internal::AtomicFile::Create(Sub("abandoned"));
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE(file->Write("partial", 7).ok());
    EXPECT_TRUE(internal::PathExists(Sub("abandoned.tmp")));
  }
  EXPECT_FALSE(internal::PathExists(Sub("abandoned.tmp")));
  EXPECT_FALSE(internal::PathExists(Sub("abandoned")));
}

TEST(ParseLatestTest, AcceptsOneStepNameAndQuotesTheRestShortly) {
  EXPECT_EQ(*internal::ParseLatest("step_00000100\n", "l"), "step_00000100");
  EXPECT_EQ(*internal::ParseLatest(" step_7 \n", "l"), "step_7");
  EXPECT_EQ(internal::ParseStepDirName("step_00000100"), 100);
  for (const char* bad :
       {"", "\n", "step_", "step_-1", "step_+1", "step_1.partial", "step_00000001\nstep_00000002",
        "step_99999999999999999", "Step_00000001", "step_0x10", "../step_00000001"}) {
    absl::StatusOr<std::string> parsed = internal::ParseLatest(bad, "ckpt/latest");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << bad;
  }
  const absl::Status long_garbage = internal::ParseLatest(std::string(250, '\x07'), "l").status();
  EXPECT_LT(long_garbage.message().size(), 512u) << long_garbage;
}

}  // namespace
}  // namespace zeroshard::testing
