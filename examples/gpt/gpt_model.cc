#include "examples/gpt/gpt_model.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "examples/common/rng.h"
#include "nlohmann/json.hpp"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace {

// GPT-2's block params, in state-dict order (internal::BlockParam).
struct BlockParamInfo {
  const char* name;
  int64_t rows_per_c;  // first dimension / C (0: a vector)
  int64_t cols_per_c;  // second dimension (or the vector's length) / C
  bool decay;
};
constexpr BlockParamInfo kBlockParams[internal::kNumBlockParams] = {
    {"ln_1.weight", 0, 1, false},       {"ln_1.bias", 0, 1, false},
    {"attn.c_attn.weight", 1, 3, true}, {"attn.c_attn.bias", 0, 3, false},
    {"attn.c_proj.weight", 1, 1, true}, {"attn.c_proj.bias", 0, 1, false},
    {"ln_2.weight", 0, 1, false},       {"ln_2.bias", 0, 1, false},
    {"mlp.c_fc.weight", 1, 4, true},    {"mlp.c_fc.bias", 0, 4, false},
    {"mlp.c_proj.weight", 4, 1, true},  {"mlp.c_proj.bias", 0, 1, false},
};

ParamSpec Param(std::string name, std::vector<int64_t> shape, bool decay) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.no_decay = !decay;
  return p;
}

// GPT2Config's booleans that change the attention's arithmetic: the value
// the trainer computes, and what to do about another.
struct MathSwitch {
  const char* field;
  bool computed;
  const char* remedy;
};
constexpr MathSwitch kMathSwitches[] = {
    {"scale_attn_weights", true, "the scores are divided by sqrt(head size); remove the field"},
    {"scale_attn_by_inverse_layer_idx", false,
     "the scores are not scaled by 1 / (layer + 1); remove the field"},
    {"reorder_and_upcast_attn", false,
     "the attention's products are fp32 already; remove the field"},
    {"add_cross_attention", false, "the decoder has no cross-attention; remove the field"},
};

// The version of the rules by which GridGptTrainer splits the model
// (docs/parallelism.md, "The GPT on the grid"): the vocabulary padded to a
// multiple of tp with ceil(V / tp) rows a rank, c_attn split by heads in
// its q | k | v groups, the MLP by hidden units, whole units on stages, the
// head tied to wte across stages. A change of these rules changes what a
// grid checkpoint's slices mean: bump it.
constexpr int kGridSplitRules = 1;

// The identity's fields: name and value, in one table (GptModelIdentity,
// GptModelIdentityFields and the test walk it).
struct IdentityField {
  const char* name;
  nlohmann::json (*value)(const GptConfig& cfg);
};
const IdentityField kIdentityFields[] = {
    {"architecture", [](const GptConfig&) { return nlohmann::json("GPT2LMHeadModel"); }},
    {"n_layer", [](const GptConfig& c) { return nlohmann::json(c.layers); }},
    {"n_head", [](const GptConfig& c) { return nlohmann::json(c.heads); }},
    {"n_embd", [](const GptConfig& c) { return nlohmann::json(c.width); }},
    {"n_positions", [](const GptConfig& c) { return nlohmann::json(c.positions); }},
    {"vocab_size", [](const GptConfig& c) { return nlohmann::json(c.vocab); }},
    {"n_inner", [](const GptConfig& c) { return nlohmann::json(4 * c.width); }},
    {"layer_norm_epsilon", [](const GptConfig& c) { return nlohmann::json(c.eps); }},
    {"activation_function", [](const GptConfig&) { return nlohmann::json("gelu_new"); }},
    {"tie_word_embeddings", [](const GptConfig&) { return nlohmann::json(true); }},
    {"scale_attn_weights", [](const GptConfig&) { return nlohmann::json(true); }},
    {"scale_attn_by_inverse_layer_idx", [](const GptConfig&) { return nlohmann::json(false); }},
    {"reorder_and_upcast_attn", [](const GptConfig&) { return nlohmann::json(false); }},
    {"add_cross_attention", [](const GptConfig&) { return nlohmann::json(false); }},
    {"grid_split_rules", [](const GptConfig&) { return nlohmann::json(kGridSplitRules); }},
};

}  // namespace

