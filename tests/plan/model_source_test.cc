// Exact parameter counts from presets, config.json files, JSON specs and
// bare counts; clear errors for bad input.
#include "zeroshard/estimate/model_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_seed.h"
#include "zeroshard/estimate/byte_units.h"

namespace zeroshard {
namespace {

std::string TestData(const std::string& name) { return std::string(ZS_PLAN_TESTDATA) + "/" + name; }

int64_t PresetParams(const std::string& name) {
  auto model = ModelFromPreset(name);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? model->spec.NumStoredParams() : -1;
}

const ParamSpec* FindParam(const ModelSpec& spec, const std::string& unit,
                           const std::string& param) {
  for (const UnitSpec& u : spec.units) {
    if (u.name != unit) continue;
    for (const ParamSpec& p : u.params) {
      if (p.name == param) return &p;
    }
  }
  return nullptr;
}

TEST(ModelSourceTest, PresetParamCountsAreExact) {
  EXPECT_EQ(PresetParams("llama-2-7b"), 6738415616);
  EXPECT_EQ(PresetParams("gpt2"), 124439808);  // tied embeddings
  EXPECT_EQ(PresetParams("llama-3-8b"), 8030261248);
  // Published counts of the Hugging Face checkpoints.
  EXPECT_EQ(PresetParams("gpt2-medium"), 354823168);
  EXPECT_EQ(PresetParams("gpt2-large"), 774030080);
  EXPECT_EQ(PresetParams("gpt2-xl"), 1557611200);
  EXPECT_EQ(PresetParams("llama-2-13b"), 13015864320);
  EXPECT_EQ(PresetParams("llama-2-70b"), 68976648192);
  EXPECT_EQ(PresetParams("llama-3-70b"), 70553706496);
  EXPECT_EQ(PresetParams("mistral-7b"), 7241732096);
  EXPECT_EQ(PresetParams("qwen2-7b"), 7615616512);   // q/k/v biases
  EXPECT_EQ(PresetParams("qwen2-0.5b"), 494032768);  // q/k/v biases, tied
  // GPT-3 175B: 96 GPT-2 layers of 12 h^2 + 13 h, h = 12288, 2048 positions.
  const int64_t h = 12288;
  EXPECT_EQ(PresetParams("gpt3-175b"), 96 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h);
}

TEST(ModelSourceTest, UnitsAreLayersWithRealNamesAndShapes) {
  auto llama = ModelFromPreset("llama-3-70b");
  ASSERT_TRUE(llama.ok());
  // embed + 80 layers + final norm + head.
  ASSERT_EQ(llama->spec.units.size(), 83u);
  EXPECT_EQ(llama->spec.units[0].name, "embed");
  EXPECT_EQ(llama->spec.units[1].name, "layers.0");
  EXPECT_EQ(llama->spec.units[82].name, "lm_head");
  EXPECT_EQ(llama->first_layer_unit, 1);
  EXPECT_EQ(llama->num_layer_units, 80);
  // Grouped-query attention: 8 key/value heads of 128.
  const ParamSpec* k = FindParam(llama->spec, "layers.5", "self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{1024, 8192}));
  EXPECT_EQ(FindParam(llama->spec, "layers.5", "self_attn.q_proj.bias"), nullptr);
  const ParamSpec* norm = FindParam(llama->spec, "layers.5", "input_layernorm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_TRUE(norm->no_decay);
  EXPECT_TRUE(llama->spec.Validate().ok());

  auto gpt2 = ModelFromPreset("gpt2");
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ(gpt2->spec.units.size(), 15u);  // tied: lm_head holds an alias of wte
  const ParamSpec* head = FindParam(gpt2->spec, "lm_head", "lm_head.weight");
  ASSERT_NE(head, nullptr);
  ASSERT_TRUE(head->tied_to.has_value());
  EXPECT_EQ(head->tied_to->unit, "embed");
  EXPECT_EQ(head->tied_to->param, "wte.weight");
  EXPECT_NE(FindParam(gpt2->spec, "embed", "wpe.weight"), nullptr);
  EXPECT_NE(FindParam(gpt2->spec, "h.3", "attn.c_attn.bias"), nullptr);
  EXPECT_NE(FindParam(gpt2->spec, "h.3", "ln_1.bias"), nullptr);
  EXPECT_NE(FindParam(gpt2->spec, "final_norm", "ln_f.bias"), nullptr);

  auto qwen = ModelFromPreset("qwen2-7b");
  ASSERT_TRUE(qwen.ok());
  EXPECT_NE(FindParam(qwen->spec, "layers.0", "self_attn.k_proj.bias"), nullptr);
  EXPECT_EQ(FindParam(qwen->spec, "layers.0", "self_attn.o_proj.bias"), nullptr);
}

TEST(ModelSourceTest, BuildingTheLargestPresetsIsFast) {
  const auto begin = std::chrono::steady_clock::now();
  for (const std::string& name : PresetNames()) ASSERT_TRUE(ModelFromPreset(name).ok()) << name;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_LT(seconds, 0.5);
}

TEST(ModelSourceTest, HfConfigFilesGiveTheSameCounts) {
  for (const auto& [file, expected] :
       std::vector<std::pair<std::string, int64_t>>{{"llama-2-7b-config.json", 6738415616},
                                                    {"gpt2-config.json", 124439808},
                                                    {"llama-3-8b-config.json", 8030261248}}) {
    auto text = ReadTextFile(TestData(file));
    ASSERT_TRUE(text.ok()) << text.status();
    auto model = ModelFromHfConfig(*text, file);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->spec.NumStoredParams(), expected) << file;
  }
  auto text = ReadTextFile(TestData("gpt2-config.json"));
  ASSERT_TRUE(text.ok());
  auto shape = ParseHfConfig(*text, "gpt2-config.json");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->intermediate, 4 * 768);  // "n_inner": null
  EXPECT_TRUE(shape->tied_embeddings);
  EXPECT_TRUE(shape->dropout);
}

TEST(ModelSourceTest, TieWordEmbeddingsIsHonoured) {
  const char* config = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 1000, "tie_word_embeddings": %s})";
  char tied[512], untied[512];
  std::snprintf(tied, sizeof(tied), config, "true");
  std::snprintf(untied, sizeof(untied), config, "false");
  auto a = ModelFromHfConfig(tied, "tied");
  auto b = ModelFromHfConfig(untied, "untied");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->spec.NumStoredParams() - a->spec.NumStoredParams(), 1000 * 64);
  // Tied, the head is an alias: NumParams (every use) is the untied count.
  EXPECT_EQ(a->spec.NumParams(), b->spec.NumParams());
}

