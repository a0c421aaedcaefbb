// Kill anywhere: for every file operation of a save (first save, a save that
// prunes, a re-save of the step `latest` names, with and without an atomic
// exchange) and of an export, a child process is SIGKILLed right before
// that operation. Then the directory must hold a `latest` that
// InspectCheckpoint passes (or none, before the first save), and after the
// next save (or export) nothing but `latest` and complete steps (or the
// complete export) may be left.
//
// Engines run only in forked children (world 1, so the operations come in
// one order every run); the parent inspects. A SIGKILL keeps what reached
// the page cache, so this is the crash of a process, not of the machine.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/safetensors.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/runtime/engine_test_util.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

// The child's kill switch: the hook counts operations and kills the process
// at number kill_at, after writing which one it was to report_fd.
std::atomic<int64_t> op_count{0};
int64_t kill_at = 0;
int report_fd = -1;

void KillHook(internal::FileOp op, const std::string& path) {
  const int64_t n = ++op_count;
  if (n != kill_at) return;
  const std::string line = absl::StrFormat("%s %s\n", internal::FileOpName(op), path);
  if (report_fd >= 0 && write(report_fd, line.data(), line.size()) < 0) _exit(90);
  raise(SIGKILL);
}

void CountHook(internal::FileOp op, const std::string& path) {
  ++op_count;
  const std::string line = absl::StrFormat("%s %s\n", internal::FileOpName(op), path);
  if (report_fd >= 0 && write(report_fd, line.data(), line.size()) < 0) _exit(90);
}

struct ChildResult {
  bool killed = false;  // by the SIGKILL of the hook
  int exit_code = -1;
  std::string report;  // what the hook wrote
};

// Runs `body` in a forked child with the hook set (kill_at 0: count only)
// and `exchange` as the file system's ability to exchange directories.
ChildResult RunChild(const std::function<absl::Status()>& body, int64_t kill_at_op,
                     bool exchange = true) {
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    report_fd = pipe_fds[1];
    kill_at = kill_at_op;
    op_count = 0;
    internal::SetExchangeSupportedForTesting(exchange);
    internal::SetFileOpHookForTesting(kill_at_op > 0 ? KillHook : CountHook);
    const absl::Status status = body();
    if (!status.ok()) {
      const std::string line = absl::StrFormat("error %s\n", status.ToString());
      if (write(report_fd, line.data(), line.size()) < 0) _exit(91);
    }
    _exit(status.ok() ? 0 : 3);
  }
  close(pipe_fds[1]);
  ChildResult result;
  char buffer[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) result.report.append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Runs `body` in a child without a kill; fails the test when it fails.
void RunClean(const std::function<absl::Status()>& body, const std::string& what) {
  const ChildResult r = RunChild(body, /*kill_at_op=*/-1);
  ASSERT_EQ(r.exit_code, 0) << what << ": " << r.report;
}

constexpr int kKeepLast = 2;

// On one local rank: load `root`'s latest (or the initial weights when
// there is none), train `steps` steps, save into `root`, wait.
absl::Status TrainAndSave(const mlp::MlpConfig& cfg, const std::string& root, int steps) {
  RunConfig run;
  run.world = 1;
  run.stage = 1;
  run.steps = 8;
  const std::string load = internal::PathExists(root + "/latest") ? root : "";
  ZS_ASSIGN_OR_RETURN(std::vector<absl::Status> saved,
                      OnTrainedRanks(cfg, run, load, steps, [&](int, Engine& engine) {
                        CheckpointOptions options;
                        options.keep_last = kKeepLast;
                        ZS_RETURN_IF_ERROR(engine.Save(root, "{}", options));
                        return engine.WaitForCheckpoint();
                      }));
  return saved[0];
}

