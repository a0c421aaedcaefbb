#include "engine/src/plan/transformer_spec.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "zeroshard/estimate/fine_tuning.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

// Collects one unit's params, each with its tensor-parallel split dimension.
class UnitBuilder {
 public:
  explicit UnitBuilder(std::string name) { unit_.name = std::move(name); }

  // `split_dim`: the dimension tensor parallelism splits, -1 if replicated.
  void Add(std::string name, std::vector<int64_t> shape, int split_dim, bool no_decay = false) {
    ParamSpec p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.no_decay = no_decay;
    p.tp_split_dim = split_dim;
    unit_.params.push_back(std::move(p));
  }

  // Makes the last param added an alias of `owner` (its settings are the
  // owner's: Add's defaults for a weight).
  void TieLast(ParamRef owner) { unit_.params.back().tied_to = std::move(owner); }

  void AppendTo(ModelDescription& model) { model.spec.units.push_back(std::move(unit_)); }

 private:
  UnitSpec unit_;
};

constexpr int kReplicated = -1;

void AddNorm(UnitBuilder& unit, const std::string& prefix, const TransformerShape& s) {
  unit.Add(prefix + ".weight", {s.hidden}, kReplicated, /*no_decay=*/true);
  if (s.layer_norm_bias) unit.Add(prefix + ".bias", {s.hidden}, kReplicated, /*no_decay=*/true);
}

// GPT-2 names and Conv1D shapes ([in, out]); column-parallel layers split
// their output dimension (1), row-parallel layers their input dimension (0).
void AddGpt2Layer(UnitBuilder& unit, const TransformerShape& s) {
  const int64_t h = s.hidden;
  const int64_t qkv = (s.heads + 2 * s.kv_heads) * s.head_dim;
  const int64_t attn = s.heads * s.head_dim;
  AddNorm(unit, "ln_1", s);
  unit.Add("attn.c_attn.weight", {h, qkv}, 1);
  if (s.qkv_bias) unit.Add("attn.c_attn.bias", {qkv}, 0, true);
  unit.Add("attn.c_proj.weight", {attn, h}, 0);
  if (s.attn_out_bias) unit.Add("attn.c_proj.bias", {h}, kReplicated, true);
  AddNorm(unit, "ln_2", s);
  unit.Add("mlp.c_fc.weight", {h, s.intermediate}, 1);
  if (s.mlp_bias) unit.Add("mlp.c_fc.bias", {s.intermediate}, 0, true);
  unit.Add("mlp.c_proj.weight", {s.intermediate, h}, 0);
  if (s.mlp_bias) unit.Add("mlp.c_proj.bias", {h}, kReplicated, true);
}

// Llama-family names and nn.Linear shapes ([out, in]): column-parallel
// layers split dimension 0, row-parallel layers dimension 1. The attention
// half of a layer (Llama, Mistral, Qwen2, Mixtral), with its two norms.
void AddLlamaAttention(UnitBuilder& unit, const TransformerShape& s) {
  const int64_t h = s.hidden;
  const int64_t q = s.heads * s.head_dim;
  const int64_t kv = s.kv_heads * s.head_dim;
  AddNorm(unit, "input_layernorm", s);
  unit.Add("self_attn.q_proj.weight", {q, h}, 0);
  if (s.qkv_bias) unit.Add("self_attn.q_proj.bias", {q}, 0, true);
  unit.Add("self_attn.k_proj.weight", {kv, h}, 0);
  if (s.qkv_bias) unit.Add("self_attn.k_proj.bias", {kv}, 0, true);
  unit.Add("self_attn.v_proj.weight", {kv, h}, 0);
  if (s.qkv_bias) unit.Add("self_attn.v_proj.bias", {kv}, 0, true);
  unit.Add("self_attn.o_proj.weight", {h, q}, 1);
  if (s.attn_out_bias) unit.Add("self_attn.o_proj.bias", {h}, kReplicated, true);
  AddNorm(unit, "post_attention_layernorm", s);
}

void AddLlamaLayer(UnitBuilder& unit, const TransformerShape& s) {
  const int64_t h = s.hidden;
  AddLlamaAttention(unit, s);
  if (s.gated_mlp) {
    unit.Add("mlp.gate_proj.weight", {s.intermediate, h}, 0);
    if (s.mlp_bias) unit.Add("mlp.gate_proj.bias", {s.intermediate}, 0, true);
  }
  unit.Add("mlp.up_proj.weight", {s.intermediate, h}, 0);
  if (s.mlp_bias) unit.Add("mlp.up_proj.bias", {s.intermediate}, 0, true);
  unit.Add("mlp.down_proj.weight", {h, s.intermediate}, 1);
  if (s.mlp_bias) unit.Add("mlp.down_proj.bias", {h}, kReplicated, true);
}