void ExpectError(const absl::Status& status, const std::string& needle) {
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), needle)) << status.message();
}

TEST(ModelSourceTest, BadConfigsAreRefusedWithTheFileAndField) {
  for (const auto& [file, needle] : std::vector<std::pair<std::string, std::string>>{
           {"malformed-config.json", "not valid JSON"},
           {"bad-field-config.json", "'hidden_size'"},
           {"unsupported-config.json", "T5ForConditionalGeneration"}}) {
    auto text = ReadTextFile(TestData(file));
    ASSERT_TRUE(text.ok());
    auto model = ModelFromHfConfig(*text, file);
    ExpectError(model.status(), needle);
    ExpectError(model.status(), file);
  }
  ExpectError(ReadTextFile(TestData("no-such-file.json")).status(), "no-such-file.json");
  ExpectError(ModelFromPreset("llama-9-1t").status(), "llama-2-7b");  // lists the presets
  ExpectError(ModelFromHfConfig(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 3,
      "num_hidden_layers": 2, "vocab_size": 10})",
                                "gqa.json")
                  .status(),
              "do not divide");
}

// ReadTextFile reads regular files only, up to kMaxTextFileBytes: a FIFO
// (which would block the reader) and /dev/zero (which never ends) are
// refused before a byte is read, and every message names the path.
TEST(ModelSourceTest, ReadTextFileRefusesFifosDevicesAndFilesOverTheCap) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp");
  const std::string fifo = dir + "/zs_model_source_test_fifo.json";
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << fifo;
  absl::StatusOr<std::string> text = ReadTextFile(fifo, "the --spec file");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition) << text.status();
  ExpectError(text.status(), fifo + ": a FIFO (named pipe), where the --spec file must be a");
  std::remove(fifo.c_str());

  text = ReadTextFile("/dev/zero", "the --hf-config file");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition) << text.status();
  ExpectError(text.status(), "/dev/zero: a character device");

  const std::string big = dir + "/zs_model_source_test_big.json";
  { std::ofstream(big) << "{}"; }
  ASSERT_EQ(truncate(big.c_str(), kMaxTextFileBytes + 1), 0);  // sparse: no disk used
  text = ReadTextFile(big, "the --machine profile");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kOutOfRange) << text.status();
  ExpectError(text.status(), absl::StrCat(big, ": ", kMaxTextFileBytes + 1,
                                          " bytes, but the --machine profile is at most ",
                                          kMaxTextFileBytes, " bytes"));
  ASSERT_EQ(truncate(big.c_str(), kMaxTextFileBytes), 0);  // at the cap: read
  text = ReadTextFile(big);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(static_cast<int64_t>(text->size()), kMaxTextFileBytes);
  std::remove(big.c_str());

  const absl::Status missing =
      ReadTextFile(dir + "/zs_no_such_file.json", "the --spec file").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  ExpectError(missing, "zs_no_such_file.json");
  ExpectError(missing, "check the path of the --spec file");
}

