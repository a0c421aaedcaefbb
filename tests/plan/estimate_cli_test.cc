// Runs the built `zeroshard` binary: the table, JSON that parses with the
// documented keys, an SVG, and exit code 2 with one error line on bad input.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/command_runner.h"
#include "tests/plan/llama3_8b_hand_count.h"
#include "tests/test_seed.h"

namespace {

using Result = ::zeroshard::testing::CommandResult;
using ::zeroshard::testing::RunCommand;

std::string TempPath(const std::string& name) {
  return ::zeroshard::testing::TestTempPath("estimate_cli_test_" + name);
}

Result RunCli(const std::string& args) { return RunCommand(std::string(ZS_BINARY) + " " + args); }

// RunCli under `timeout`: a command that blocks fails the test instead of
// hanging it (exit code 124).
Result RunCliWithin(int seconds, const std::string& args) {
  return RunCommand("timeout -k 1 " + std::to_string(seconds) + " " + ZS_BINARY + " " + args);
}

std::string TestData(const std::string& name) { return std::string(ZS_PLAN_TESTDATA) + "/" + name; }

TEST(EstimateCliTest, PrintsTheTableQuickly) {
  const Result r = RunCli("estimate --preset llama-2-7b --gpus 8 --gpu-mem 80GiB");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "6,738,415,616 params")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "* stage 1")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "rejected: stage 0: ")) << r.out;
  EXPECT_LT(r.seconds, 1.0);
}

TEST(EstimateCliTest, JsonParsesWithTheDocumentedKeys) {
  const Result r = RunCli("estimate --preset llama-2-70b --gpus 64 --gpu-mem 80GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << r.out.substr(0, 400);
  EXPECT_EQ(doc["params"].get<int64_t>(), 68976648192);
  ASSERT_TRUE(doc["chosen"].is_number_integer());
  ASSERT_TRUE(doc["candidates"].is_array());
  for (const auto& c : doc["candidates"]) {
    for (const char* key : {"stage", "offload", "tp", "pp", "dp", "per_gpu_bytes", "fits"}) {
      EXPECT_TRUE(c.contains(key)) << key;
    }
    const auto& m = c["per_gpu_bytes"];
    int64_t sum = 0;
    for (const char* key : {"params", "grads", "master", "optimizer", "buffers", "activations"}) {
      ASSERT_TRUE(m.contains(key)) << key;
      sum += m[key].get<int64_t>();
    }
    sum += m["workspace"].get<int64_t>() + m["reserve"].get<int64_t>();
    EXPECT_EQ(sum, m["total"].get<int64_t>());
  }
  const auto& chosen = doc["candidates"][doc["chosen"].get<int>()];
  EXPECT_TRUE(chosen["fits"].get<bool>());
  EXPECT_GT(chosen["tp"].get<int>() * chosen["pp"].get<int>(), 1);
}

TEST(EstimateCliTest, WritesAnSvgChart) {
  const std::string path = TempPath("chart.svg");
  std::remove(path.c_str());
  const Result r = RunCli("estimate --preset llama-2-7b --gpus 8 --svg " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string svg = text.str();
  EXPECT_TRUE(absl::StartsWith(svg, "<?xml")) << svg.substr(0, 100);
  EXPECT_TRUE(absl::StrContains(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(absl::StrContains(svg, "</svg>"));
  EXPECT_TRUE(absl::StrContains(svg, "stage 1"));
}

TEST(EstimateCliTest, ReadsHfConfigsSpecsAndCounts) {
  Result r =
      RunCli("estimate --hf-config " + TestData("llama-3-8b-config.json") + " --gpus 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["params"].get<int64_t>(), 8030261248);
  r = RunCli("estimate --spec " + TestData("small-spec.json") + " --gpus 2 --gpu-mem 4GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCli(
      "estimate --params 7.5e9 --gpus 64 --stage 3 --tp 1 --pp 1 "
      "--offload none --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  EXPECT_NEAR(doc["candidates"][0]["per_gpu_bytes"]["model_states"].get<double>() / 1e9, 1.9, 0.05);
  r = RunCli("estimate --preset gpt2 --gpus 8 --price 2.5 --tokens 10B");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "epoch $")) << r.out;
}

TEST(EstimateCliTest, HelpAndNothingFits) {
  Result r = RunCli("estimate --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--preset"));
  r = RunCli("estimate --preset llama-2-70b --gpus 1 --gpu-mem 24GiB");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "no fit")) << r.out;
}

TEST(EstimateCliTest, BadInputIsOneErrorLineAndExitCode2) {
  const std::string bad_file = TestData("malformed-config.json");
  for (const std::string& args : std::vector<std::string>{
           std::string("estimate --preset no-such-model"),
           "estimate --hf-config " + bad_file,
           "estimate --spec " + bad_file,
           "estimate --hf-config " + TestData("unsupported-config.json"),
           "estimate --hf-config /nonexistent/config.json",
           std::string("estimate --preset gpt2 --gpu-mem lots"),
           std::string("estimate --preset gpt2 --gpu-mem 0GiB"),
           std::string("estimate --preset gpt2 --host-mem 12XB"),
           std::string("estimate --preset gpt2 --gpus 0"),
           std::string("estimate --preset gpt2 --gpus abc"),
           std::string("estimate --preset gpt2 --tp 5"),
           std::string("estimate --preset llama-2-7b --gpus 12"),
           std::string("estimate --preset gpt2 --seq 4096"),
           std::string("estimate --preset gpt2 --stage 4"),
           std::string("estimate --preset gpt2 --stage 2 --offload optimizer=host,params=host"),
           std::string("estimate --preset gpt2 --stage 3 --offload grads=host"),
           std::string("estimate --preset gpt2 --offload optimizer=tape"),
           std::string("estimate --preset gpt2 --offload optimiser=host"),
           std::string("estimate --preset gpt2 --offload params=nvme"),
           std::string("estimate --preset gpt2 --nvme-read-gbps 0"),
           std::string("estimate --preset gpt2 --nvme-gbps 2e6"),
           std::string("estimate --preset gpt2 --precision fp8"),
           std::string("estimate --preset gpt2 --params 7B"),
           std::string("estimate"),
           std::string("estimate --preset gpt2 --frobnicate"),
           std::string("estimate --preset gpt2 --svg /nonexistent/dir/chart.svg"),
           std::string("frobnicate"),
       }) {
    const Result r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
    EXPECT_FALSE(r.err.empty()) << args;
    if (std::string("frobnicate") != args) {
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    }
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
  }
}

// Every number in the JSON report is finite (nlohmann writes inf and NaN
// as null) and non-negative; "chosen" alone may be null.
void ExpectFiniteNumbers(const nlohmann::json& node, const std::string& path) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      if (key == "chosen" && value.is_null()) continue;
      ExpectFiniteNumbers(value, path + "." + key);
    }
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) ExpectFiniteNumbers(node[i], path + "[]");
  } else {
    EXPECT_FALSE(node.is_null()) << path;
    if (node.is_number()) {
      EXPECT_TRUE(std::isfinite(node.get<double>())) << path;
      EXPECT_GE(node.get<double>(), 0) << path;
    }
  }
}

