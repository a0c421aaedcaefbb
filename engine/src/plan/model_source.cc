#include "engine/src/plan/model_source.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/plan/presets/hf_presets.h"
#include "engine/src/plan/transformer_spec.h"
#include "nlohmann/json.hpp"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

using nlohmann::json;

absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view source) {
  json doc = json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not valid JSON; check the file's syntax (e.g. with `jq .`)"));
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the top level must be an object"));
  }
  return doc;
}

// Reads object fields with errors naming the source and the field.
class FieldReader {
 public:
  FieldReader(const json& object, std::string where) : object_(object), where_(std::move(where)) {}

  bool Has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

  absl::StatusOr<int64_t> Int(const char* key) const {
    if (!Has(key)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: field '%s' is missing; it is required", where_, key));
    }
    const json& v = object_.at(key);
    if (!v.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: field '%s' is %s; it must be an integer", where_, key, v.dump()));
    }
    return v.get<int64_t>();
  }

  absl::StatusOr<int64_t> IntOr(const char* key, int64_t fallback) const {
    if (!Has(key)) return fallback;
    return Int(key);
  }

  absl::StatusOr<bool> BoolOr(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: field '%s' is %s; it must be true or false", where_, key, v.dump()));
    }
    return v.get<bool>();
  }

  absl::StatusOr<double> NumberOr(const char* key, double fallback) const {
    if (!Has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_number()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: field '%s' is %s; it must be a number", where_, key, v.dump()));
    }
    return v.get<double>();
  }

  absl::StatusOr<std::string> StringOr(const char* key, const std::string& fallback) const {
    if (!Has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: field '%s' is %s; it must be a string", where_, key, v.dump()));
    }
    return v.get<std::string>();
  }

 private:
  const json& object_;
  std::string where_;
};

const char* const kSupportedArchitectures =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel";

absl::StatusOr<std::string> ArchitectureOf(const json& doc, absl::string_view source) {
  if (doc.contains("architectures") && doc["architectures"].is_array() &&
      !doc["architectures"].empty() && doc["architectures"][0].is_string()) {
    return doc["architectures"][0].get<std::string>();
  }
  if (doc.contains("model_type") && doc["model_type"].is_string()) {
    const std::string type = doc["model_type"].get<std::string>();
    if (type == "llama") return std::string("LlamaForCausalLM");
    if (type == "mistral") return std::string("MistralForCausalLM");
    if (type == "qwen2") return std::string("Qwen2ForCausalLM");
    if (type == "gpt2") return std::string("GPT2LMHeadModel");
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: model_type '%s' is not supported; supported architectures: %s", source,
                        type, kSupportedArchitectures));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: neither 'architectures' nor 'model_type' is given; is this a Hugging Face "
      "config.json?",
      source));
}

absl::StatusOr<TransformerShape> ParseGpt2Config(const FieldReader& f) {
  TransformerShape s;
  s.architecture = "GPT2LMHeadModel";
  ZS_ASSIGN_OR_RETURN(s.hidden, f.Int("n_embd"));
  ZS_ASSIGN_OR_RETURN(s.layers, f.Int("n_layer"));
  ZS_ASSIGN_OR_RETURN(s.heads, f.Int("n_head"));
  ZS_ASSIGN_OR_RETURN(s.vocab, f.Int("vocab_size"));
  ZS_ASSIGN_OR_RETURN(s.max_positions, f.IntOr("n_positions", 1024));
  ZS_ASSIGN_OR_RETURN(s.intermediate, f.IntOr("n_inner", 4 * s.hidden));
  ZS_ASSIGN_OR_RETURN(s.tied_embeddings, f.BoolOr("tie_word_embeddings", true));
  s.kv_heads = s.heads;
  s.head_dim = s.heads > 0 ? s.hidden / s.heads : 0;
  s.qkv_bias = s.attn_out_bias = s.mlp_bias = s.layer_norm_bias = true;
  s.learned_positions = true;
  // GPT2Config defaults every dropout to 0.1.
  ZS_ASSIGN_OR_RETURN(double resid, f.NumberOr("resid_pdrop", 0.1));
  ZS_ASSIGN_OR_RETURN(double attn, f.NumberOr("attn_pdrop", 0.1));
  s.dropout = resid > 0 || attn > 0;
  return s;
}

absl::StatusOr<TransformerShape> ParseLlamaFamilyConfig(const FieldReader& f,
                                                        const std::string& architecture) {
  TransformerShape s;
  s.architecture = architecture;
  ZS_ASSIGN_OR_RETURN(s.hidden, f.Int("hidden_size"));
  ZS_ASSIGN_OR_RETURN(s.layers, f.Int("num_hidden_layers"));
  ZS_ASSIGN_OR_RETURN(s.heads, f.Int("num_attention_heads"));
  ZS_ASSIGN_OR_RETURN(s.intermediate, f.Int("intermediate_size"));
  ZS_ASSIGN_OR_RETURN(s.vocab, f.Int("vocab_size"));
  ZS_ASSIGN_OR_RETURN(s.kv_heads, f.IntOr("num_key_value_heads", s.heads));
  ZS_ASSIGN_OR_RETURN(s.max_positions, f.IntOr("max_position_embeddings", 0));
  ZS_ASSIGN_OR_RETURN(s.head_dim, f.IntOr("head_dim", s.heads > 0 ? s.hidden / s.heads : 0));
  ZS_ASSIGN_OR_RETURN(s.tied_embeddings, f.BoolOr("tie_word_embeddings", false));
  s.gated_mlp = true;
  if (architecture == "Qwen2ForCausalLM") {
    // Qwen2 always has q/k/v biases and no o_proj bias.
    s.qkv_bias = true;
  } else {
    ZS_ASSIGN_OR_RETURN(bool attention_bias, f.BoolOr("attention_bias", false));
    s.qkv_bias = s.attn_out_bias = attention_bias;
    ZS_ASSIGN_OR_RETURN(s.mlp_bias, f.BoolOr("mlp_bias", false));
  }
  ZS_ASSIGN_OR_RETURN(double attention_dropout, f.NumberOr("attention_dropout", 0.0));
  s.dropout = attention_dropout > 0;
  return s;
}

}  // namespace