// Mixtral: Mistral's attention, then a router and `experts` SwiGLU experts
// (w1 gate, w3 up: column-parallel; w2 down: row-parallel). The router is
// replicated across the tensor-parallel group.
// (The reader never sets attention biases for Mixtral.)
void AddMixtralLayer(UnitBuilder& unit, const TransformerShape& s) {
  const int64_t h = s.hidden;
  AddLlamaAttention(unit, s);
  unit.Add("block_sparse_moe.gate.weight", {s.experts, h}, kReplicated);
  for (int64_t e = 0; e < s.experts; ++e) {
    const std::string expert = absl::StrCat("block_sparse_moe.experts.", e, ".");
    unit.Add(expert + "w1.weight", {s.intermediate, h}, 0);
    unit.Add(expert + "w2.weight", {h, s.intermediate}, 1);
    unit.Add(expert + "w3.weight", {s.intermediate, h}, 0);
  }
}

constexpr char kExpertPrefix[] = "block_sparse_moe.experts.0.";

// ModelSpec::Validate, its error naming the model and the sizes it came from.
absl::Status ValidateWithSizes(const ModelSpec& spec, const TransformerShape& s,
                               const std::string& name) {
  absl::Status valid = spec.Validate();
  if (valid.ok()) return valid;
  return absl::InvalidArgumentError(absl::StrCat(
      "model '", name, "': ", valid.message(), " (from the config's sizes: hidden ", s.hidden,
      ", intermediate ", s.intermediate, ", vocabulary ", s.vocab, ", layers ", s.layers, ")"));
}

}  // namespace

