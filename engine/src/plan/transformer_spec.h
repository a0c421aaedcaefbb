// Builds the ModelSpec of a decoder-only transformer: one unit for the
// embeddings, one per layer, one for the final norm and one for the LM head,
// with the Hugging Face param names and shapes, so the count is exact. With
// tied embeddings (tie_word_embeddings; GPT-2 always) the head's
// "lm_head.weight" is an alias of the token embedding (ParamSpec::tied_to):
// stored once, as the engine stores a tied param, so the spec is the one a
// trainer on the engine declares (the GPT example's, examples/gpt/).
#ifndef ZEROSHARD_PLAN_TRANSFORMER_SPEC_H_
#define ZEROSHARD_PLAN_TRANSFORMER_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "zeroshard/estimate/model_description.h"

namespace zeroshard::internal {

// Units: "embed", "layers.<i>" (GPT-2: "h.<i>"), "final_norm", "lm_head"
// (tied: lm_head.weight tied_to embed.wte.weight / embed.embed_tokens.weight;
// ModelSpec::NumParams counts it twice, active_params and the planner's
// counts once: NumStoredParams).
// Llama family (RMSNorm, SwiGLU, grouped-query k/v): q_proj [a*d, h],
// k_proj and v_proj [kv*d, h], o_proj [h, a*d], gate_proj and up_proj [f, h],
// down_proj [h, f]. Mixtral (experts > 0): the attention of Mistral, then
// block_sparse_moe.gate [E, h] (the router) and, per expert i,
// block_sparse_moe.experts.<i>.w1 [f, h], w2 [h, f], w3 [f, h]; the
// description's active_params counts only experts_per_token experts per layer.
// GPT-2 (Conv1D, [in, out]): c_attn [h, 3h], c_proj [h, h],
// c_fc [h, f], mlp.c_proj [f, h], all with biases, LayerNorms with biases,
// learned position embeddings. Norm weights and biases are no_decay.
// InvalidArgument when a size is not positive, kv_heads does not divide
// heads, layers exceed kMaxLayers, experts exceed kMaxExperts (or
// experts_per_token is outside [1, experts]), a product such as heads x
// head_dim overflows, or the spec breaks a ModelSpec limit (more than 2^56
// params in all): all checked before anything proportional to the layer
// count is allocated.
absl::StatusOr<ModelDescription> BuildTransformerModel(const TransformerShape& shape,
                                                       const std::string& name);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_PLAN_TRANSFORMER_SPEC_H_