absl::StatusOr<GptConfig> ParseGptConfig(const std::string& json_text, const std::string& origin) {
  ZS_ASSIGN_OR_RETURN(const TransformerShape s, ParseHfConfig(json_text, origin));
  if (s.architecture != "GPT2LMHeadModel") {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: architecture %s; the GPT example trains GPT2LMHeadModel configs only",
                        origin, s.architecture));
  }
  if (!s.tied_embeddings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tie_word_embeddings is false; the GPT example ties the LM head to wte (GPT-2's "
        "layout): remove the field or set it to true",
        origin));
  }
  if (s.intermediate != 4 * s.hidden) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: n_inner %d; the GPT example's MLP is 4 x n_embd = %d wide: remove "
                        "n_inner or set it to null",
                        origin, s.intermediate, 4 * s.hidden));
  }
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  GptConfig cfg;
  cfg.layers = s.layers;
  cfg.heads = s.heads;
  cfg.width = s.hidden;
  cfg.positions = s.max_positions;
  cfg.vocab = s.vocab;
  cfg.json = j.dump();
  if (j.contains("layer_norm_epsilon")) {
    const nlohmann::json& e = j["layer_norm_epsilon"];
    if (!e.is_number() || !(e.get<double>() > 0) || !(e.get<double>() < 1)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: layer_norm_epsilon is %s; it must be a number in (0, 1)", origin, e.dump()));
    }
    cfg.eps = e.get<double>();
  }
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: activation_function '%s'; the GPT example implements gelu_new (GPT-2's) only", origin,
        act));
  }
  // GPT2Config's switches of the attention's arithmetic: only GPT-2's own
  // setting is computed, any other is refused rather than trained as if
  // absent.
  for (const MathSwitch& m : kMathSwitches) {
    if (!j.contains(m.field) || j[m.field].is_null()) continue;
    if (!j[m.field].is_boolean()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %s is %s; it must be true or false",
                                                        origin, m.field, j[m.field].dump()));
    }
    if (j[m.field].get<bool>() != m.computed) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s is %s; the GPT example computes %s only: %s", origin, m.field,
                          j[m.field].dump(), m.computed ? "true" : "false", m.remedy));
    }
  }
  if (j.contains("initializer_range") && !j["initializer_range"].is_null()) {
    const nlohmann::json& r = j["initializer_range"];
    if (!r.is_number() || !(r.get<double>() > 0) || !(r.get<double>() < 1)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: initializer_range is %s; it must be a number in (0, 1)", origin, r.dump()));
    }
    cfg.init_std = r.get<double>();
  }
  // Dropout changes no weight's shape and is off in inference; the trainer
  // has none, and says so (gpt_train) instead of refusing every config
  // that GPT2Config() writes (0.1 for each).
  for (const char* field : {"embd_pdrop", "attn_pdrop", "resid_pdrop"}) {
    double p = 0.1;  // GPT2Config's default
    if (j.contains(field) && !j[field].is_null()) {
      if (!j[field].is_number() || !(j[field].get<double>() >= 0) ||
          !(j[field].get<double>() < 1)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: %s is %s; it must be a number in [0, 1)", origin, field, j[field].dump()));
      }
      p = j[field].get<double>();
    }
    if (p > 0) {
      cfg.dropout_ignored.push_back(absl::StrFormat(
          "%s %g%s", field, p, j.contains(field) ? "" : " (left out: the default)"));
    }
  }
  return cfg;
}

absl::StatusOr<GptConfig> ReadGptConfig(const std::string& path) {
  ZS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "the --config file"));
  return ParseGptConfig(text, path);
}

std::string GptConfigJson(int64_t layers, int64_t heads, int64_t width, int64_t positions,
                          int64_t vocab) {
  const nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                            {"model_type", "gpt2"},
                            {"n_layer", layers},
                            {"n_head", heads},
                            {"n_embd", width},
                            {"n_positions", positions},
                            {"vocab_size", vocab},
                            {"layer_norm_epsilon", 1e-5},
                            {"activation_function", "gelu_new"},
                            {"resid_pdrop", 0.0},
                            {"embd_pdrop", 0.0},
                            {"attn_pdrop", 0.0},
                            {"tie_word_embeddings", true}};
  return j.dump(2);
}

ModelSpec BuildGptModelSpec(const GptConfig& cfg) {
  const int64_t c = cfg.width;
  ModelSpec spec;
  UnitSpec embed;
  embed.name = "embed";
  embed.params.push_back(Param("wte.weight", {cfg.vocab, c}, false));
  embed.params.push_back(Param("wpe.weight", {cfg.positions, c}, false));
  spec.units.push_back(std::move(embed));
  for (int64_t i = 0; i < cfg.layers; ++i) {
    UnitSpec block;
    block.name = absl::StrCat("h.", i);
    for (const BlockParamInfo& b : kBlockParams) {
      std::vector<int64_t> shape = b.rows_per_c == 0
                                       ? std::vector<int64_t>{b.cols_per_c * c}
                                       : std::vector<int64_t>{b.rows_per_c * c, b.cols_per_c * c};
      block.params.push_back(Param(b.name, std::move(shape), b.decay));
    }
    spec.units.push_back(std::move(block));
  }
  UnitSpec norm;
  norm.name = "final_norm";
  norm.params.push_back(Param("ln_f.weight", {c}, false));
  norm.params.push_back(Param("ln_f.bias", {c}, false));
  spec.units.push_back(std::move(norm));
  UnitSpec head;
  head.name = "lm_head";
  ParamSpec tied = Param("lm_head.weight", {cfg.vocab, c}, false);
  tied.tied_to = ParamRef{"embed", "wte.weight"};
  head.params.push_back(std::move(tied));
  spec.units.push_back(std::move(head));
  return spec;
}

