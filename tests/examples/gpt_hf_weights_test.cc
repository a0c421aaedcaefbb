// examples/gpt/hf_weights: the GPT model's weights written as a Hugging Face
// directory and read back (fp32 exactly, bf16 rounded), and files as other
// writers make them (no "transformer." prefix, F16, lm_head stored, mask
// buffers) read or refused with the tensor named. Fresh random values.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "examples/gpt/hf_weights.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"

namespace zeroshard::gpt {
namespace {

namespace fs = std::filesystem;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

constexpr int64_t kVocab = 20, kWidth = 8, kPositions = 5, kLayers = 2;

ParamSpec Param(const std::string& name, std::vector<int64_t> shape) {
  ParamSpec p;
  p.name = name;
  p.shape = std::move(shape);
  return p;
}

ModelSpec TinyGptSpec() {
  const int64_t c = kWidth;
  ModelSpec spec;
  spec.units.push_back(
      {"embed", {Param("wte.weight", {kVocab, c}), Param("wpe.weight", {kPositions, c})}});
  for (int i = 0; i < kLayers; ++i) {
    spec.units.push_back(
        {absl::StrCat("h.", i),
         {Param("ln_1.weight", {c}), Param("ln_1.bias", {c}),
          Param("attn.c_attn.weight", {c, 3 * c}), Param("attn.c_attn.bias", {3 * c}),
          Param("attn.c_proj.weight", {c, c}), Param("attn.c_proj.bias", {c}),
          Param("ln_2.weight", {c}), Param("ln_2.bias", {c}), Param("mlp.c_fc.weight", {c, 4 * c}),
          Param("mlp.c_fc.bias", {4 * c}), Param("mlp.c_proj.weight", {4 * c, c}),
          Param("mlp.c_proj.bias", {c})}});
  }
  spec.units.push_back({"final_norm", {Param("ln_f.weight", {c}), Param("ln_f.bias", {c})}});
  ParamSpec head = Param("lm_head.weight", {kVocab, c});
  head.tied_to = ParamRef{"embed", "wte.weight"};
  spec.units.push_back({"lm_head", {head}});
  return spec;
}

ParamValues RandomValues(const ModelSpec& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  ParamValues v(spec.units.size());
  for (size_t u = 0; u < spec.units.size(); ++u) {
    for (const ParamSpec& p : spec.units[u].params) {
      v[u].emplace_back();
      if (p.tied_to.has_value()) continue;
      v[u].back().resize(static_cast<size_t>(p.NumElements()));
      for (float& x : v[u].back()) x = normal(rng);
    }
  }
  return v;
}

const char kConfig[] =
    R"({"n_layer": 2, "n_head": 2, "n_embd": 8, "n_positions": 5, "vocab_size": 20,
        "layer_norm_epsilon": 1e-05})";

// One tensor of a hand-made safetensors file.
struct RawTensor {
  std::string name;
  std::string dtype;  // F32, F16, BF16, F64
  std::vector<int64_t> shape;
  std::vector<float> values;
};

void WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const RawTensor& t : tensors) {
    const size_t begin = data.size();
    for (float x : t.values) {
      if (t.dtype == "F32") {
        data.append(reinterpret_cast<const char*>(&x), 4);
      } else if (t.dtype == "F64") {
        const double d = x;
        data.append(reinterpret_cast<const char*>(&d), 8);
      } else {
        const uint16_t h = t.dtype == "F16" ? Fp32ToFp16(x) : Fp32ToBf16(x);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string text = header.dump();
  uint64_t n = text.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text << data;
}

class GptHfWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zs_gpt_hf_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<std::string> Entries(const std::string& d) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  // The model's tensors as a GPT2LMHeadModel state dict would hold them,
  // each value rounded to `dtype`'s precision when 16-bit.
  std::vector<RawTensor> HfTensors(const ModelSpec& spec, const ParamValues& v,
                                   const std::string& dtype, bool prefix) const {
    std::vector<RawTensor> out;
    for (size_t u = 0; u < spec.units.size(); ++u) {
      for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
        if (spec.units[u].params[p].tied_to.has_value()) continue;
        std::string name = *HfGpt2Name(spec.units[u].name, spec.units[u].params[p].name);
        if (!prefix) name = name.substr(std::strlen("transformer."));
        out.push_back({name, dtype, spec.units[u].params[p].shape, v[u][p]});
      }
    }
    return out;
  }
  std::string dir_;
};