// A random JSON value that is not a string: numbers, booleans, null, lists
// and objects, which may hold long strings with control characters.
nlohmann::json RandomNonString(std::mt19937_64& rng, int depth) {
  auto text = [&](size_t max_len) {
    std::string t(std::uniform_int_distribution<size_t>(0, max_len)(rng), ' ');
    for (char& c : t) c = static_cast<char>(std::uniform_int_distribution<int>(1, 127)(rng));
    return t;
  };
  switch (std::uniform_int_distribution<int>(0, depth > 0 ? 5 : 3)(rng)) {
    case 0:
      return std::uniform_int_distribution<int64_t>(INT64_MIN, INT64_MAX)(rng);
    case 1:
      return std::uniform_real_distribution<double>(-1e300, 1e300)(rng);
    case 2:
      return static_cast<bool>(rng() & 1);
    case 3:
      return nullptr;
    case 4: {
      nlohmann::json list = nlohmann::json::array({text(500)});
      for (int i = 0; i < 3; ++i) list.push_back(RandomNonString(rng, depth - 1));
      return list;
    }
    default:
      return nlohmann::json{{text(20), text(500)}, {"x", RandomNonString(rng, depth - 1)}};
  }
}

// "architectures" or "model_type" given with the wrong type is named with
// its value, quoted short; it used to be reported as "neither is given".
TEST(ModelSourceTest, ArchitectureFieldsOfTheWrongTypeAreNamed) {
  const nlohmann::json shape = {{"hidden_size", 64},
                                {"intermediate_size", 128},
                                {"num_attention_heads", 4},
                                {"num_hidden_layers", 2},
                                {"vocab_size", 1000}};
  auto parse = [&](const nlohmann::json& fields) {
    nlohmann::json config = shape;
    config.update(fields);
    return ParseHfConfig(config.dump(), "cfg.json").status();
  };
  using nlohmann::json;
  ExpectError(parse({{"architectures", {5}}}),
              "cfg.json: architectures[0] is '5', not a string; it must name the model class");
  // A malformed "architectures" is not silently replaced by model_type.
  ExpectError(parse({{"architectures", {5}}, {"model_type", "llama"}}), "architectures[0] is '5'");
  ExpectError(parse({{"architectures", "LlamaForCausalLM"}}),
              "cfg.json: 'architectures' is '\\\"LlamaForCausalLM\\\"', not a list");
  ExpectError(parse({{"model_type", 7}}), "cfg.json: 'model_type' is '7', not a string");
  ExpectError(parse(json::object()), "neither 'architectures' nor 'model_type' is given");
  // null or an empty list is "not given": model_type decides.
  EXPECT_TRUE(parse({{"architectures", nullptr}, {"model_type", "llama"}}).ok());
  EXPECT_TRUE(parse({{"architectures", json::array()}, {"model_type", "llama"}}).ok());

  std::mt19937_64 rng(testing::Seed());
  for (int i = 0; i < 200; ++i) {
    const json value = RandomNonString(rng, 2);
    const absl::Status status =
        parse({{"architectures", json::array({value, "LlamaForCausalLM"})}});
    ExpectError(status, "cfg.json: architectures[0] is '");
    ExpectError(status, "not a string");
    // At most 64 characters of the value, escaped: the line stays short.
    EXPECT_LT(status.message().size(), 600u) << status.message() << "\n" << testing::SeedTrace();
    for (char c : status.message()) {
      ASSERT_TRUE(c >= 0x20 && c < 0x7f) << status.message() << "\n" << testing::SeedTrace();
    }
  }
}

