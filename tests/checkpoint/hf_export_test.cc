// `zeroshard export CKPT --hf OUTDIR` on a checkpoint of a tiny GPT ModelSpec
// (examples/gpt's units and names, built here by hand) trained with random
// gradients on 2 ranks at stage 3: the directory holds model.safetensors
// under Hugging Face GPT-2's names, each tensor equal to the engine's
// GetParam (fp32 exactly, bf16 rounded), the tied head absent, and
// config.json; a checkpoint without "hf_config", a used directory, a
// damaged checkpoint and foreign units are refused, leaving nothing.
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/command_runner.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

constexpr int64_t kVocab = 24, kWidth = 8, kPositions = 6, kLayers = 2;

ParamSpec Param(const std::string& name, std::vector<int64_t> shape, bool no_decay) {
  ParamSpec p;
  p.name = name;
  p.shape = std::move(shape);
  p.no_decay = no_decay;
  return p;
}

// The GPT trainer's ModelSpec at tiny sizes; `extra_unit` adds a unit no
// GPT-2 name exists for.
ModelSpec TinyGptSpec(bool extra_unit = false) {
  const int64_t c = kWidth;
  ModelSpec spec;
  spec.units.push_back(
      {"embed",
       {Param("wte.weight", {kVocab, c}, true), Param("wpe.weight", {kPositions, c}, true)}});
  for (int i = 0; i < kLayers; ++i) {
    spec.units.push_back(
        {absl::StrCat("h.", i),
         {Param("ln_1.weight", {c}, true), Param("ln_1.bias", {c}, true),
          Param("attn.c_attn.weight", {c, 3 * c}, false), Param("attn.c_attn.bias", {3 * c}, true),
          Param("attn.c_proj.weight", {c, c}, false), Param("attn.c_proj.bias", {c}, true),
          Param("ln_2.weight", {c}, true), Param("ln_2.bias", {c}, true),
          Param("mlp.c_fc.weight", {c, 4 * c}, false), Param("mlp.c_fc.bias", {4 * c}, true),
          Param("mlp.c_proj.weight", {4 * c, c}, false), Param("mlp.c_proj.bias", {c}, true)}});
  }
  spec.units.push_back(
      {"final_norm", {Param("ln_f.weight", {c}, true), Param("ln_f.bias", {c}, true)}});
  if (extra_unit) spec.units.push_back({"value_head", {Param("weight", {c}, true)}});
  ParamSpec head = Param("lm_head.weight", {kVocab, c}, true);
  head.tied_to = ParamRef{"embed", "wte.weight"};
  spec.units.push_back({"lm_head", {head}});
  return spec;
}

const char kHfConfig[] =
    R"({"n_layer": 2, "n_head": 2, "n_embd": 8, "n_positions": 6, "vocab_size": 24,
        "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new"})";

std::string HfName(const std::string& unit, const std::string& param) {
  if (unit == "lm_head") return param;
  if (absl::StartsWith(unit, "h.")) return absl::StrCat("transformer.", unit, ".", param);
  return absl::StrCat("transformer.", param);
}

class HfExportTest : public ScratchDirTest {
 protected:
  CommandResult Run(const std::string& args) const {
    return RunCommand("timeout 60 " + std::string(ZS_BINARY) + " " + args);
  }