absl::StatusOr<ModelDescription> BuildTransformerModel(const TransformerShape& s,
                                                       const std::string& name) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("model '", name, "': ", what));
  };
  const std::pair<const char*, int64_t> sizes[] = {
      {"hidden size", s.hidden},      {"number of layers", s.layers},
      {"attention heads", s.heads},   {"key/value heads", s.kv_heads},
      {"head dimension", s.head_dim}, {"intermediate size", s.intermediate},
      {"vocabulary size", s.vocab},
  };
  for (const auto& [what, value] : sizes) {
    if (value <= 0) return bad(absl::StrFormat("%s is %d; it must be positive", what, value));
  }
  if (s.layers > kMaxLayers) {
    return bad(absl::StrFormat("%d layers exceed the supported maximum %d", s.layers, kMaxLayers));
  }
  if (s.heads % s.kv_heads != 0) {
    return bad(absl::StrFormat("%d key/value heads do not divide %d attention heads", s.kv_heads,
                               s.heads));
  }
  if (s.learned_positions && s.max_positions <= 0) {
    return bad("learned position embeddings need a positive max_position_embeddings (n_positions)");
  }
  const bool moe = s.architecture == "MixtralForCausalLM";
  if (moe != (s.experts > 0)) {
    return bad(moe ? "a Mixtral model needs experts (num_local_experts >= 1)"
                   : absl::StrCat(s.architecture, " is a dense architecture but ", s.experts,
                                  " experts are given"));
  }
  if (moe &&
      (s.experts > kMaxExperts || s.experts_per_token < 1 || s.experts_per_token > s.experts)) {
    return bad(absl::StrFormat(
        "%d experts with %d per token: need 1 <= experts per token <= experts <= %d", s.experts,
        s.experts_per_token, kMaxExperts));
  }
  // The layer builders multiply these; the ModelSpec check covers the rest.
  const std::optional<int64_t> q = CheckedMul(s.heads, s.head_dim);
  const std::optional<int64_t> kv = CheckedMul(s.kv_heads, s.head_dim);
  const std::optional<int64_t> qkv = q && kv ? (CheckedInt64(*kv) * 2 + *q).value() : std::nullopt;
  if (!qkv.has_value()) {
    return bad(absl::StrFormat(
        "attention heads %d x head dimension %d does not fit in a 64-bit count; check "
        "num_attention_heads, num_key_value_heads and head_dim",
        s.heads, s.head_dim));
  }
  const bool gpt2_names = s.architecture == "GPT2LMHeadModel";
  ModelDescription model;
  model.name = name;
  model.transformer = s;

  UnitBuilder embed("embed");
  // Token embeddings are vocabulary-parallel (Megatron splits dimension 0).
  embed.Add(gpt2_names ? "wte.weight" : "embed_tokens.weight", {s.vocab, s.hidden}, 0);
  if (s.learned_positions) {
    embed.Add(gpt2_names ? "wpe.weight" : "embed_positions.weight", {s.max_positions, s.hidden},
              kReplicated);
  }
  embed.AppendTo(model);

  model.first_layer_unit = 1;
  model.num_layer_units = static_cast<int>(s.layers);
  for (int64_t i = 0; i < s.layers; ++i) {
    UnitBuilder layer(absl::StrCat(gpt2_names ? "h." : "layers.", i));
    if (gpt2_names) {
      AddGpt2Layer(layer, s);
    } else if (moe) {
      AddMixtralLayer(layer, s);
    } else {
      AddLlamaLayer(layer, s);
    }
    layer.AppendTo(model);
    if (i == 0) {
      // Every layer has the same params: refuse a model with too many
      // tensors or elements before building the other layers.
      const int64_t per_layer = static_cast<int64_t>(model.spec.units.back().params.size());
      if (per_layer * s.layers > kMaxModelTensors) {
        return bad(absl::StrFormat(
            "%d layers of %d params (tensors) each exceed the supported %d params in a model",
            s.layers, per_layer, kMaxModelTensors));
      }
      ZS_RETURN_IF_ERROR(ValidateWithSizes(model.spec, s, name));
      const CheckedInt64 elements = CheckedInt64(model.spec.units.back().NumElements()) * s.layers +
                                    model.spec.units.front().NumElements();
      if (!elements.ok() || *elements.value() > kMaxModelElements) {
        return bad(absl::StrFormat(
            "%d layers of %d params each pass the supported maximum of %d (2^56) params in a "
            "model; check the config's sizes",
            s.layers, model.spec.units.back().NumElements(), kMaxModelElements));
      }
    }
  }

  UnitBuilder final_norm("final_norm");
  AddNorm(final_norm, gpt2_names ? "ln_f" : "norm", s);
  final_norm.AppendTo(model);
  // The head is vocabulary-parallel, as the token embedding. Tied: the
  // same unit holds an alias of the token embedding (ParamSpec::tied_to),
  // stored once as the embedding's, which is how a trainer on the engine
  // runs a tied head after the final norm (the GPT example does).
  UnitBuilder head("lm_head");
  head.Add("lm_head.weight", {s.vocab, s.hidden}, 0);
  if (s.tied_embeddings) {
    head.TieLast(ParamRef{"embed", model.spec.units.front().params.front().name});
  }
  head.AppendTo(model);
  ZS_RETURN_IF_ERROR(ValidateWithSizes(model.spec, s, name));
  // Stored elements: the tied head is the embedding's, counted once.
  model.active_params = model.spec.NumStoredParams();
  if (moe) {
    // Each token passes through experts_per_token of the experts; the
    // others' params do no work for it. Below NumParams(), so exact.
    int64_t expert_numel = 0;
    for (const ParamSpec& p : model.spec.units[model.first_layer_unit].params) {
      if (absl::StartsWith(p.name, kExpertPrefix)) expert_numel += p.NumElements();
    }
    model.active_params -= s.layers * (s.experts - s.experts_per_token) * expert_numel;
  }
  return model;
}

}  // namespace zeroshard::internal

