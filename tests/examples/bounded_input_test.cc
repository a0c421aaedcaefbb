// Every flag of gpt_train, mlp_demo and zeroshard that names a file to
// read (and the files inside a directory such a flag names: --init-from's
// config.json and model.safetensors, a checkpoint's `latest` and manifest,
// a --data directory's files), given what is not a regular file: /dev/zero,
// /dev/urandom, a FIFO nobody writes, a directory, and a symlink to each.
// Each is refused in under 1 s with one line on stderr naming the path,
// exit status 2, and a resident set under 100 MB above the program's own
// --help (wait4's ru_maxrss, compared with a baseline measured here, since
// a CUDA build links large libraries). The run is watched: one that blocks
// on the FIFO is killed after 5 s, one whose resident set grows past the
// limit is killed at once, and either fails the test rather than hanging
// it or eating the machine's memory. (Before zeroshard/input_file.h,
// gpt_train --data /dev/zero took 1.7 GB in 3 s, --data FIFO and
// --init-from with a FIFO model.safetensors blocked, and mlp_demo
// --machine /dev/zero grew without end.)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/program_run.h"

namespace zeroshard {
namespace {

using testing::ProgramLimits;
using testing::ProgramRun;
using testing::RunProgram;

constexpr double kRefusedWithinSeconds = 1.0;
constexpr int64_t kMaxExtraRssKib = 100 * 1024;  // above the program's --help
constexpr double kKillAfterSeconds = 5.0;

// What a file-taking flag is given instead of a regular file.
enum class Kind {
  kDevZero,
  kDevUrandom,
  kFifo,
  kDirectory,
  kLinkToDevZero,
  kLinkToDevUrandom,
  kLinkToFifo,
  kLinkToDirectory,
};
constexpr Kind kKinds[] = {Kind::kDevZero,    Kind::kDevUrandom,     Kind::kFifo,
                           Kind::kDirectory,  Kind::kLinkToDevZero,  Kind::kLinkToDevUrandom,
                           Kind::kLinkToFifo, Kind::kLinkToDirectory};

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kDevZero:
      return "/dev/zero";
    case Kind::kDevUrandom:
      return "/dev/urandom";
    case Kind::kFifo:
      return "a FIFO";
    case Kind::kDirectory:
      return "a directory";
    case Kind::kLinkToDevZero:
      return "a symlink to /dev/zero";
    case Kind::kLinkToDevUrandom:
      return "a symlink to /dev/urandom";
    case Kind::kLinkToFifo:
      return "a symlink to a FIFO";
    case Kind::kLinkToDirectory:
      return "a symlink to a directory";
  }
  return "?";
}

int Lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// A fresh directory for one test, removed at the end.
class BoundedInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string name = std::string(tmp != nullptr ? tmp : "/tmp") + "/zs_bounded_input_XXXXXX";
    ASSERT_NE(mkdtemp(name.data()), nullptr);
    work_ = name;
    // The targets of the symlink kinds.
    ASSERT_EQ(mkfifo(Path("target_fifo").c_str(), 0600), 0);
    ASSERT_EQ(mkdir(Path("target_dir").c_str(), 0700), 0);
  }
  void TearDown() override { std::system(("rm -rf '" + work_ + "'").c_str()); }

  std::string Path(const std::string& name) const { return work_ + "/" + name; }

  // Makes `kind` at `path` (a new name in work_) and returns `path`. The
  // devices themselves cannot be made without privileges: /dev/zero at a
  // path is a symlink to it, and "a symlink to /dev/zero" a symlink to that.
  std::string Make(Kind kind, const std::string& path) {
    int rc = -1;
    switch (kind) {
      case Kind::kDevZero:
        rc = symlink("/dev/zero", path.c_str());
        break;
      case Kind::kDevUrandom:
        rc = symlink("/dev/urandom", path.c_str());
        break;
      case Kind::kFifo:
        rc = mkfifo(path.c_str(), 0600);
        break;
      case Kind::kDirectory:
        rc = mkdir(path.c_str(), 0700);
        break;
      case Kind::kLinkToDevZero:
        rc = symlink(Make(Kind::kDevZero, path + ".target").c_str(), path.c_str());
        break;
      case Kind::kLinkToDevUrandom:
        rc = symlink(Make(Kind::kDevUrandom, path + ".target").c_str(), path.c_str());
        break;
      case Kind::kLinkToFifo:
        rc = symlink(Path("target_fifo").c_str(), path.c_str());
        break;
      case Kind::kLinkToDirectory:
        rc = symlink(Path("target_dir").c_str(), path.c_str());
        break;
    }
    EXPECT_EQ(rc, 0) << "cannot make " << KindName(kind) << " at " << path;
    return path;
  }

  // `kind` as a flag's value: the devices themselves, the others made at a
  // fresh name.
  std::string Value(Kind kind) {
    if (kind == Kind::kDevZero) return "/dev/zero";
    if (kind == Kind::kDevUrandom) return "/dev/urandom";
    return Make(kind, Path("value_" + std::to_string(next_++)));
  }

  // A fresh directory in work_.
  std::string Dir(const std::string& prefix) {
    const std::string dir = Path(prefix + "_" + std::to_string(next_++));
    EXPECT_EQ(mkdir(dir.c_str(), 0700), 0) << dir;
    return dir;
  }

  // A small GPT-2 config.json (the same model each time).
  std::string GptConfig(const std::string& path) {
    std::ofstream(path) << "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", "
                           "\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"n_positions\": 64, "
                           "\"vocab_size\": 256, \"layer_norm_epsilon\": 1e-5}\n";
    return path;
  }

  // A checkpoint directory whose `latest` names step_00000001, whose
  // manifest.json is `kind`.
  std::string CheckpointWithManifest(Kind kind) {
    const std::string root = Dir("ckpt");
    std::ofstream(root + "/latest") << "step_00000001\n";
    EXPECT_EQ(mkdir((root + "/step_00000001").c_str(), 0700), 0);
    Make(kind, root + "/step_00000001/manifest.json");
    return root;
  }

  // The resident set of `program`'s --help (`help`: its argv), measured
  // once per program.
  int64_t BaselineKib(const std::vector<std::string>& help) {
    static std::map<std::vector<std::string>, int64_t>* baselines =
        new std::map<std::vector<std::string>, int64_t>;
    auto it = baselines->find(help);
    if (it != baselines->end()) return it->second;
    ProgramLimits limits;
    limits.kill_after_seconds = 30;
    const ProgramRun r = RunProgram(help, limits);
    EXPECT_EQ(r.exit_code, 0) << help[0] << " --help: " << r.err;
    EXPECT_GT(r.max_rss_kib, 0);
    return (*baselines)[help] = r.max_rss_kib;
  }

  // Runs `args` and expects the refusal the file comment describes, its
  // one line naming `named`.
  void ExpectRefused(const std::vector<std::string>& help, const std::vector<std::string>& args,
                     const std::string& named, const std::string& what) {
    const int64_t baseline = BaselineKib(help);
    ProgramLimits limits;
    limits.kill_after_seconds = kKillAfterSeconds;
    limits.kill_above_rss_kib = baseline + kMaxExtraRssKib + 50 * 1024;
    const ProgramRun r = RunProgram(args, limits);
    std::string command;
    for (const std::string& a : args) command += " " + a;
    SCOPED_TRACE(what + ":" + command);
    EXPECT_EQ(r.killed, "") << r.err;
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(Lines(r.err), 1) << "one line expected: " << r.err;
    EXPECT_NE(r.err.find(named), std::string::npos)
        << "the message does not name " << named << ": " << r.err;
    EXPECT_LT(r.seconds, kRefusedWithinSeconds) << r.err;
    EXPECT_LT(r.max_rss_kib - baseline, kMaxExtraRssKib)
        << "resident set " << r.max_rss_kib << " KiB, the --help run's " << baseline
        << " KiB: " << r.err;
  }

  std::string work_;
  int next_ = 0;
};

// ---- gpt_train ------------------------------------------------------------

const std::vector<std::string> kGptHelp = {ZS_GPT_TRAIN, "--help"};

