// ModelDescription: a ModelSpec plus what the planner needs beyond the params
// themselves (transformer shape for activations and tensor parallelism,
// which units are layers for pipeline stages).
#ifndef ZEROSHARD_ESTIMATE_MODEL_DESCRIPTION_H_
#define ZEROSHARD_ESTIMATE_MODEL_DESCRIPTION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zeroshard/model_spec.h"

namespace zeroshard {

// Transformer layers a model may have (one unit each). Checked before any
// unit is built, so a config with 10^8 layers is refused, not allocated.
inline constexpr int64_t kMaxLayers = 16384;
// Experts per layer of a mixture of experts.
inline constexpr int64_t kMaxExperts = 4096;

// A decoder-only transformer as a Hugging Face config.json describes it.
struct TransformerShape {
  std::string architecture;  // e.g. "LlamaForCausalLM", "GPT2LMHeadModel", "MixtralForCausalLM"
  int64_t hidden = 0;        // h
  int64_t layers = 0;        // L
  int64_t heads = 0;         // a (attention heads)
  int64_t kv_heads = 0;      // key/value heads (grouped-query attention); == heads for MHA
  int64_t head_dim = 0;      // usually hidden / heads
  int64_t intermediate = 0;  // MLP width f
  int64_t vocab = 0;         // V
  int64_t max_positions = 0;
  // Mixture of experts (Mixtral): experts per layer and experts each token
  // is routed to; 0 for a dense MLP.
  int64_t experts = 0;
  int64_t experts_per_token = 0;
  bool gated_mlp = false;          // SwiGLU: gate, up and down projections (Llama family)
  bool tied_embeddings = false;    // the LM head reuses the token embedding
  bool qkv_bias = false;           // biases on q/k/v (GPT-2, Qwen2)
  bool attn_out_bias = false;      // bias on the attention output projection (GPT-2)
  bool mlp_bias = false;           // biases on the MLP projections (GPT-2)
  bool layer_norm_bias = false;    // LayerNorm (weight and bias) rather than RMSNorm
  bool learned_positions = false;  // a position-embedding table (GPT-2)
  bool dropout = false;            // stores dropout masks (GPT-2); Llama-family configs use none
};

struct ModelDescription {
  std::string name;  // preset name, file name, or "params"
  ModelSpec spec;
  std::optional<TransformerShape> transformer;
  // Params one token passes through, for the FLOP count: a mixture of
  // experts uses only its top-k experts. 0 means all of them
  // (spec.NumStoredParams(): a tied param once), as for dense models and
  // custom specs.
  int64_t active_params = 0;
  // The units that are transformer layers: [first_layer_unit,
  // first_layer_unit + num_layer_units). Pipeline stages split these; units
  // before go to the first stage, units after to the last.
  int first_layer_unit = 0;
  int num_layer_units = 0;
  // The dimension tensor parallelism splits is each param's own
  // ParamSpec::tp_split_dim in `spec` (-1: replicated across the
  // tensor-parallel group, as every param of a JSON spec).
  // Custom specs only: activation bytes one sample keeps per unit (0 when
  // not given). Transformers use the Korthikanti et al. formulas instead.
  std::vector<int64_t> activation_bytes_per_sample;
};

}  // namespace zeroshard

#endif  // ZEROSHARD_ESTIMATE_MODEL_DESCRIPTION_H_