TEST_F(GptHfWeightsTest, WriteThenReadRoundTripsFp32ExactlyAndBf16Rounded) {
  SCOPED_TRACE(SeedTrace());
  const ModelSpec spec = TinyGptSpec();
  const ParamValues values = RandomValues(spec, Seed());
  const std::string fp32 = dir_ + "/fp32";
  ASSERT_TRUE(WriteHfGpt2Dir(fp32, spec, values, kConfig).ok());
  EXPECT_EQ(Entries(fp32), (std::vector<std::string>{"config.json", "model.safetensors"}));
  absl::StatusOr<ParamValues> back = ReadHfGpt2Weights(fp32, spec);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, values);  // bitwise (no NaN among them); the alias's entry empty
  EXPECT_TRUE(back->back()[0].empty());

  std::ifstream config_file(fp32 + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config["n_embd"], 8);
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["resid_pdrop"], 0.0);
  EXPECT_EQ(config["embd_pdrop"], 0.0);
  EXPECT_EQ(config["attn_pdrop"], 0.0);

  const std::string bf16 = dir_ + "/bf16";
  ASSERT_TRUE(WriteHfGpt2Dir(bf16, spec, values, kConfig, DType::kBFloat16).ok());
  back = ReadHfGpt2Weights(bf16, spec);
  ASSERT_TRUE(back.ok()) << back.status();
  for (size_t u = 0; u < spec.units.size(); ++u) {
    for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
      ASSERT_EQ((*back)[u][p].size(), values[u][p].size());
      for (size_t i = 0; i < values[u][p].size(); ++i) {
        ASSERT_EQ((*back)[u][p][i], Bf16ToFp32(Fp32ToBf16(values[u][p][i])))
            << spec.units[u].name << "." << spec.units[u].params[p].name << "[" << i << "]";
      }
    }
  }
  // The config check: the run's own config passes, another n_head or
  // epsilon is refused by name, a directory without config.json is refused
  // (the weights' shapes alone do not show n_head or the epsilon).
  const auto run_config = [](const std::string& edit) {
    nlohmann::json j = nlohmann::json::parse(kConfig);
    j["architectures"] = {"GPT2LMHeadModel"};
    j.update(nlohmann::json::parse(edit));
    absl::StatusOr<GptConfig> cfg = ParseGptConfig(j.dump(), "run.json");
    EXPECT_TRUE(cfg.ok()) << cfg.status();
    return *cfg;
  };
  EXPECT_TRUE(CheckHfGpt2Config(fp32, run_config("{}"), "run.json").ok());
  absl::Status other = CheckHfGpt2Config(fp32, run_config(R"({"n_head": 4})"), "run.json");
  EXPECT_TRUE(absl::StrContains(other.message(), "n_head is 2 there and 4 in the run's config"))
      << other;
  other = CheckHfGpt2Config(fp32, run_config(R"({"layer_norm_epsilon": 1e-06})"), "run.json");
  EXPECT_TRUE(absl::StrContains(other.message(), "layer_norm_epsilon is 1e-05 there")) << other;
  other = CheckHfGpt2Config(dir_, run_config(R"({"n_head": 1})"), "run.json");
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  EXPECT_TRUE(absl::StrContains(other.message(), "has no config.json")) << other;

  // bf16 halves the data.
  EXPECT_LT(fs::file_size(bf16 + "/model.safetensors"), fs::file_size(fp32 + "/model.safetensors"));
}

// --init-from and --save-init through an engine: the values read set every
// param (the tied head reads wte), and GetEngineParams gives them back, at
// stage 3 on 2 ranks (sharded: GetParam gathers).
TEST_F(GptHfWeightsTest, EngineParamsRoundTripThroughTheDirectory) {
  SCOPED_TRACE(SeedTrace());
  const ModelSpec spec = TinyGptSpec();
  const ParamValues values = RandomValues(spec, Seed() + 3);
  ASSERT_TRUE(WriteHfGpt2Dir(dir_ + "/init", spec, values, kConfig).ok());
  TrainSpec train;
  train.zero_stage = 3;
  std::vector<ParamValues> got(2);
  absl::Status status = RunLocalRanks(2, [&](int rank, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(spec, train, *device, comm);
    if (!engine.ok()) return engine.status();
    absl::StatusOr<ParamValues> read = ReadHfGpt2Weights(dir_ + "/init", spec);
    if (!read.ok()) return read.status();
    absl::Status s = SetEngineParams(**engine, *read);
    if (!s.ok()) return s;
    s = (*engine)->Start();
    if (!s.ok()) return s;
    absl::StatusOr<ParamValues> back = GetEngineParams(**engine);
    if (!back.ok()) return back.status();
    got[rank] = *std::move(back);
    // The tied head is wte.
    absl::StatusOr<std::vector<float>> head =
        (*engine)->GetParam(static_cast<int>(spec.units.size()) - 1, 0);
    if (!head.ok()) return head.status();
    if (*head != values[0][0]) return absl::InternalError("the head is not wte");
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(got[0], values);
  EXPECT_EQ(got[1], values);

  ParamValues missing_unit = values;
  missing_unit.pop_back();
  TrainSpec one;
  status = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(spec, one, *device, comm);
    if (!engine.ok()) return engine.status();
    return SetEngineParams(**engine, missing_unit);
  });
  EXPECT_TRUE(absl::StrContains(status.message(), "4 units of values for a model of 5")) << status;
}