absl::StatusOr<TransformerShape> ParseHfConfig(absl::string_view json_text,
                                               absl::string_view source) {
  ZS_ASSIGN_OR_RETURN(json doc, ParseJson(json_text, source));
  ZS_ASSIGN_OR_RETURN(std::string architecture, ArchitectureOf(doc, source));
  FieldReader fields(doc, std::string(source));
  if (architecture == "GPT2LMHeadModel") return ParseGpt2Config(fields);
  if (architecture == "LlamaForCausalLM" || architecture == "MistralForCausalLM" ||
      architecture == "Qwen2ForCausalLM") {
    return ParseLlamaFamilyConfig(fields, architecture);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: architecture '%s' is not supported; supported: %s (or describe the "
                      "model with --spec)",
                      source, architecture, kSupportedArchitectures));
}

absl::StatusOr<ModelDescription> ModelFromHfConfig(absl::string_view json_text,
                                                   absl::string_view source) {
  ZS_ASSIGN_OR_RETURN(TransformerShape shape, ParseHfConfig(json_text, source));
  return BuildTransformerModel(shape, std::string(source));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const HfPreset& p : HfPresets()) names.push_back(p.name);
  return names;
}

absl::StatusOr<ModelDescription> ModelFromPreset(absl::string_view name) {
  for (const HfPreset& p : HfPresets()) {
    if (name == p.name) {
      ZS_ASSIGN_OR_RETURN(TransformerShape shape,
                          ParseHfConfig(p.config_json, absl::StrCat("preset ", p.name)));
      return BuildTransformerModel(shape, p.name);
    }
  }
  return absl::NotFoundError(absl::StrFormat("unknown preset '%s'; known presets: %s", name,
                                             absl::StrJoin(PresetNames(), ", ")));
}

absl::StatusOr<ModelDescription> ModelFromParamCount(int64_t num_params) {
  if (num_params <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("parameter count %d must be positive", num_params));
  }
  ModelDescription model;
  model.name = absl::StrCat(num_params, " params");
  UnitSpec unit;
  unit.name = "params";
  unit.params.push_back({"flat", {num_params}, false});
  model.spec.units.push_back(std::move(unit));
  return model;
}

absl::StatusOr<ModelDescription> ModelFromSpecJson(absl::string_view json_text,
                                                   absl::string_view source) {
  ZS_ASSIGN_OR_RETURN(json doc, ParseJson(json_text, source));
  ModelDescription model;
  FieldReader top(doc, std::string(source));
  ZS_ASSIGN_OR_RETURN(model.name, top.StringOr("name", std::string(source)));
  if (!doc.contains("units") || !doc["units"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field 'units' is missing or not an array of units"));
  }
  const json& units = doc["units"];
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string where = absl::StrFormat("%s: units[%d]", source, u);
    if (!units[u].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": must be an object"));
    }
    FieldReader unit_fields(units[u], where);
    UnitSpec unit;
    ZS_ASSIGN_OR_RETURN(unit.name, unit_fields.StringOr("name", ""));
    ZS_ASSIGN_OR_RETURN(int64_t activation_bytes,
                        unit_fields.IntOr("activation_bytes_per_sample", 0));
    if (activation_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": activation_bytes_per_sample must be >= 0"));
    }
    if (!units[u].contains("params") || !units[u]["params"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field 'params' is missing or not an array"));
    }
    const json& params = units[u]["params"];
    for (size_t p = 0; p < params.size(); ++p) {
      const std::string pwhere = absl::StrFormat("%s.params[%d]", where, p);
      if (!params[p].is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(pwhere, ": must be an object"));
      }
      FieldReader pf(params[p], pwhere);
      ParamSpec param;
      ZS_ASSIGN_OR_RETURN(param.name, pf.StringOr("name", ""));
      ZS_ASSIGN_OR_RETURN(param.no_decay, pf.BoolOr("no_decay", false));
      if (!params[p].contains("shape") || !params[p]["shape"].is_array()) {
        return absl::InvalidArgumentError(
            absl::StrCat(pwhere, ": field 'shape' is missing or not an array of integers"));
      }
      for (const json& d : params[p]["shape"]) {
        if (!d.is_number_integer()) {
          return absl::InvalidArgumentError(
              absl::StrCat(pwhere, ": shape entry ", d.dump(), " is not an integer"));
        }
        param.shape.push_back(d.get<int64_t>());
      }
      unit.params.push_back(std::move(param));
    }
    model.spec.units.push_back(std::move(unit));
    model.activation_bytes_per_sample.push_back(activation_bytes);
  }
  absl::Status valid = model.spec.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  }
  return model;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrFormat("%s: cannot open the file; check the path and permissions", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": read error"));
  return text.str();
}

}  // namespace zeroshard