// What a directory may hold after a save: `latest` naming its newest
// complete step, at most kKeepLast complete steps, each with its manifest
// and rank files only, and nothing else.
void ExpectTidy(const std::string& root, const std::string& what) {
  std::vector<std::string> steps;
  for (const std::string& name : Entries(root)) {
    if (name == "latest") continue;
    EXPECT_GE(internal::ParseStepDirName(name), 0) << what << ": leftover " << name;
    if (internal::ParseStepDirName(name) < 0) continue;
    steps.push_back(name);
    for (const std::string& file : Entries(root + "/" + name)) {
      EXPECT_TRUE(file == "manifest.json" ||
                  (absl::StartsWith(file, "rank_") && absl::EndsWith(file, ".bin")))
          << what << ": leftover " << name << "/" << file;
    }
  }
  EXPECT_LE(steps.size(), static_cast<size_t>(kKeepLast))
      << what << ": " << absl::StrJoin(steps, " ");
  ASSERT_FALSE(steps.empty()) << what;
  EXPECT_EQ(ReadText(root + "/latest"), steps.back() + "\n") << what;
  std::vector<std::string> problems;
  absl::StatusOr<CheckpointInfo> info = InspectCheckpoint(root, &problems);
  ASSERT_TRUE(info.ok()) << what << ": " << info.status();
  EXPECT_TRUE(problems.empty()) << what << ": " << absl::StrJoin(problems, "; ");
}

class CheckpointKillTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    cfg_ = SmallMlp();
    cfg_.blocks = 2;
  }

  // The template state: `saves` saves of one step each into `template_dir`.
  void MakeTemplate(const std::string& template_dir, int saves) {
    ASSERT_TRUE(internal::MakeDirectories(template_dir).ok());
    for (int s = 0; s < saves; ++s) {
      RunClean([&] { return TrainAndSave(cfg_, template_dir, 1); }, "template save");
    }
  }

  // Kills `act` at each of its file operations in turn, on a fresh copy of
  // `template_dir` each time; `after_kill` checks the state left, `next`
  // runs the next (unkilled) operation, `after_next` checks what it left.
  void KillAtEveryOperation(
      const std::string& name, const std::string& template_dir,
      const std::function<absl::Status(const std::string& root)>& act,
      const std::function<void(const std::string& root, const std::string& what)>& after_kill,
      const std::function<absl::Status(const std::string& root)>& next,
      const std::function<void(const std::string& root, const std::string& what)>& after_next,
      bool exchange = true) {
    std::string slug = name;  // for paths: no spaces or parentheses
    for (char& c : slug) {
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    }
    // How many operations the act makes, and which.
    const std::string counted = Sub(slug + "_count");
    ASSERT_EQ(std::system(("cp -a " + template_dir + " " + counted).c_str()), 0);
    const ChildResult count = RunChild([&] { return act(counted); }, 0, exchange);
    ASSERT_EQ(count.exit_code, 0) << name << ": " << count.report;
    std::map<std::string, int> kinds;
    int64_t ops = 0;
    for (const absl::string_view line : absl::StrSplit(count.report, '\n', absl::SkipEmpty())) {
      ++kinds[std::string(line.substr(0, line.find(' ')))];
      ++ops;
    }
    ASSERT_GT(ops, 0);
    for (int64_t k = 1; k <= ops; ++k) {
      const std::string root = Sub(absl::StrFormat("%s_%d", slug, k));
      ASSERT_EQ(std::system(("cp -a " + template_dir + " " + root).c_str()), 0);
      const ChildResult killed = RunChild([&] { return act(root); }, k, exchange);
      const std::string what =
          absl::StrFormat("%s, killed before operation %d of %d (%s)", name, k, ops, killed.report);
      ASSERT_TRUE(killed.killed) << what << ": exit " << killed.exit_code;
      after_kill(root, what);
      RunClean([&] { return next(root); }, what + ", then the next one");
      after_next(root, what + ", then the next one");
      if (::testing::Test::HasFailure()) return;
      internal::RemoveTree(root).IgnoreError();
    }
    std::vector<std::string> parts;
    for (const auto& [kind, n] : kinds) parts.push_back(absl::StrFormat("%s x%d", kind, n));
    std::printf("%s: killed before each of its %lld file operations (%s): every state sound\n",
                name.c_str(), static_cast<long long>(ops), absl::StrJoin(parts, ", ").c_str());
  }

  mlp::MlpConfig cfg_;
};