TEST(ModelSourceTest, JsonSpecAndParamCount) {
  auto text = ReadTextFile(TestData("small-spec.json"));
  ASSERT_TRUE(text.ok());
  auto spec = ModelFromSpecJson(*text, "small-spec.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "two-blocks");
  EXPECT_EQ(spec->spec.NumParams(), 2 * 256 * 64 + 256 + 64);
  EXPECT_EQ(spec->activation_bytes_per_sample, (std::vector<int64_t>{65536, 65536}));
  EXPECT_TRUE(spec->spec.units[0].params[1].no_decay);
  ExpectError(ModelFromSpecJson(R"({"units": [{"name": "a", "params": [{"name": "w",
      "shape": [0]}]}]})",
                                "zero.json")
                  .status(),
              "zero.json");
  ExpectError(ModelFromSpecJson(R"({"units": 3})", "s.json").status(), "'units'");
  ExpectError(ModelFromSpecJson("[1, 2", "s.json").status(), "not valid JSON");

  auto flat = ModelFromParamCount(7500000000);
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->spec.units.size(), 1u);
  EXPECT_EQ(flat->spec.NumParams(), 7500000000);
  EXPECT_FALSE(ModelFromParamCount(0).ok());
}

// The estimator's --spec reads the param group, freezing and tie keys, and
// refuses bad values with the file's name (ModelSpec::Validate's wording).
TEST(ModelSourceTest, JsonSpecCarriesParamGroupsFrozenAndTiedParams) {
  std::mt19937_64 rng(testing::Seed());
  const int vocab = 8 + static_cast<int>(rng() % 64);
  const double scale = 0.125 * static_cast<double>(1 + rng() % 8);
  const std::string text = absl::StrFormat(
      R"({"units": [
        {"name": "embed", "params": [{"name": "w", "shape": [%d, 16], "weight_decay": 0.0}]},
        {"name": "block", "params": [{"name": "w", "shape": [16, 16], "trainable": false},
                                     {"name": "a", "shape": [4, 16], "lr_scale": %.17g}]},
        {"name": "head", "params": [{"name": "w", "shape": [%d, 16], "weight_decay": 0.0,
                                     "tied_to": {"unit": "embed", "param": "w"}}]}]})",
      vocab, scale, vocab);
  auto spec = ModelFromSpecJson(text, "lm.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModelSpec& m = spec->spec;
  EXPECT_EQ(m.units[0].params[0].weight_decay, 0.0);
  EXPECT_FALSE(m.units[1].params[0].trainable);
  EXPECT_TRUE(m.units[1].params[1].trainable);
  EXPECT_EQ(m.units[1].params[1].lr_scale, scale);
  ASSERT_TRUE(m.units[2].params[0].tied_to.has_value());
  EXPECT_EQ(m.units[2].params[0].tied_to->unit, "embed");
  EXPECT_EQ(m.units[2].params[0].tied_to->param, "w");
  auto bad = [&](const std::string& from, const std::string& to) {
    std::string edited = text;
    const size_t at = edited.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return ModelFromSpecJson(edited.replace(at, from.size(), to), "lm.json").status();
  };
  ExpectError(bad(R"("lr_scale": )", R"("lr_scale": -)"),
              "lm.json: model spec: param 'block.a' has lr_scale -");
  ExpectError(bad(R"("trainable": false)", R"("trainable": false, "no_decay": true,
                                           "weight_decay": 0.5)"),
              "lm.json: model spec: param 'block.w' has both no_decay and weight_decay 0.5");
  ExpectError(bad(R"("param": "w"}}]})", R"("param": "v"}}]})"),
              "lm.json: model spec: param 'head.w' is tied to 'embed.v', which is no param");
  ExpectError(bad(R"("tied_to": {"unit": "embed", "param": "w"})", R"("tied_to": "embed.w")"),
              "lm.json: field 'units[2].params[0].tied_to' is \"embed.w\"; it must be an object");
}