nlohmann::json ParseReport(const Result& r) {
  nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(doc.is_discarded()) << r.out.substr(0, 400);
  if (!doc.is_discarded()) ExpectFiniteNumbers(doc, "");
  return doc;
}

void ExpectOneErrorLine(const std::string& args, const std::string& needle) {
  const Result r = RunCli(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out.substr(0, 400) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  EXPECT_TRUE(absl::StartsWith(r.err, "zeroshard estimate: ")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, needle)) << args << ": " << r.err;
  EXPECT_TRUE(r.out.empty()) << args << ": " << r.out.substr(0, 400);
  EXPECT_LT(r.seconds, 2.0) << args;
}

// Counts past 2^63 used to wrap into "fits" with exit 0.
TEST(EstimateCliTest, OverflowingModelsAndBatchesAreRefusedWithOneLine) {
  ExpectOneErrorLine("estimate --params 4.6e18", "--params: parameter count 4600000000000000000");
  ExpectOneErrorLine("estimate --hf-config " + TestData("llama-huge-hidden-config.json"),
                     "'layers.0.self_attn.q_proj.weight' of shape "
                     "[1000000000000, 1000000000000]");
  ExpectOneErrorLine("estimate --hf-config " + TestData("gpt2-huge-positions-config.json"),
                     "'embed.wpe.weight' of shape [1000000000000000000, 768]");
  ExpectOneErrorLine("estimate --hf-config " + TestData("llama-huge-vocab-config.json"),
                     "'embed.embed_tokens.weight' of shape [4611686018427387904, 4096]");
  ExpectOneErrorLine("estimate --preset gpt2 --micro-batch 1000000000000000000",
                     "lower --micro-batch");
  ExpectOneErrorLine("estimate --hf-config " + TestData("llama-deep-config.json"),
                     "num_hidden_layers 100000000 exceeds the supported maximum 16384");
  ExpectOneErrorLine("estimate --hf-config " + TestData("mixtral-labelled-mistral-config.json"),
                     "field 'num_local_experts' is 8");
  ExpectOneErrorLine("estimate --preset gpt2 --price 1e308 --tokens 1T",
                     "--price: '1e308' is outside [0, 1000000]");
  ExpectOneErrorLine("estimate --preset gpt2 --mfu 1e-300", "--mfu");
}