namespace zeroshard {
namespace {

// A weight AddLoraAdapters adapts, and how it reads its shape.
struct AdaptedWeight {
  bool adapted = false;
  bool expert = false;  // a Mixtral expert's: only experts_per_token of them are active
};

AdaptedWeight LoraTarget(const ParamSpec& param, bool gpt2) {
  const std::string& name = param.name;
  // Adapters themselves are never adapted (a second AddLoraAdapters).
  if (param.shape.size() != 2 || absl::StrContains(name, ".lora_")) return {};
  if (gpt2) {
    for (const char* w :
         {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
      if (name == w) return {true, false};
    }
    return {};
  }
  if ((absl::StartsWith(name, "self_attn.") || absl::StartsWith(name, "mlp.")) &&
      absl::EndsWith(name, "_proj.weight")) {
    return {true, false};
  }
  if (absl::StartsWith(name, "block_sparse_moe.experts.") && absl::EndsWith(name, ".weight")) {
    return {true, true};
  }
  return {};
}

}  // namespace

absl::Status AddLoraAdapters(ModelDescription& model, int64_t rank) {
  if (!model.transformer.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", model.name,
        "': LoRA adapters need a transformer (a preset or an HF config); for a JSON spec, "
        "list the adapters in the spec and mark the base weights \"trainable\": false"));
  }
  if (rank < 1 || rank > kMaxLoraRank) {
    return absl::InvalidArgumentError(
        absl::StrFormat("LoRA rank %d is outside [1, %d]", rank, kMaxLoraRank));
  }
  const TransformerShape& t = *model.transformer;
  const bool gpt2 = t.architecture == "GPT2LMHeadModel";
  const int first = model.first_layer_unit;
  const int end = first + model.num_layer_units;
  // Count before building: a Mixtral with thousands of experts per layer
  // must be refused, not allocated.
  CheckedInt64 adapters = 0;
  CheckedInt64 elements = model.spec.NumParams();
  for (int u = first; u < end; ++u) {
    for (const ParamSpec& p : model.spec.units[u].params) {
      if (!LoraTarget(p, gpt2).adapted) continue;
      const int64_t smaller = std::min(p.shape[0], p.shape[1]);
      if (rank > smaller) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model '%s': LoRA rank %d exceeds the smaller side (%d) of %s.%s [%d, %d]; use a "
            "rank of %d or less",
            model.name, rank, smaller, model.spec.units[u].name, p.name, p.shape[0], p.shape[1],
            smaller));
      }
      adapters += 2;
      elements += CheckedInt64(rank) * (p.shape[0] + p.shape[1]);
    }
  }
  CheckedInt64 all_tensors = adapters;
  for (const UnitSpec& unit : model.spec.units) {
    all_tensors += static_cast<int64_t>(unit.params.size());
  }
  if (!all_tensors.ok() || *all_tensors.value() > kMaxModelTensors || !elements.ok() ||
      *elements.value() > kMaxModelElements) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': LoRA rank %d adapters bring the model past %d params (tensors) or %d "
        "elements; lower the rank",
        model.name, rank, kMaxModelTensors, kMaxModelElements));
  }
  // Built on a copy: on an error `model` is left as it was.
  ModelSpec spec = model.spec;
  for (UnitSpec& unit : spec.units) {
    for (ParamSpec& p : unit.params) p.trainable = false;
  }
  // Below kMaxModelElements (checked above), so plain sums cannot overflow.
  int64_t dense_added = 0;
  int64_t expert_added = 0;
  for (int u = first; u < end; ++u) {
    std::vector<ParamSpec> params;
    for (ParamSpec& w : spec.units[u].params) {
      const AdaptedWeight target = LoraTarget(w, gpt2);
      params.push_back(w);
      if (!target.adapted) continue;
      // nn.Linear stores [out, in]; GPT-2's Conv1D [in, out].
      const int out_dim = gpt2 ? 1 : 0;
      const int64_t out = w.shape[out_dim];
      const int64_t in = w.shape[1 - out_dim];
      const std::string stem = w.name.substr(0, w.name.size() - std::string(".weight").size());
      ParamSpec a;
      a.name = stem + ".lora_A.weight";
      a.shape = {rank, in};
      // A row-parallel W splits its input side: A follows; B is whole.
      a.tp_split_dim = w.tp_split_dim == 1 - out_dim ? 1 : -1;
      ParamSpec b;
      b.name = stem + ".lora_B.weight";
      b.shape = {out, rank};
      // A column-parallel W splits its output side: B follows; A is whole.
      b.tp_split_dim = w.tp_split_dim == out_dim ? 0 : -1;
      const int64_t added = rank * (in + out);
      (target.expert ? expert_added : dense_added) += added;
      params.push_back(std::move(a));
      params.push_back(std::move(b));
    }
    spec.units[u].params = std::move(params);
  }
  absl::Status valid = spec.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model.name, "' with LoRA rank ", rank, ": ", valid.message()));
  }
  model.spec = std::move(spec);
  if (model.active_params > 0) {
    // A token passes through experts_per_token of the experts (and their
    // adapters); every expert has the same shapes, so the division is exact.
    model.active_params +=
        dense_added + (t.experts > 0 ? expert_added / t.experts * t.experts_per_token : 0);
  }
  model.name = absl::StrCat(model.name, " + LoRA r", rank);
  return absl::OkStatus();
}

}  // namespace zeroshard