// After a kill during a save: `latest` absent (no save had completed) or
// naming a step that inspect passes.
void ExpectLatestSoundOrAbsent(const std::string& root, const std::string& what,
                               bool may_be_absent) {
  if (!internal::PathExists(root + "/latest")) {
    EXPECT_TRUE(may_be_absent) << what << ": `latest` is gone";
    return;
  }
  std::vector<std::string> problems;
  absl::StatusOr<CheckpointInfo> info = InspectCheckpoint(root, &problems);
  ASSERT_TRUE(info.ok()) << what << ": " << info.status();
  EXPECT_TRUE(problems.empty()) << what << ": " << absl::StrJoin(problems, "; ");
}

TEST_F(CheckpointKillTest, TheFirstSave) {
  const std::string empty = Sub("template_empty");
  ASSERT_TRUE(internal::MakeDirectories(empty).ok());
  KillAtEveryOperation(
      "first save", empty, [&](const std::string& root) { return TrainAndSave(cfg_, root, 1); },
      [](const std::string& root, const std::string& what) {
        ExpectLatestSoundOrAbsent(root, what, /*may_be_absent=*/true);
      },
      [&](const std::string& root) { return TrainAndSave(cfg_, root, 1); }, ExpectTidy);
}

TEST_F(CheckpointKillTest, ASaveThatPrunesTheOldestStep) {
  const std::string two = Sub("template_two");
  MakeTemplate(two, 2);
  KillAtEveryOperation(
      "save and prune", two, [&](const std::string& root) { return TrainAndSave(cfg_, root, 1); },
      [](const std::string& root, const std::string& what) {
        ExpectLatestSoundOrAbsent(root, what, /*may_be_absent=*/false);
      },
      [&](const std::string& root) { return TrainAndSave(cfg_, root, 1); }, ExpectTidy);
}

TEST_F(CheckpointKillTest, AReSaveOfTheStepLatestNames) {
  const std::string two = Sub("template_two");
  MakeTemplate(two, 2);
  for (const bool exchange : {true, false}) {
    KillAtEveryOperation(
        exchange ? "re-save (exchange)" : "re-save (two renames)", two,
        // Load step 2 and save it again without training: step_00000002 exists.
        [&](const std::string& root) { return TrainAndSave(cfg_, root, 0); },
        [](const std::string& root, const std::string& what) {
          ExpectLatestSoundOrAbsent(root, what, /*may_be_absent=*/false);
          EXPECT_EQ(ReadText(root + "/latest"), "step_00000002\n") << what;
        },
        [&](const std::string& root) { return TrainAndSave(cfg_, root, 1); }, ExpectTidy, exchange);
  }
}

TEST_F(CheckpointKillTest, AnExport) {
  const std::string one = Sub("template_one");
  MakeTemplate(one, 1);
  auto out_of = [](const std::string& root) { return root + "_model.safetensors"; };
  auto export_to = [&](const std::string& root) {
    ExportStats stats;
    return ExportSafetensors(root, out_of(root), DType::kFloat32, &stats);
  };
  // The export is either absent or whole, and the checkpoint is untouched.
  auto check = [&](const std::string& root, const std::string& what, bool must_exist) {
    ExpectLatestSoundOrAbsent(root, what, /*may_be_absent=*/false);
    const std::string out = out_of(root);
    if (!internal::PathExists(out)) {
      EXPECT_FALSE(must_exist) << what << ": no export";
    } else {
      const std::string bytes = ReadText(out);
      auto index = internal::ParseSafetensorsHeader(bytes, static_cast<int64_t>(bytes.size()), out);
      EXPECT_TRUE(index.ok()) << what << ": " << index.status();
    }
    if (must_exist) {
      EXPECT_FALSE(internal::PathExists(out + ".tmp")) << what << ": temporary left";
    }
  };
  KillAtEveryOperation(
      "export", one, export_to,
      [&](const std::string& root, const std::string& what) { check(root, what, false); },
      export_to,
      [&](const std::string& root, const std::string& what) {
        check(root, what, true);
        internal::RemoveTree(out_of(root)).IgnoreError();
      });
}

}  // namespace
}  // namespace zeroshard::testing
