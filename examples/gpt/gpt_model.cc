#include "examples/gpt/gpt_model.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  return cfg;
}

absl::StatusOr<GptConfig> ReadGptConfig(const std::string& path) {
  ZS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "--config"));
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
  double stddev = 0.02;
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