  // Random weights and 3 steps of random gradients on 2 ranks (stage 3),
  // saved into `root` with `trainer_state`; returns GetParam of every param
  // ([unit][param], the alias's too).
  std::vector<std::vector<std::vector<float>>> Train(const ModelSpec& spec, const std::string& root,
                                                     const std::string& trainer_state) {
    RunConfig run;
    run.world = 2;
    run.stage = 3;
    const TrainSpec train = MakeTrainSpec(run);
    std::vector<std::vector<std::vector<float>>> params;
    std::mutex mu;
    const uint64_t seed = Seed();
    absl::Status status = RunLocalRanks(2, [&](int rank, Communicator& comm) -> absl::Status {
      auto device = CreateCpuDevice();
      ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
      std::mt19937_64 init_rng(seed);  // the same initial weights on every rank
      std::normal_distribution<float> normal(0.0f, 0.5f);
      for (size_t u = 0; u < spec.units.size(); ++u) {
        for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
          if (spec.units[u].params[p].tied_to.has_value()) continue;
          std::vector<float> v(static_cast<size_t>(spec.units[u].params[p].NumElements()));
          for (float& x : v) x = normal(init_rng);
          ZS_RETURN_IF_ERROR(engine->SetParam(static_cast<int>(u), static_cast<int>(p), v));
        }
      }
      ZS_RETURN_IF_ERROR(engine->Start());
      std::mt19937_64 grad_rng(seed + 1 + static_cast<uint64_t>(rank));
      const int units = static_cast<int>(spec.units.size());
      for (int step = 0; step < 3; ++step) {
        for (int u = 0; u < units; ++u) {
          ZS_RETURN_IF_ERROR(engine->Gather(u).status());
          ZS_RETURN_IF_ERROR(engine->Release(u));
        }
        for (int u = units - 1; u >= 0; --u) {
          ZS_RETURN_IF_ERROR(engine->Gather(u).status());
          ZS_ASSIGN_OR_RETURN(UnitView grads, engine->GradView(u));
          for (const TensorView& g : grads.params) {
            for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = normal(grad_rng);
          }
          ZS_RETURN_IF_ERROR(engine->ReduceGrads(u));
          ZS_RETURN_IF_ERROR(engine->Release(u));
        }
        ZS_RETURN_IF_ERROR(engine->Step().status());
      }
      ZS_RETURN_IF_ERROR(engine->Save(root, trainer_state));
      ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
      std::vector<std::vector<std::vector<float>>> mine(spec.units.size());
      for (size_t u = 0; u < spec.units.size(); ++u) {
        for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
          ZS_ASSIGN_OR_RETURN(auto values,
                              engine->GetParam(static_cast<int>(u), static_cast<int>(p)));
          mine[u].push_back(std::move(values));
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

  // Names of the entries of the scratch directory that are not in `known`.
  std::vector<std::string> Leftovers(const std::vector<std::string>& known) const {
    std::vector<std::string> left;
    for (const std::string& e : Entries(dir_)) {
      if (std::find(known.begin(), known.end(), e) == known.end()) left.push_back(e);
    }
    return left;
  }
};

TEST_F(HfExportTest, WritesHuggingFaceNamesAndConfigEqualToTheEngine) {
  const ModelSpec spec = TinyGptSpec();
  const std::string root = Sub("ckpt");
  const auto params =
      Train(spec, root, absl::StrCat(R"({"sampler": {"next": 4}, "hf_config": )", kHfConfig, "}"));
  ASSERT_EQ(params.size(), spec.units.size());

  for (const std::string dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype + " " + SeedTrace());
    const std::string out = Sub("hf_" + dtype);
    CommandResult r = Run(absl::StrFormat("export %s --hf %s --dtype %s", root, out, dtype));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(absl::StrContains(r.out, out + "/model.safetensors and config.json")) << r.out;
    EXPECT_EQ(Entries(out), (std::vector<std::string>{"config.json", "model.safetensors"}));

    absl::StatusOr<std::string> file = ReadTestFile(out + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    auto index = internal::ParseSafetensorsHeader(*file, static_cast<int64_t>(file->size()));
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(index->metadata["format"], "pt");
    std::map<std::string, const internal::SafetensorsEntry*> by_name;
    for (const internal::SafetensorsEntry& e : index->tensors) by_name[e.name] = &e;
    size_t expected_tensors = 0;
    for (size_t u = 0; u < spec.units.size(); ++u) {
      for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
        const ParamSpec& param = spec.units[u].params[p];
        const std::string name = HfName(spec.units[u].name, param.name);
        if (param.tied_to.has_value()) {
          EXPECT_EQ(by_name.count(name), 0u) << name << ": the tied alias was written";
          continue;
        }
        ++expected_tensors;
        ASSERT_EQ(by_name.count(name), 1u) << name << " missing";
        const internal::SafetensorsEntry& e = *by_name[name];
        EXPECT_EQ(e.shape, param.shape) << name;
        EXPECT_EQ(e.dtype, dtype == "fp32" ? "F32" : "BF16") << name;
        const std::vector<float>& want = params[u][p];
        const char* data = file->data() + index->data_start + e.begin;
        for (size_t i = 0; i < want.size(); ++i) {
          float got;
          if (dtype == "fp32") {
            std::memcpy(&got, data + 4 * i, 4);
            ASSERT_EQ(got, want[i]) << name << "[" << i << "]";
          } else {
            uint16_t h;
            std::memcpy(&h, data + 2 * i, 2);
            ASSERT_EQ(h, Fp32ToBf16(want[i])) << name << "[" << i << "]";
          }
        }
      }
    }
    EXPECT_EQ(index->tensors.size(), expected_tensors);
    // The alias is its owner: GetParam agrees.
    EXPECT_EQ(params.back()[0], params[0][0]);

    nlohmann::json config = nlohmann::json::parse(ReadText(out + "/config.json"));
    EXPECT_EQ(config["n_layer"], 2);
    EXPECT_EQ(config["n_embd"], 8);
    EXPECT_EQ(config["vocab_size"], 24);
    EXPECT_EQ(config["layer_norm_epsilon"], 1e-5);
    EXPECT_EQ(config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
    EXPECT_EQ(config["model_type"], "gpt2");
    EXPECT_EQ(config["tie_word_embeddings"], true);
    for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
      EXPECT_EQ(config[key], 0.0) << key;
    }
    EXPECT_EQ(config["torch_dtype"], dtype == "fp32" ? "float32" : "bfloat16");
  }
  EXPECT_EQ(Leftovers({"ckpt", "hf_fp32", "hf_bf16"}), std::vector<std::string>{});

  // A used directory is refused before anything is read; an empty one is
  // filled.
  CommandResult used = Run(absl::StrFormat("export %s --hf %s", root, Sub("hf_fp32")));
  EXPECT_EQ(used.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(used.err, "exists and is not empty")) << used.err;
  ASSERT_EQ(mkdir(Sub("empty").c_str(), 0755), 0);
  CommandResult empty = Run(absl::StrFormat("export %s --hf %s", root, Sub("empty")));
  EXPECT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_EQ(Entries(Sub("empty")), (std::vector<std::string>{"config.json", "model.safetensors"}));

  // Inside the checkpoint directory: refused.
  CommandResult inside = Run(absl::StrFormat("export %s --hf %s/hf", root, root));
  EXPECT_EQ(inside.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(inside.err, "inside the checkpoint directory")) << inside.err;

  // --out and --hf together: refused.
  CommandResult both = Run(absl::StrFormat("export %s --hf %s --out %s", root, Sub("x"), Sub("y")));
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(both.err, "not both")) << both.err;

  // A damaged checkpoint: the export fails while writing and leaves no
  // directory and no temporary.
  const std::string step = root + "/step_00000003";
  {
    // A byte of block h.0's master weights (tensor 0) in rank 0's shard.
    auto manifest = internal::ReadManifest(step);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    const int64_t offset = internal::TensorOffset(manifest->shard_numel, 1, 0) + 5;
    FILE* f = std::fopen((step + "/rank_00000.bin").c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(offset), SEEK_SET);
    const int byte = std::fgetc(f);
    std::fseek(f, static_cast<long>(offset), SEEK_SET);
    std::fputc(byte ^ 0x10, f);
    std::fclose(f);
  }
  CommandResult damaged = Run(absl::StrFormat("export %s --hf %s", root, Sub("hf_damaged")));
  EXPECT_EQ(damaged.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(damaged.err, "rank_00000.bin")) << damaged.err;
  EXPECT_EQ(Leftovers({"ckpt", "hf_fp32", "hf_bf16", "empty"}), std::vector<std::string>{});
}

TEST_F(HfExportTest, RefusesACheckpointWithoutHfConfigOrWithForeignUnits) {
  const std::string plain = Sub("plain");
  Train(TinyGptSpec(), plain, R"({"sampler": {"next": 4}})");
  CommandResult r = Run(absl::StrFormat("export %s --hf %s", plain, Sub("out")));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "no \"hf_config\" in its trainer state")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "--out FILE")) << r.err;

  const std::string foreign = Sub("foreign");
  Train(TinyGptSpec(/*extra_unit=*/true), foreign,
        absl::StrCat(R"({"hf_config": )", kHfConfig, "}"));
  CommandResult f = Run(absl::StrFormat("export %s --hf %s", foreign, Sub("out")));
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(f.err, "unit 'value_head'")) << f.err;

  const std::string partial = Sub("partial");
  Train(TinyGptSpec(), partial, R"({"hf_config": {"n_layer": 2}})");
  CommandResult p = Run(absl::StrFormat("export %s --hf %s", partial, Sub("out")));
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(p.err, "lacks the integer \"n_head\"")) << p.err;
  EXPECT_EQ(Leftovers({"plain", "foreign", "partial"}), std::vector<std::string>{});
}

}  // namespace
}  // namespace zeroshard::testing