std::vector<float> InitialParam(const GptConfig& cfg, int unit, int param, uint64_t seed) {
  const ModelSpec spec = BuildGptModelSpec(cfg);
  const ParamSpec& p = spec.units[static_cast<size_t>(unit)].params[static_cast<size_t>(param)];
  std::vector<float> v(static_cast<size_t>(p.NumElements()));
  const bool vector = p.shape.size() == 1;
  if (vector) {
    // LayerNorm weights 1, every bias and LayerNorm bias 0.
    const bool ln_weight =
        p.name.find("ln_") != std::string::npos && p.name.find(".weight") != std::string::npos;
    std::fill(v.begin(), v.end(), ln_weight ? 1.0f : 0.0f);
    return v;
  }
  double stddev = cfg.init_std;
  if (p.name == "attn.c_proj.weight" || p.name == "mlp.c_proj.weight") {
    stddev /= std::sqrt(2.0 * static_cast<double>(cfg.layers));
  }
  const uint64_t key = examples::DeriveKey(examples::DeriveKey(seed, unit), param);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(stddev * examples::NormalAt(key, i));
  }
  return v;
}

absl::Status InitGptParams(Engine& engine, const GptConfig& cfg, uint64_t seed) {
  const ModelSpec& spec = engine.model();
  for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
    const UnitSpec& unit = spec.units[static_cast<size_t>(u)];
    for (int p = 0; p < static_cast<int>(unit.params.size()); ++p) {
      if (unit.params[static_cast<size_t>(p)].tied_to.has_value()) continue;
      const std::vector<float> v = InitialParam(cfg, u, p, seed);
      ZS_RETURN_IF_ERROR(engine.SetParam(u, p, v));
    }
  }
  return absl::OkStatus();
}

std::string GptModelIdentity(const GptConfig& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const IdentityField& f : kIdentityFields) j[f.name] = f.value(cfg);
  return j.dump();
}

std::vector<std::string> GptModelIdentityFields() {
  std::vector<std::string> names;
  for (const IdentityField& f : kIdentityFields) names.push_back(f.name);
  return names;
}

absl::StatusOr<std::string> RecordedGptModelIdentity(const std::string& trainer_state_json,
                                                     const std::string& origin) {
  const nlohmann::json j = nlohmann::json::parse(trainer_state_json, nullptr, false);
  if (j.is_object() && j.contains("model") && j["model"].is_object()) return j["model"].dump();
  if (j.is_object() && j.contains("hf_config") && j["hf_config"].is_object()) {
    // Written before the identity was recorded: the config it saved gives it.
    ZS_ASSIGN_OR_RETURN(const GptConfig cfg,
                        ParseGptConfig(j["hf_config"].dump(), origin + " (its hf_config)"));
    return GptModelIdentity(cfg);
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: its trainer state records no model (neither \"model\" nor \"hf_config\"); was it "
      "written by gpt_train?",
      origin));
}

absl::Status CheckSameModel(const std::string& there, const std::string& here,
                            const std::string& source, const std::string& config,
                            const std::string& remedy) {
  const nlohmann::json a = nlohmann::json::parse(there, nullptr, false);
  const nlohmann::json b = nlohmann::json::parse(here, nullptr, false);
  if (!a.is_object() || !b.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the model identity is not a JSON object", source));
  }
  std::vector<std::string> differ;
  // Every field of either side: one only the other records differs too.
  nlohmann::json names = nlohmann::json::object();
  for (auto it = a.begin(); it != a.end(); ++it) names[it.key()] = true;
  for (auto it = b.begin(); it != b.end(); ++it) names[it.key()] = true;
  for (auto it = names.begin(); it != names.end(); ++it) {
    const std::string& key = it.key();
    const std::string va = a.contains(key) ? a[key].dump() : "absent";
    const std::string vb = b.contains(key) ? b[key].dump() : "absent";
    if (va != vb)
      differ.push_back(absl::StrFormat("%s is %s there and %s in %s", key, va, vb, config));
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("%s: the weights belong to another model: %s; %s", source,
                      absl::StrJoin(differ, ", "), remedy));
}

internal::GptDims Dims(const GptConfig& cfg, int64_t micro_batch, int64_t seq) {
  internal::GptDims d;
  d.batch = micro_batch;
  d.seq = seq;
  d.width = cfg.width;
  d.heads = cfg.heads;
  d.vocab = cfg.vocab;
  d.positions = cfg.positions;
  d.eps = static_cast<float>(cfg.eps);
  return d;
}

}  // namespace gpt
}  // namespace zeroshard