// A FIFO, a device or a file over the 64 MiB cap given as an input file is
// refused at once with one line naming the path (it used to block on the
// FIFO and read /dev/zero until memory ran out). `timeout` turns a hang
// into a failure instead of a stuck test.
TEST(EstimateCliTest, InputFilesMustBeRegularFilesOfAtMost64MiB) {
  const std::string fifo = TempPath("fifo.json");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << fifo;
  const std::string big = TempPath("big.json");
  { std::ofstream(big) << "{}"; }
  ASSERT_EQ(truncate(big.c_str(), (int64_t{64} << 20) + 1), 0) << big;  // sparse: no disk used
  const std::pair<std::string, std::string> inputs[] = {
      {fifo, "a FIFO (named pipe), where the "},
      {"/dev/zero", "a character device, where the "},
      {big, "67108865 bytes, but the "}};
  for (const auto& [path, needle] : inputs) {
    for (const std::string flag : {"--spec", "--hf-config", "--machine"}) {
      const std::string args =
          "estimate " + flag + " " + path + (flag == "--machine" ? " --model mlp" : "");
      const Result r = RunCliWithin(10, args);
      EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
      EXPECT_TRUE(absl::StrContains(r.err, "zeroshard estimate: " + path + ": " + needle + flag))
          << args << ": " << r.err;
      EXPECT_TRUE(r.out.empty()) << args;
      EXPECT_LT(r.seconds, 2.0) << args;
    }
  }
  // calibrate's --out is read the same way before anything is measured.
  const Result c = RunCliWithin(10, "calibrate --what collectives --out " + fifo);
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_TRUE(absl::StrContains(c.err, fifo + ": a FIFO (named pipe), where the --out profile"))
      << c.err;
  EXPECT_LT(c.seconds, 2.0);
  std::remove(fifo.c_str());
  std::remove(big.c_str());
}