TEST(ModelSourceTest, MixtralIsAMixtureOfExpertsWithHfNamesAndActiveParams) {
  auto mixtral = ModelFromPreset("mixtral-8x7b");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->spec.NumParams(), 46702792704);  // mistralai/Mixtral-8x7B-v0.1
  ASSERT_TRUE(mixtral->transformer.has_value());
  EXPECT_EQ(mixtral->transformer->experts, 8);
  EXPECT_EQ(mixtral->transformer->experts_per_token, 2);
  EXPECT_EQ(mixtral->spec.units.size(), 35u);
  const ParamSpec* gate = FindParam(mixtral->spec, "layers.3", "block_sparse_moe.gate.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->shape, (std::vector<int64_t>{8, 4096}));
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"block_sparse_moe.experts.7.w1.weight", {14336, 4096}},
           {"block_sparse_moe.experts.7.w2.weight", {4096, 14336}},
           {"block_sparse_moe.experts.7.w3.weight", {14336, 4096}},
           {"self_attn.k_proj.weight", {1024, 4096}}}) {
    const ParamSpec* p = FindParam(mixtral->spec, "layers.3", name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->shape, shape) << name;
  }
  EXPECT_EQ(FindParam(mixtral->spec, "layers.3", "block_sparse_moe.experts.8.w1.weight"), nullptr);
  EXPECT_EQ(FindParam(mixtral->spec, "layers.3", "mlp.up_proj.weight"), nullptr);
  // A token runs through 2 of the 8 experts: 6 experts of 3 f h per layer idle.
  EXPECT_EQ(mixtral->active_params, int64_t{46702792704} - int64_t{32} * 6 * 3 * 14336 * 4096);
  // The same model read from a config.json by model_type.
  auto config = ModelFromHfConfig(R"({"model_type": "mixtral", "hidden_size": 4096,
      "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
      "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
      "num_experts_per_tok": 2})",
                                  "mixtral.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->spec.NumParams(), 46702792704);
  // Dense models: every param is active.
  auto llama = ModelFromPreset("llama-2-7b");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->active_params, llama->spec.NumParams());
  ExpectError(ModelFromHfConfig(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 100, "num_local_experts": 4, "num_experts_per_tok": 5})",
                                "topk.json")
                  .status(),
              "num_experts_per_tok 5 exceeds the supported maximum 4");
}

TEST(ModelSourceTest, DenseArchitecturesThatDeclareExpertsAreRefused) {
  for (const char* architecture : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}) {
    for (const char* field : {"num_local_experts", "num_experts", "n_routed_experts",
                              "moe_intermediate_size", "num_experts_per_tok"}) {
      const std::string config = absl::StrFormat(
          R"({"architectures": ["%s"], "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "%s": 8})",
          architecture, field);
      const absl::Status status = ModelFromHfConfig(config, "moe.json").status();
      ExpectError(status, absl::StrCat("moe.json: field '", field, "' is 8"));
      ExpectError(status, architecture);
      ExpectError(status, "MixtralForCausalLM");
      EXPECT_EQ(status.message().find('\n'), std::string::npos);
    }
  }
  // A null or zero entry declares nothing.
  auto dense = ModelFromHfConfig(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 100, "num_experts": null, "moe_intermediate_size": 0})",
                                 "dense.json");
  EXPECT_TRUE(dense.ok()) << dense.status();
}