TEST_F(GptHfWeightsTest, ReadsOtherWritersFilesAndRefusesMismatchesByName) {
  SCOPED_TRACE(SeedTrace());
  const ModelSpec spec = TinyGptSpec();
  const ParamValues values = RandomValues(spec, Seed() + 7);
  const std::string file = dir_ + "/model.safetensors";

  // GPT2Model's names (no prefix), F16, lm_head.weight stored and equal to
  // wte, the mask buffers of older files: read.
  std::vector<RawTensor> t = HfTensors(spec, values, "F16", /*prefix=*/false);
  t.push_back({"lm_head.weight", "F16", {kVocab, kWidth}, values[0][0]});
  t.push_back({"h.0.attn.bias",
               "F32",
               {1, 1, kPositions, kPositions},
               std::vector<float>(kPositions * kPositions, 1.0f)});
  t.push_back({"h.1.attn.masked_bias", "F32", {}, {-1e4f}});
  WriteSafetensors(file, t);
  absl::StatusOr<ParamValues> back = ReadHfGpt2Weights(dir_, spec);
  ASSERT_TRUE(back.ok()) << back.status();
  for (size_t u = 0; u + 1 < spec.units.size(); ++u) {
    for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
      for (size_t i = 0; i < values[u][p].size(); ++i) {
        ASSERT_EQ((*back)[u][p][i], Fp16ToFp32(Fp32ToFp16(values[u][p][i])));
      }
    }
  }

  auto refused = [&](std::vector<RawTensor> tensors, const std::string& words) {
    fs::remove(file);
    WriteSafetensors(file, tensors);
    absl::StatusOr<ParamValues> r = ReadHfGpt2Weights(file, spec);
    ASSERT_FALSE(r.ok()) << words;
    EXPECT_TRUE(absl::StrContains(r.status().message(), words)) << r.status();
  };
  const std::vector<RawTensor> good = HfTensors(spec, values, "F32", /*prefix=*/true);
  {
    std::vector<RawTensor> bad = good;  // an untied head
    std::vector<float> head = values[0][0];
    head[3] += 0.5f;
    bad.push_back({"lm_head.weight", "F32", {kVocab, kWidth}, head});
    refused(bad, "lm_head.weight differs from transformer.wte.weight (element 3");
  }
  {
    std::vector<RawTensor> bad = good;
    bad.erase(bad.begin() + 5);  // a block param
    refused(bad, "no tensor for '" + good[5].name + "'");
  }
  {
    std::vector<RawTensor> bad = good;
    bad.push_back({"transformer.h.2.ln_1.weight", "F32", {kWidth}, values[1][0]});
    refused(bad, "unexpected tensor 'transformer.h.2.ln_1.weight'");
  }
  {
    std::vector<RawTensor> bad = good;
    bad[1].shape = {kPositions * kWidth};  // wpe flattened
    refused(bad, "'transformer.wpe.weight' has shape [40] where the model's is [5, 8]");
  }
  {
    std::vector<RawTensor> bad = good;
    bad[2].dtype = "F64";
    refused(bad, "'" + good[2].name + "' has dtype F64");
  }
  {
    std::vector<RawTensor> bad = good;
    RawTensor dup = bad[0];
    dup.name = "wte.weight";
    bad.push_back(dup);
    refused(bad, "name the same param");
  }
  // Damaged: data_offsets past the file.
  WriteSafetensors(file, good);
  fs::resize_file(file, fs::file_size(file) - 4);
  absl::StatusOr<ParamValues> cut = ReadHfGpt2Weights(file, spec);
  ASSERT_FALSE(cut.ok());
  EXPECT_TRUE(absl::StrContains(cut.status().message(), "damaged")) << cut.status();
  absl::StatusOr<ParamValues> none = ReadHfGpt2Weights(dir_ + "/nowhere", spec);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(GptHfWeightsTest, WriteRefusesWrongValuesAndUsedDirectoriesLeavingNothing) {
  const ModelSpec spec = TinyGptSpec();
  ParamValues values = RandomValues(spec, Seed() + 13);
  ParamValues short_values = values;
  short_values[1][2].pop_back();
  absl::Status s = WriteHfGpt2Dir(dir_ + "/a", spec, short_values, kConfig);
  EXPECT_TRUE(absl::StrContains(s.message(), "h.0.attn.c_attn.weight has 191 values")) << s;
  ParamValues wrong_alias = values;
  wrong_alias.back()[0] = values[0][0];
  wrong_alias.back()[0][0] += 1.0f;
  s = WriteHfGpt2Dir(dir_ + "/a", spec, wrong_alias, kConfig);
  EXPECT_TRUE(absl::StrContains(s.message(), "tied to embed.wte.weight but its values differ"))
      << s;
  s = WriteHfGpt2Dir(dir_ + "/a", spec, values, "[1, 2]");
  EXPECT_TRUE(absl::StrContains(s.message(), "not a JSON object")) << s;
  EXPECT_EQ(Entries(dir_), std::vector<std::string>{});

  ASSERT_TRUE(WriteHfGpt2Dir(dir_ + "/a", spec, values, kConfig).ok());
  s = WriteHfGpt2Dir(dir_ + "/a", spec, values, kConfig);
  EXPECT_TRUE(absl::StrContains(s.message(), "exists and is not an empty directory")) << s;
  EXPECT_EQ(Entries(dir_), std::vector<std::string>{"a"});
}

}  // namespace
}  // namespace zeroshard::gpt