// A profile made from testdata/machine-2-cores.json with `field` (a JSON
// pointer) set to `value`.
std::string ProfileWith(const std::string& name, const std::string& field, double value) {
  std::ifstream in(TestData("machine-2-cores.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j[nlohmann::json::json_pointer(field)] = value;
  const std::string path = TempPath(name);
  std::ofstream(path) << j.dump(1);
  return path;
}

// Issue 17: "ns_per_param": 1.7e308 printed inf (table) and null (JSON)
// with exit 0. Every profile field has a range, every predicted time a
// bound; neither is ever printed past it.
TEST(EstimateMachineCliTest, OutOfRangeProfilesAndPredictionsAreOneErrorLine) {
  const std::string huge = ProfileWith("huge.json", "/optimizer/ns_per_param", 1.7e308);
  const std::string run = " --model mlp --gpus 2 --hidden 256 --blocks 1000";
  for (const std::string output : {" --json", ""}) {
    ExpectOneErrorLine("estimate --machine " + huge + run + output,
                       huge +
                           ": field 'optimizer.ns_per_param' is 1.7e+308, outside its range "
                           "[0.001, 1000000] (ns per param)");
  }
  // In range, but a step of hidden 65536 at 1 MFLOP/s would take 10^9 s.
  const std::string slow = ProfileWith("slow.json", "/sgemm/gflops", 0.001);
  ExpectOneErrorLine(
      "estimate --machine " + slow + " --model mlp --hidden 65536 --blocks 100 --json",
      "--machine " + slow + ": the predicted gemm time, ");
  ExpectOneErrorLine("estimate --machine " + slow + " --model mlp --hidden 65536 --blocks 100",
                     "passes the model's bound of 1000000 s");
  // At the edges of every range the prediction is finite, in JSON too.
  const std::string edge = ProfileWith("edge.json", "/sgemm/gflops", 1e6);
  const Result r = RunCli("estimate --machine " + edge + " --model mlp --gpus 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ParseReport(r);
}

// Issue 17: a refused value is quoted as given ("1000001", not "1e+06"),
// with its range, and every range is inclusive as docs/estimator.md says:
// latencies and --price may be 0, --reserve and --workspace too.
TEST(EstimateCliTest, RangedFlagsAcceptTheirBoundsAndQuoteWhatTheyRefuse) {
  ExpectOneErrorLine("estimate --preset gpt2 --intra-node-bw 1000001",
                     "--intra-node-bw: '1000001' is outside [0.001, 1000000] (GB/s per GPU); give "
                     "a number in that range");
  struct Flag {
    const char* name;
    double min;
    double max;
  };
  const Flag flags[] = {{"--intra-node-bw", 0.001, 1e6},
                        {"--inter-node-bw", 0.001, 1e6},
                        {"--pcie-bw", 0.001, 1e6},
                        {"--peak-tflops", 0.001, 1e6},
                        {"--intra-node-latency", 0, 1e6},
                        {"--inter-node-latency", 0, 1e6},
                        {"--mfu", 0.001, 1},
                        {"--price", 0, 1e6}};
  const std::string base = "estimate --preset gpt2 --gpus 8 --json ";
  std::mt19937_64 rng(zeroshard::testing::Seed());
  auto text_of = [&](double v) {
    const char* formats[] = {"%.17g", "%g", "%e", "%.12f"};
    char buf[64];
    std::snprintf(buf, sizeof(buf), formats[rng() % 4], v);
    return std::string(buf);
  };
  for (const Flag& f : flags) {
    const std::string name(f.name);
    // Both bounds are accepted.
    for (double v : {f.min, f.max}) {
      const Result r = RunCli(base + name + " " + text_of(v));
      EXPECT_NE(r.exit_code, 2) << name << " " << v << ": " << r.err;
    }
    // A random value inside is accepted; one outside is quoted as given.
    const double inside =
        f.min + (f.max - f.min) * std::uniform_real_distribution<double>(0, 1)(rng);
    const std::string in_text = text_of(inside);
    const Result in = RunCli(base + name + " " + in_text);
    EXPECT_NE(in.exit_code, 2) << name << " " << in_text << ": " << in.err
                               << zeroshard::testing::SeedTrace();
    const double outside =
        rng() & 1 ? f.max * (1 + std::uniform_real_distribution<double>(1e-6, 10)(rng))
                  : (f.min > 0 ? f.min * std::uniform_real_distribution<double>(0, 0.99)(rng)
                               : -std::uniform_real_distribution<double>(1e-6, 1e6)(rng));
    const std::string out_text = text_of(outside);
    char range[96];
    std::snprintf(range, sizeof(range), "[%s, %.0f]", f.min == 0.001 ? "0.001" : "0", f.max);
    ExpectOneErrorLine(base + name + " " + out_text,
                       name + ": '" + out_text + "' is outside " + range + " (");
  }
  // Zero reserve and workspace: the planner's range starts at 0.
  for (const char* flag : {"--reserve", "--workspace"}) {
    const Result r = RunCli(base + flag + " 0");
    EXPECT_EQ(r.exit_code, 0) << flag << ": " << r.err;
  }
  ExpectOneErrorLine(base + "--reserve -1GiB", "--reserve: '-1GiB' is negative");
  // Integer flags: their bounds accepted, one past quoted with the range.
  EXPECT_EQ(RunCli(base + "--prefetch-depth 64").exit_code, 0);
  ExpectOneErrorLine(base + "--prefetch-depth 65",
                     "--prefetch-depth: '65' is not an integer in [1, 64]");
  EXPECT_NE(RunCli("estimate --preset gpt2 --gpus 1024 --gpus-per-node 1024").exit_code, 2);
  ExpectOneErrorLine(base + "--gpus-per-node 1025",
                     "--gpus-per-node: '1025' is not an integer in [1, 1024]");
  ExpectOneErrorLine(base + "--tp 1025", "--tp: '1025' is not an integer in [1, 1024]");
  ExpectOneErrorLine(base + "--grad-accum 1048577",
                     "--grad-accum: '1048577' is not an integer in [1, 1048576]");
  ExpectOneErrorLine("estimate --preset gpt2 --gpus 1048577",
                     "--gpus: '1048577' is not an integer in [1, 1048576]");
}

TEST(EstimateCliTest, FullRecomputationAtLongContextIsNotOverstated) {
  const std::string args =
      "estimate --preset llama-3-8b --seq 131072 --gpus "
      "64 --tp 8 --pp 1 --stage 1 --offload "
      "none --json --recompute ";
  const Result full = RunCli(args + "full");
  ASSERT_EQ(full.exit_code, 0) << full.err;  // it was 149.3 GiB: no fit
  const Result selective = RunCli(args + "selective");
  ASSERT_EQ(selective.exit_code, 1) << selective.err;
  const auto full_bytes = ParseReport(full)["candidates"][0]["per_gpu_bytes"];
  const auto selective_bytes = ParseReport(selective)["candidates"][0]["per_gpu_bytes"];
  EXPECT_LT(full_bytes["activations"].get<int64_t>(),
            selective_bytes["activations"].get<int64_t>());
  EXPECT_NEAR(full_bytes["total"].get<double>() / (1 << 30), 21.2, 0.1);
  // The report's bytes are the hand count's (tests/plan/llama3_8b_hand_count.h)
  // to the byte, field by field.
  const zeroshard::testing::HandCountedBytes hand =
      zeroshard::testing::Llama3_8bTp8Dp8Stage1FullRecompute128k();
  EXPECT_NEAR(static_cast<double>(hand.total()) / (1 << 30), 21.2, 0.05);
  EXPECT_EQ(full_bytes["params"].get<int64_t>(), hand.params);
  EXPECT_EQ(full_bytes["grads"].get<int64_t>(), hand.grads);
  EXPECT_EQ(full_bytes["master"].get<int64_t>(), hand.master);
  EXPECT_EQ(full_bytes["optimizer"].get<int64_t>(), hand.optimizer);
  EXPECT_EQ(full_bytes["buffers"].get<int64_t>(), hand.buffers);
  EXPECT_EQ(full_bytes["activations"].get<int64_t>(), hand.activations);
  EXPECT_EQ(full_bytes["workspace"].get<int64_t>(), hand.workspace);
  EXPECT_EQ(full_bytes["reserve"].get<int64_t>(), hand.reserve);
  EXPECT_EQ(full_bytes["total"].get<int64_t>(), hand.total());
}

TEST(EstimateCliTest, PlansClustersAbove1024GpusQuickly) {
  Result r = RunCli("estimate --preset llama-2-7b --gpus 4096 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto doc = ParseReport(r);
  const auto& chosen = doc["candidates"][doc["chosen"].get<int>()];
  EXPECT_EQ(chosen["label"], "stage 1");
  EXPECT_EQ(chosen["dp"], 4096);
  for (const auto& why : doc["rejected"])
    EXPECT_FALSE(absl::StrContains(why.get<std::string>(), "limit"));
  r = RunCli("estimate --preset llama-2-7b --gpus 1048576 --gpus-per-node 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(r.seconds, 1.0);
  doc = ParseReport(r);
  EXPECT_EQ(doc["candidates"][0]["dp"], 1048576);
  EXPECT_EQ(doc["training"]["global_batch"], 1048576);
}

TEST(EstimateCliTest, Stage1OffloadPutsAGradientShardOnTheHost) {
  const Result r = RunCli(
      "estimate --preset llama-2-7b --gpus 8 --stage 1 "
      "--offload optimizer=host,grads=host --tp 1 --pp 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto doc = ParseReport(r);
  bool found = false;
  for (const auto& b : doc["candidates"][0]["buffers"]) {
    if (b["name"] == "offload_grad_shard") {
      found = true;
      EXPECT_EQ(b["placement"], "host");
    }
  }
  EXPECT_TRUE(found) << r.out.substr(0, 2000);
  EXPECT_GT(doc["candidates"][0]["per_rank_host_bytes"]["grads"].get<int64_t>(), 0);
}

TEST(EstimateCliTest, PrefetchDepthIsCappedAtTheShardedUnits) {
  // 35 sharded units: depth 64 gets 35 gather buffers, not 64.
  auto gather = [](const std::string& depth) {
    const Result run = RunCli(
        "estimate --preset llama-2-7b --gpus 8 --stage 3 "
        "--offload none --tp 1 --pp 1 --json "
        "--prefetch-depth " +
        depth);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    const nlohmann::json doc = ParseReport(run);
    for (const auto& b : doc["candidates"][0]["buffers"]) {
      if (b["name"] == "param_gather") return b["numel"].get<int64_t>();
    }
    return int64_t{-1};
  };
  EXPECT_EQ(2 * gather("64"), 35 * gather("2"));
}

TEST(EstimateCliTest, ReadsTheMixtralPreset) {
  const Result r = RunCli("estimate --preset mixtral-8x7b --gpus 64 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ParseReport(r)["params"].get<int64_t>(), 46702792704);
}

}  // namespace

namespace calibrate {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `zeroshard calibrate` with tiny sizes writes a profile that
// `estimate --machine` accepts; a broken one is refused naming the field.
TEST(CalibrateCliTest, WritesAProfileThatEstimateMachineReads) {
  const std::string profile = TempPath("machine.json");
  std::remove(profile.c_str());
  const Result c = RunCli("calibrate --out " + profile +
                          " --hidden 16 --blocks 2 --micro-batch 4 --min-seconds 0.01"
                          " --sizes 1024,4096 --ranks 2");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(absl::StrContains(c.err, "[compute 1/4] sgemm")) << c.err;  // progress
  const nlohmann::json j = nlohmann::json::parse(ReadAll(profile));
  EXPECT_EQ(j["schema"], "zeroshard.machine.v1");
  for (const char* field : {"machine", "cpu", "date", "cores", "sgemm", "elementwise", "optimizer",
                            "collectives", "units"}) {
    EXPECT_TRUE(j.contains(field)) << field;
  }
  EXPECT_GT(j["sgemm"]["gflops"].get<double>(), 0.0);
  EXPECT_GT(j["collectives"]["local"]["2"]["all_gather"]["beta_gbps"].get<double>(), 0.0);

  const Result e = RunCli("estimate --machine " + profile +
                          " --model mlp --hidden 16 --blocks 2 --micro-batch 4 --gpus 2 --json");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const nlohmann::json p = nlohmann::json::parse(e.out);
  ASSERT_EQ(p["predictions"].size(), 4u);
  for (const auto& row : p["predictions"]) EXPECT_GT(row["ms"]["total"].get<double>(), 0.0);
  const Result table = RunCli("estimate --machine " + profile + " --model mlp --gpus 2 --stage 3");
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_TRUE(absl::StrContains(table.out, "calibrated at hidden 16")) << table.out;

  // No 4-rank collectives in this profile: the error says how to add them.
  const Result four = RunCli("estimate --machine " + profile + " --model mlp --gpus 4");
  EXPECT_EQ(four.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(four.err, "no local collectives for 4 ranks")) << four.err;

  std::string text = ReadAll(profile);
  const size_t at = text.find("\"copy_gbps\":");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, text.find_first_of(",\n}", at) - at, "\"copy_gbps\": 0");
  const std::string bad = TempPath("bad_machine.json");
  std::ofstream(bad) << text;
  const Result b = RunCli("estimate --machine " + bad + " --model mlp --gpus 2");
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(b.err,
                                "field 'elementwise.copy_gbps' is 0, outside its range [0.001, "
                                "1000000] (10^9 bytes/s)"))
      << b.err;
}

// --cpus-per-rank: a rank bound to one of the 2 cores runs its loader on
// the trainer's core. testdata/machine-2-cores.json is tests/tools/mlp_step_model_test.cc's
// round profile, so the figures are its hand-computed ones (hidden 64, 2
// blocks, micro-batch 4, stage 0, one rank): critical path 2.332928 ms, CPU
// work 2.871808 ms.
TEST(CalibrateCliTest, CpusPerRankBindsTheModelsRanks) {
  const std::string base = "estimate --machine " + TestData("machine-2-cores.json") +
                           " --model mlp --hidden 64 --blocks 2 --micro-batch 4 --stage 0 --json";
  const Result unbound = RunCli(base);
  ASSERT_EQ(unbound.exit_code, 0) << unbound.err;
  const nlohmann::json u = nlohmann::json::parse(unbound.out);
  EXPECT_EQ(u["workload"]["cpus_per_rank"], 0);
  EXPECT_EQ(u["workload"]["usable_cores"], 2);
  EXPECT_NEAR(u["predictions"][0]["ms"]["total"].get<double>(), 2.332928, 1e-9);

  const Result bound = RunCli(base + " --cpus-per-rank 1");
  ASSERT_EQ(bound.exit_code, 0) << bound.err;
  const nlohmann::json b = nlohmann::json::parse(bound.out);
  EXPECT_EQ(b["workload"]["cpus_per_rank"], 1);
  EXPECT_EQ(b["workload"]["usable_cores"], 1);
  EXPECT_NEAR(b["predictions"][0]["ms"]["total"].get<double>(), 2.871808, 1e-9);

  const Result table = RunCli("estimate --machine " + TestData("machine-2-cores.json") +
                              " --model mlp --gpus 2 --cpus-per-rank=1");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_TRUE(absl::StrContains(table.out, "cpus      1 per rank (bound): 2 of 2 cores usable"))
      << table.out;

  const Result negative = RunCli(base + " --cpus-per-rank -1");
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(negative.err, "--cpus-per-rank: '-1' is not an integer in [0, "))
      << negative.err;
  const Result no_machine = RunCli("estimate --preset gpt2 --cpus-per-rank 1");
  EXPECT_EQ(no_machine.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(no_machine.err, "--cpus-per-rank needs --machine"))
      << no_machine.err;
}

TEST(CalibrateCliTest, BadArgumentsAreOneLine) {
  const Result r = RunCli("calibrate --backend carrier-pigeon");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--backend: 'carrier-pigeon' is not local or mpi")) << r.err;
  const Result m = RunCli("estimate --preset gpt2 --hidden 64");
  EXPECT_EQ(m.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(m.err, "--hidden needs --machine")) << m.err;
  const Result w = RunCli("calibrate --what collectives --out " + TempPath("absent.json"));
  EXPECT_EQ(w.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(w.err, "does not exist")) << w.err;
}

}  // namespace calibrate

namespace {

// `zeroshard estimate --config` (the GPT example's config.json) is
// --hf-config, and --activations gpt-example reports the example's own
// tensors: in the JSON, summed into each candidate's activations and
// workspace, and in the table in bytes.
TEST(EstimateCliTest, ConfigIsHfConfigAndGptExampleListsTheTrainersTensors) {
  const std::string config = TestData("gpt-example-config.json");
  const std::string run = " --gpus 2 --seq 64 --micro-batch 2 --stage 1 --json";
  const Result hf = RunCli("estimate --hf-config " + config + run);
  const Result alias = RunCli("estimate --config " + config + run);
  ASSERT_EQ(hf.exit_code, 0) << hf.err;
  EXPECT_EQ(alias.exit_code, 0) << alias.err;
  EXPECT_EQ(alias.out, hf.out);
  ExpectOneErrorLine("estimate --config " + config + " --hf-config " + config,
                     "exactly one of --preset, --hf-config (or --config)");

  const Result gpt = RunCli("estimate --config " + config + run + " --activations gpt-example");
  ASSERT_EQ(gpt.exit_code, 0) << gpt.err;
  const nlohmann::json doc = nlohmann::json::parse(gpt.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << gpt.out.substr(0, 400);
  EXPECT_EQ(doc["training"]["activations"], "gpt-example");
  EXPECT_EQ(doc["training"]["recompute"], "none");  // gpt_train's defaults
  EXPECT_EQ(doc["training"]["precision"], "fp32");
  EXPECT_EQ(doc["cluster"]["reserve_bytes"], 0);  // CPU ranks
  EXPECT_EQ(doc["cluster"]["workspace_bytes"], 0);
  ASSERT_TRUE(doc["trainer_tensors"].is_array());
  int64_t activations = 0, workspace = 0;
  for (const auto& t : doc["trainer_tensors"]) {
    (t["category"] == "activations" ? activations : workspace) += t["bytes"].get<int64_t>();
  }
  // 4 layers, n_embd 128, N = 128 rows, 4 heads, V 256, fp32, recompute none:
  // block inputs 5 N C, 4 blocks of N (15 C + 4) + B H T^2, ln_f N C + 2 N,
  // logits N V, tokens 2 N int32; workspace 2 N C + 6 N C + T^2 + the largest
  // unit (a block, 12 C^2 + 13 C) in floats.
  const int64_t n = 128, c = 128;
  EXPECT_EQ(activations, 4 * (5 * n * c + 4 * (n * (15 * c + 4) + 2 * 4 * 64 * 64) + n * c + 2 * n +
                              n * 256 + 2 * n));
  EXPECT_EQ(workspace, 4 * (2 * n * c + 6 * n * c + 64 * 64 + 12 * c * c + 13 * c));
  const auto& chosen = doc["candidates"][doc["chosen"].get<int>()];
  EXPECT_EQ(chosen["per_gpu_bytes"]["activations"].get<int64_t>(), activations);
  // The workspace also holds the engine's own (its norm blocks).
  int64_t engine_workspace = 0;
  for (const auto& b : chosen["buffers"]) {
    if (b["category"] == "workspace") engine_workspace += b["bytes"].get<int64_t>();
  }
  EXPECT_EQ(chosen["per_gpu_bytes"]["workspace"].get<int64_t>(), workspace + engine_workspace);

  const Result table = RunCli("estimate --config " + config +
                              " --gpus 2 --seq 64 --micro-batch 2 --activations gpt-example "
                              "--recompute full");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_TRUE(absl::StrContains(table.out, "recompute full, activations gpt-example")) << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "gpt.block_acts")) << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "bytes per rank:")) << table.out;

  ExpectOneErrorLine("estimate --config " + config + " --activations flash", "--activations");
  ExpectOneErrorLine("estimate --preset llama-2-7b --activations gpt-example",
                     "not a GPT2LMHeadModel");
  ExpectOneErrorLine("estimate --config " + config +
                         " --activations gpt-example --recompute "
                         "selective",
                     "--recompute none or full");
}

// --offload optimizer=host|nvme: the bytes per tier, in the table's tiers
// line and the JSON; the device drops by the optimizer state; the NVMe
// rates price the swap traffic; a bad value names itself and the allowed.
TEST(EstimateCliTest, OffloadOptimizerTiersPrintTheBytesPerTier) {
  const std::string base = "estimate --preset gpt2 --gpus 8 --stage 2 --tp 1 --pp 1 ";
  int64_t device[3], host[3], nvme[3], states = 0;
  double offload_s[3];
  const char* tiers[] = {"none", "optimizer=host", "optimizer=nvme"};
  for (int t = 0; t < 3; ++t) {
    const Result text = RunCli(base + "--offload " + tiers[t]);
    ASSERT_EQ(text.exit_code, 0) << text.err;
    EXPECT_NE(text.out.find("tiers:    per rank: device "), std::string::npos) << text.out;
    // gpt2 fits without offload: a forced tier is said to be forced, not
    // needed.
    if (t > 0) {
      EXPECT_NE(text.out.find("as --offload asks"), std::string::npos) << text.out;
      EXPECT_EQ(text.out.find("sharding alone does not fit"), std::string::npos) << text.out;
    }
    const Result r = RunCli(base + "--offload " + tiers[t] + " --nvme-read-gbps 0.5 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto doc = ParseReport(r);
    const auto& c = doc["candidates"][0];
    EXPECT_EQ(c["offload"], tiers[t]);
    EXPECT_TRUE(c["engine_supported"].get<bool>()) << tiers[t];
    device[t] = c["per_rank_tier_bytes"]["device"].get<int64_t>();
    host[t] = c["per_rank_tier_bytes"]["host"].get<int64_t>();
    nvme[t] = c["per_rank_tier_bytes"]["nvme"].get<int64_t>();
    offload_s[t] = c["step_time_s"]["offload"].get<double>();
    if (t == 0) {
      states = c["per_gpu_bytes"]["master"].get<int64_t>() +
               c["per_gpu_bytes"]["optimizer"].get<int64_t>();
    }
    int64_t listed[3] = {0, 0, 0};
    for (const auto& b : c["buffers"]) {
      const std::string placement = b["placement"];
      listed[placement == "device" ? 0 : placement == "host" ? 1 : 2] += b["bytes"].get<int64_t>();
    }
    EXPECT_EQ(listed[1], host[t]) << tiers[t];
    EXPECT_EQ(listed[2], nvme[t]) << tiers[t];
    EXPECT_EQ(doc["cluster"]["nvme_read_gbps"].get<double>(), 0.5);
  }
  EXPECT_GT(states, 0);
  EXPECT_EQ(device[0] - device[1], states);
  EXPECT_EQ(device[0] - device[2], states);
  EXPECT_EQ(host[0], 0);
  EXPECT_GT(host[1], 0);
  EXPECT_EQ(nvme[1], 0);
  EXPECT_EQ(nvme[2], states);  // master, m and v: the swap files' contents
  EXPECT_EQ(offload_s[0], 0.0);
  EXPECT_GT(offload_s[2], offload_s[1]);

  const Result bad = RunCli(base + "--offload optimizer=tape");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("'tape' is not a tier optimizer may take (device, host, nvme)"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("optimizer=device|host|nvme, grads=device|host, params=device|host"),
            std::string::npos)
      << bad.err;
  const Result unknown = RunCli(base + "--offload moments=host");
  EXPECT_NE(unknown.err.find("unknown state 'moments'"), std::string::npos) << unknown.err;
}

}  // namespace