TEST(ModelSourceTest, SizesAreCheckedBeforeAnythingIsBuilt) {
  const auto llama = [](const std::string& layers, const std::string& hidden,
                        const std::string& extra) {
    return absl::StrFormat(
        R"({"architectures": ["LlamaForCausalLM"], "hidden_size": %s, "intermediate_size": 128,
            "num_attention_heads": 4, "num_hidden_layers": %s, "vocab_size": 100%s})",
        hidden, layers, extra);
  };
  // 10^8 layers would be 10^8 units: refused at once, naming the field.
  const auto begin = std::chrono::steady_clock::now();
  ExpectError(ModelFromHfConfig(llama("100000000", "64", ""), "deep.json").status(),
              "deep.json: num_hidden_layers 100000000 exceeds the supported maximum 16384");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(), 0.1);
  EXPECT_TRUE(ModelFromHfConfig(llama("16384", "64", ""), "ok.json").ok());
  ExpectError(ModelFromHfConfig(llama("0", "64", ""), "c.json").status(),
              "field 'num_hidden_layers' is 0; it must be a positive integer");
  ExpectError(ModelFromHfConfig(llama("2", "-64", ""), "c.json").status(), "'hidden_size' is -64");
  // Above 2^63 - 1: refused, not wrapped.
  ExpectError(ModelFromHfConfig(llama("2", "18446744073709551615", ""), "c.json").status(),
              "above 2^63 - 1");
  // Products: q_proj would have 10^24 elements; the vocabulary 2^62 x h.
  ExpectError(ModelFromHfConfig(llama("2", "1000000000000", ""), "c.json").status(),
              "self_attn.q_proj.weight' of shape [1000000000000, 1000000000000]");
  ExpectError(ModelFromHfConfig(llama("2", "64", R"(, "head_dim": 4611686018427387904)"), "c.json")
                  .status(),
              "head dimension");
  ExpectError(ModelFromHfConfig(R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 100,
      "n_layer": 2, "n_head": 3, "vocab_size": 10})",
                                "g.json")
                  .status(),
              "n_embd 100 is not a multiple of n_head 3");
  ExpectError(ModelFromHfConfig(R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 768,
      "n_layer": 12, "n_head": 12, "n_positions": 1000000000000000000, "vocab_size": 50257})",
                                "g.json")
                  .status(),
              "embed.wpe.weight");
  // A JSON spec with too many units is refused before they are built.
  std::string units;
  for (int64_t u = 0; u <= kMaxUnits; ++u) {
    absl::StrAppend(&units, u > 0 ? "," : "", R"({"name":"u)", u, R"(","params":[]})");
  }
  ExpectError(ModelFromSpecJson(absl::StrCat(R"({"units": [)", units, "]}"), "wide.json").status(),
              "wide.json: 65537 units exceed the supported maximum 65536");
  ExpectError(ModelFromSpecJson(R"({"units": [{"name": "a", "params": [{"name": "w",
      "shape": [9223372036854775808]}]}]})",
                                "big.json")
                  .status(),
              "above 2^63 - 1");
  ExpectError(ModelFromParamCount(kMaxModelElements + 1).status(), "2^56");
}

TEST(ByteUnitsTest, ParsesSizesAndCounts) {
  EXPECT_EQ(*ParseByteSize("80GiB", "m"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("1TiB", "m"), int64_t{1} << 40);
  EXPECT_EQ(*ParseByteSize("40GB", "m"), int64_t{40000000000});
  EXPECT_EQ(*ParseByteSize("80g", "m"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("512 MiB", "m"), int64_t{512} << 20);
  for (const char* bad : {"", "abc", "80XB", "-1GiB", "0", "GiB", "1e30TiB"}) {
    auto r = ParseByteSize(bad, "--gpu-mem");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_TRUE(absl::StrContains(r.status().message(), "--gpu-mem"));
    }
  }
  EXPECT_EQ(*ParseCount("7.5e9", "n"), 7500000000);
  EXPECT_EQ(*ParseCount("175B", "n"), 175000000000);
  EXPECT_EQ(*ParseCount("2T", "n"), 2000000000000);
  EXPECT_FALSE(ParseCount("1.5", "n").ok());
  EXPECT_FALSE(ParseCount("x", "n").ok());
  EXPECT_EQ(FormatGiB(int64_t{101} << 30), "101.0");
  // Numbers in messages: as a person writes them, never "1e+06".
  EXPECT_EQ(FormatNumber(1e6), "1000000");
  EXPECT_EQ(FormatNumber(1000001), "1000001");
  EXPECT_EQ(FormatNumber(0.001), "0.001");
  EXPECT_EQ(FormatNumber(4611686018427387904.0), "4611686018427387904");
  EXPECT_EQ(FormatNumber(1.7e308), "1.7e+308");
  EXPECT_EQ(FormatNumber(-2.5), "-2.5");
}

}  // namespace
}  // namespace zeroshard