std::vector<std::string> GptArgs(const std::string& config, const std::string& data,
                                 const std::vector<std::string>& more) {
  std::vector<std::string> args = {ZS_GPT_TRAIN, "--config", config,    "--data", data,
                                   "--seq",      "16",       "--steps", "1",      "--quiet"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST_F(BoundedInputTest, GptTrainConfig) {
  for (Kind kind : kKinds) {
    const std::string bad = Value(kind);
    ExpectRefused(kGptHelp, GptArgs(bad, ZS_GPT_TEXT, {}), bad,
                  std::string("--config ") + KindName(kind));
  }
}

// Defect 5: --data /dev/zero grew by 1.7 GB in 3 s, /dev/urandom alike,
// and a FIFO blocked.
TEST_F(BoundedInputTest, GptTrainData) {
  const std::string config = GptConfig(Path("config.json"));
  for (Kind kind : kKinds) {
    const std::string bad = Value(kind);
    // A directory is a corpus too: an empty one has no text file.
    ExpectRefused(kGptHelp, GptArgs(config, bad, {}), bad, std::string("--data ") + KindName(kind));
    // In a directory, a file that is not regular is skipped, not read.
    const std::string corpus = Dir("corpus");
    Make(kind, corpus + "/a.txt");
    ExpectRefused(kGptHelp, GptArgs(config, corpus, {}), corpus,
                  std::string("--data DIR holding ") + KindName(kind));
  }
}

// Defect 4: --init-from DIR with model.safetensors a FIFO blocked; a
// symlink to /dev/zero or to a directory gave "INTERNAL: cannot stat".
TEST_F(BoundedInputTest, GptTrainInitFrom) {
  const std::string config = GptConfig(Path("config.json"));
  for (Kind kind : kKinds) {
    // The directory itself (an empty directory has no model.safetensors).
    const std::string bad = Value(kind);
    ExpectRefused(kGptHelp, GptArgs(config, ZS_GPT_TEXT, {"--init-from", bad}), bad,
                  std::string("--init-from ") + KindName(kind));
    // Its model.safetensors, beside a config.json of the run's model.
    std::string dir = Dir("init");
    GptConfig(dir + "/config.json");
    const std::string weights = Make(kind, dir + "/model.safetensors");
    ExpectRefused(kGptHelp, GptArgs(config, ZS_GPT_TEXT, {"--init-from", dir}), weights,
                  std::string("--init-from DIR/model.safetensors ") + KindName(kind));
    // Its config.json, beside a model.safetensors (only opened before the
    // config is read).
    dir = Dir("init");
    std::ofstream(dir + "/model.safetensors") << "";
    const std::string hf_config = Make(kind, dir + "/config.json");
    ExpectRefused(kGptHelp, GptArgs(config, ZS_GPT_TEXT, {"--init-from", dir}), hf_config,
                  std::string("--init-from DIR/config.json ") + KindName(kind));
  }
}

TEST_F(BoundedInputTest, GptTrainResume) {
  const std::string config = GptConfig(Path("config.json"));
  for (Kind kind : kKinds) {
    const std::string bad = Value(kind);
    ExpectRefused(kGptHelp, GptArgs(config, ZS_GPT_TEXT, {"--checkpoint-dir", bad, "--resume"}),
                  bad, std::string("--checkpoint-dir ") + KindName(kind));
    const std::string root = Dir("ckpt");
    const std::string latest = Make(kind, root + "/latest");
    ExpectRefused(kGptHelp, GptArgs(config, ZS_GPT_TEXT, {"--checkpoint-dir", root, "--resume"}),
                  latest, std::string("--checkpoint-dir DIR/latest ") + KindName(kind));
    const std::string with_manifest = CheckpointWithManifest(kind);
    ExpectRefused(
        kGptHelp, GptArgs(config, ZS_GPT_TEXT, {"--checkpoint-dir", with_manifest, "--resume"}),
        "manifest.json", std::string("--checkpoint-dir DIR's manifest ") + KindName(kind));
  }
}

// ---- mlp_demo -------------------------------------------------------------

const std::vector<std::string> kMlpHelp = {ZS_MLP_DEMO, "--help"};

// Defect 6: --machine /dev/zero --mem-cap 16MiB grew without end; a FIFO
// blocked.
TEST_F(BoundedInputTest, MlpDemoMachine) {
  for (Kind kind : kKinds) {
    const std::string bad = Value(kind);
    ExpectRefused(
        kMlpHelp,
        {ZS_MLP_DEMO, "--mem-cap", "16MiB", "--machine", bad, "--ranks", "2", "--steps", "1"}, bad,
        std::string("--machine ") + KindName(kind));
  }
}

TEST_F(BoundedInputTest, MlpDemoResume) {
  for (Kind kind : kKinds) {
    const std::string bad = Value(kind);
    ExpectRefused(kMlpHelp, {ZS_MLP_DEMO, "--checkpoint-dir", bad, "--resume", "--steps", "1"}, bad,
                  std::string("--checkpoint-dir ") + KindName(kind));
    const std::string root = Dir("ckpt");
    const std::string latest = Make(kind, root + "/latest");
    ExpectRefused(kMlpHelp, {ZS_MLP_DEMO, "--checkpoint-dir", root, "--resume", "--steps", "1"},
                  latest, std::string("--checkpoint-dir DIR/latest ") + KindName(kind));
    const std::string with_manifest = CheckpointWithManifest(kind);
    ExpectRefused(
        kMlpHelp, {ZS_MLP_DEMO, "--checkpoint-dir", with_manifest, "--resume", "--steps", "1"},
        "manifest.json", std::string("--checkpoint-dir DIR's manifest ") + KindName(kind));
  }
}

// ---- zeroshard ------------------------------------------------------------

const std::vector<std::string> kEstimateHelp = {ZS_ZEROSHARD, "estimate", "--help"};
const std::vector<std::string> kInspectHelp = {ZS_ZEROSHARD, "inspect", "--help"};
const std::vector<std::string> kExportHelp = {ZS_ZEROSHARD, "export", "--help"};

TEST_F(BoundedInputTest, ZeroshardEstimate) {
  for (Kind kind : kKinds) {
    const std::string k = KindName(kind);
    for (const char* flag : {"--spec", "--hf-config", "--config"}) {
      const std::string bad = Value(kind);
      ExpectRefused(kEstimateHelp, {ZS_ZEROSHARD, "estimate", flag, bad}, bad,
                    std::string(flag) + " " + k);
    }
    std::string bad = Value(kind);
    ExpectRefused(kEstimateHelp, {ZS_ZEROSHARD, "estimate", "--machine", bad, "--model", "mlp"},
                  bad, "--machine " + k);
    bad = Value(kind);
    ExpectRefused(kEstimateHelp,
                  {ZS_ZEROSHARD, "estimate", "--preset", "gpt2", "--gpus", "8", "--network", bad},
                  bad, "--network " + k);
  }
}

TEST_F(BoundedInputTest, ZeroshardInspectAndExport) {
  for (Kind kind : kKinds) {
    const std::string k = KindName(kind);
    const std::string out = Path("out_" + std::to_string(next_++) + ".safetensors");
    const std::string hf_out = Path("hf_" + std::to_string(next_++));
    // The checkpoint directory itself, its `latest` and its manifest.
    std::string bad = Value(kind);
    ExpectRefused(kInspectHelp, {ZS_ZEROSHARD, "inspect", bad}, bad, "inspect " + k);
    ExpectRefused(kExportHelp, {ZS_ZEROSHARD, "export", bad, "--out", out}, bad,
                  "export --out " + k);
    ExpectRefused(kExportHelp, {ZS_ZEROSHARD, "export", bad, "--hf", hf_out}, bad,
                  "export --hf " + k);
    const std::string root = Dir("ckpt");
    const std::string latest = Make(kind, root + "/latest");
    ExpectRefused(kInspectHelp, {ZS_ZEROSHARD, "inspect", root}, latest, "inspect DIR/latest " + k);
    ExpectRefused(kExportHelp, {ZS_ZEROSHARD, "export", root, "--out", out}, latest,
                  "export DIR/latest " + k);
    const std::string with_manifest = CheckpointWithManifest(kind);
    ExpectRefused(kInspectHelp, {ZS_ZEROSHARD, "inspect", with_manifest}, "manifest.json",
                  "inspect DIR's manifest " + k);
    ExpectRefused(kExportHelp, {ZS_ZEROSHARD, "export", with_manifest, "--out", out},
                  "manifest.json", "export DIR's manifest " + k);
    struct stat st {};
    EXPECT_NE(lstat(out.c_str(), &st), 0) << out << " written for a refused export";
    EXPECT_NE(lstat(hf_out.c_str(), &st), 0) << hf_out << " written for a refused export";
  }
}

#if ZS_HAVE_CALIBRATE
// calibrate reads an existing --out profile (to keep what it does not
// measure again) before it measures anything.
TEST_F(BoundedInputTest, ZeroshardCalibrateOut) {
  const std::vector<std::string> help = {ZS_ZEROSHARD, "calibrate", "--help"};
  for (Kind kind : kKinds) {
    const std::string bad = Value(kind);
    ExpectRefused(help, {ZS_ZEROSHARD, "calibrate", "--what", "collectives", "--out", bad}, bad,
                  std::string("calibrate --out ") + KindName(kind));
  }
}
#endif

}  // namespace
}  // namespace zeroshard
