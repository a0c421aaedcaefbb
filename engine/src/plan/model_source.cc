#include "zeroshard/estimate/model_source.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/common/json_fields.h"
#include "engine/src/plan/presets/hf_presets.h"
#include "engine/src/plan/transformer_spec.h"
#include "nlohmann/json.hpp"
#include "zeroshard/input_file.h"
#include "zeroshard/quote.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

using internal::BuildTransformerModel;
using internal::HfPreset;
using internal::HfPresets;

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

using FieldReader = internal::JsonFields;
constexpr int64_t kNoLimit = FieldReader::kNoLimit;

const char* const kSupportedArchitectures =
    "LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel";

// Fields with which Hugging Face configs declare a mixture of experts
// (Mixtral, Qwen2-MoE, DeepSeek, DBRX, OLMoE, ...).
const char* const kExpertFields[] = {"num_local_experts",   "num_experts",
                                     "n_routed_experts",    "n_shared_experts",
                                     "moe_num_experts",     "moe_intermediate_size",
                                     "num_experts_per_tok", "shared_expert_intermediate_size"};

// A config read as a dense model must not declare experts: the dense count
// would be silently wrong.
absl::Status RefuseExperts(const json& doc, const std::string& architecture,
                           absl::string_view source) {
  for (const char* field : kExpertFields) {
    if (!doc.contains(field)) continue;
    const json& v = doc.at(field);
    if (v.is_null() || (v.is_number() && v.get<double>() == 0)) continue;
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: field '%s' is %s, so the model has experts, but %s is read as a dense model and "
        "its count would be wrong; for a Mixtral model set \"architectures\": "
        "[\"MixtralForCausalLM\"], otherwise describe the model with --spec",
        source, field, v.dump(), architecture));
  }
  return absl::OkStatus();
}

// A JSON value of an untrusted config for a message: its text, at most 64
// characters, control bytes escaped.
std::string QuoteJson(const json& value) {
  return QuoteForMessage(value.dump(
      /*indent=*/-1, /*indent_char=*/' ', /*ensure_ascii=*/false, json::error_handler_t::replace));
}

// "architectures" (a list whose first entry names the class) wins over
// "model_type". Absent, null or an empty list means "not given"; any other
// value that is not a list of strings is an error naming it, never a
// silent fall-back to model_type.
absl::StatusOr<std::string> ArchitectureOf(const json& doc, absl::string_view source) {
  const auto architectures = doc.find("architectures");
  if (architectures != doc.end() && !architectures->is_null()) {
    if (!architectures->is_array()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: 'architectures' is %s, not a list; write it as Hugging Face does, e.g. "
          "\"architectures\": [\"LlamaForCausalLM\"]",
          source, QuoteJson(*architectures)));
    }
    if (!architectures->empty()) {
      const json& first = architectures->front();
      if (!first.is_string()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: architectures[0] is %s, not a string; it must name the model class, e.g. "
            "\"LlamaForCausalLM\" (supported: %s)",
            source, QuoteJson(first), kSupportedArchitectures));
      }
      return first.get<std::string>();
    }
  }
  const auto model_type = doc.find("model_type");
  if (model_type != doc.end() && !model_type->is_null()) {
    if (!model_type->is_string()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: 'model_type' is %s, not a string; write e.g. \"model_type\": \"llama\"", source,
          QuoteJson(*model_type)));
    }
    const std::string type = model_type->get<std::string>();
    if (type == "llama") return std::string("LlamaForCausalLM");
    if (type == "mistral") return std::string("MistralForCausalLM");
    if (type == "mixtral") return std::string("MixtralForCausalLM");
    if (type == "qwen2") return std::string("Qwen2ForCausalLM");
    if (type == "gpt2") return std::string("GPT2LMHeadModel");
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: model_type %s is not supported; supported architectures: %s", source,
                        QuoteForMessage(type), kSupportedArchitectures));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: neither 'architectures' nor 'model_type' is given; is this a Hugging Face "
      "config.json?",
      source));
}

absl::StatusOr<TransformerShape> ParseGpt2Config(const FieldReader& f) {
  TransformerShape s;
  s.architecture = "GPT2LMHeadModel";
  ZS_ASSIGN_OR_RETURN(s.hidden, f.Size("n_embd"));
  ZS_ASSIGN_OR_RETURN(s.layers, f.Size("n_layer", kMaxLayers));
  ZS_ASSIGN_OR_RETURN(s.heads, f.Size("n_head"));
  ZS_ASSIGN_OR_RETURN(s.vocab, f.Size("vocab_size"));
  ZS_ASSIGN_OR_RETURN(s.max_positions, f.SizeOr("n_positions", 1024));
  // GPT2Config's default n_inner is 4 x n_embd.
  ZS_ASSIGN_OR_RETURN(s.intermediate,
                      f.SizeOr("n_inner", CheckedMul(s.hidden, 4).value_or(kNoLimit)));
  ZS_ASSIGN_OR_RETURN(s.tied_embeddings, f.BoolOr("tie_word_embeddings", true));
  if (s.hidden % s.heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: n_embd %d is not a multiple of n_head %d (GPT-2 needs equal heads that fill "
        "n_embd); check the config",
        f.source(), s.hidden, s.heads));
  }
  s.kv_heads = s.heads;
  s.head_dim = s.hidden / s.heads;
  s.qkv_bias = s.attn_out_bias = s.mlp_bias = s.layer_norm_bias = true;
  s.learned_positions = true;
  // GPT2Config defaults every dropout to 0.1.
  ZS_ASSIGN_OR_RETURN(double resid, f.RealOr("resid_pdrop", 0.1));
  ZS_ASSIGN_OR_RETURN(double attn, f.RealOr("attn_pdrop", 0.1));
  s.dropout = resid > 0 || attn > 0;
  return s;
}

absl::StatusOr<TransformerShape> ParseLlamaFamilyConfig(const FieldReader& f,
                                                        const std::string& architecture) {
  TransformerShape s;
  s.architecture = architecture;
  ZS_ASSIGN_OR_RETURN(s.hidden, f.Size("hidden_size"));
  ZS_ASSIGN_OR_RETURN(s.layers, f.Size("num_hidden_layers", kMaxLayers));
  ZS_ASSIGN_OR_RETURN(s.heads, f.Size("num_attention_heads"));
  ZS_ASSIGN_OR_RETURN(s.intermediate, f.Size("intermediate_size"));
  ZS_ASSIGN_OR_RETURN(s.vocab, f.Size("vocab_size"));
  ZS_ASSIGN_OR_RETURN(s.kv_heads, f.SizeOr("num_key_value_heads", s.heads));
  if (f.Has("max_position_embeddings")) {
    ZS_ASSIGN_OR_RETURN(s.max_positions, f.Size("max_position_embeddings"));
  }
  if (s.hidden / s.heads < 1 && !f.Has("head_dim")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: hidden_size %d is smaller than num_attention_heads %d; give head_dim or fix the "
        "sizes",
        f.source(), s.hidden, s.heads));
  }
  // Hugging Face's default: hidden_size // num_attention_heads.
  ZS_ASSIGN_OR_RETURN(s.head_dim, f.SizeOr("head_dim", s.hidden / s.heads));
  ZS_ASSIGN_OR_RETURN(s.tied_embeddings, f.BoolOr("tie_word_embeddings", false));
  s.gated_mlp = true;
  if (architecture == "MixtralForCausalLM") {
    // MixtralConfig's defaults: 8 experts, 2 per token. Mixtral has no
    // attention or MLP biases.
    ZS_ASSIGN_OR_RETURN(s.experts, f.SizeOr("num_local_experts", 8, kMaxExperts));
    ZS_ASSIGN_OR_RETURN(s.experts_per_token, f.SizeOr("num_experts_per_tok", 2, s.experts));
  } else if (architecture == "Qwen2ForCausalLM") {
    // Qwen2 always has q/k/v biases and no o_proj bias.
    s.qkv_bias = true;
  } else {
    ZS_ASSIGN_OR_RETURN(bool attention_bias, f.BoolOr("attention_bias", false));
    s.qkv_bias = s.attn_out_bias = attention_bias;
    ZS_ASSIGN_OR_RETURN(s.mlp_bias, f.BoolOr("mlp_bias", false));
  }
  ZS_ASSIGN_OR_RETURN(double attention_dropout, f.RealOr("attention_dropout", 0.0));
  s.dropout = attention_dropout > 0;
  return s;
}

}  // namespace

absl::StatusOr<TransformerShape> ParseHfConfig(absl::string_view json_text,
                                               absl::string_view source) {
  ZS_ASSIGN_OR_RETURN(json doc, ParseJson(json_text, source));
  ZS_ASSIGN_OR_RETURN(std::string architecture, ArchitectureOf(doc, source));
  FieldReader fields(doc, std::string(source));
  if (architecture == "MixtralForCausalLM") return ParseLlamaFamilyConfig(fields, architecture);
  const bool dense = architecture == "GPT2LMHeadModel" || architecture == "LlamaForCausalLM" ||
                     architecture == "MistralForCausalLM" || architecture == "Qwen2ForCausalLM";
  if (dense) ZS_RETURN_IF_ERROR(RefuseExperts(doc, architecture, source));
  if (architecture == "GPT2LMHeadModel") return ParseGpt2Config(fields);
  if (dense) return ParseLlamaFamilyConfig(fields, architecture);
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: architecture %s is not supported; supported: %s (or describe the "
                      "model with --spec)",
                      source, QuoteForMessage(architecture), kSupportedArchitectures));
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
  if (num_params > kMaxModelElements) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "parameter count %d exceeds the supported maximum %d (2^56); give a smaller count",
        num_params, kMaxModelElements));
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
  ZS_ASSIGN_OR_RETURN(model.spec,
                      internal::ModelUnitsFromJson(
                          top, "units", internal::UnitJsonRules{},
                          [&model](const FieldReader& unit, int) -> absl::Status {
                            ZS_ASSIGN_OR_RETURN(const int64_t bytes,
                                                unit.IntOr("activation_bytes_per_sample", 0));
                            if (bytes < 0) {
                              return unit.Error("activation_bytes_per_sample",
                                                absl::StrFormat("is %d; it must be >= 0", bytes));
                            }
                            model.activation_bytes_per_sample.push_back(bytes);
                            return absl::OkStatus();
                          }));
  absl::Status valid = model.spec.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  }
  return model;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what,
                                         int64_t max_bytes) {
  return ReadInputFile(path, what, max_bytes);
}

}  // namespace zeroshard
