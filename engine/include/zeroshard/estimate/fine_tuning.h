// Fine-tuning a model description: LoRA adapters on a transformer's
// projections and frozen params (`zeroshard estimate --lora R --freeze P`).
// Both only set ParamSpec::trainable and add params; the planner counts a
// frozen param as params only (no gradient, fp32 master or Adam moments).
#ifndef ZEROSHARD_ESTIMATE_FINE_TUNING_H_
#define ZEROSHARD_ESTIMATE_FINE_TUNING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/model_spec.h"

namespace zeroshard {

// The largest LoRA rank AddLoraAdapters accepts (it also needs the rank to
// be at most the smaller side of every adapted weight).
inline constexpr int64_t kMaxLoraRank = 65536;

// LoRA (Hu et al. 2021) on a transformer built from a preset or an HF
// config: every param is frozen, then each adapted weight W of every layer
// gains two trainable params right after it, named as PEFT names them:
// "<W>.lora_A.weight" [rank, in] and "<W>.lora_B.weight" [out, rank]
// ("<W>" is W's name without ".weight"). Adapted weights: the attention
// projections (Llama family: self_attn.q_proj, k_proj, v_proj, o_proj;
// GPT-2: attn.c_attn, attn.c_proj) and the MLP projections (mlp.gate_proj,
// up_proj, down_proj; GPT-2: mlp.c_fc, mlp.c_proj; Mixtral: every expert's
// w1, w2, w3, not the router). in and out are the nn.Linear sides ([out,
// in]; GPT-2's Conv1D stores [in, out]). Tensor parallelism splits B along
// out for a column-parallel W and A along in for a row-parallel W; the other
// factor is replicated. The name gains " + LoRA r<rank>" and active_params
// the adapters a token passes through. InvalidArgument when the model is not
// a transformer (a --spec or --params model: put the adapters in the spec
// and mark the base weights "trainable": false instead), when rank is
// outside [1, kMaxLoraRank] or above the smaller side of an adapted weight
// (naming it), or when the adapted spec breaks a ModelSpec limit; `model`
// is then unchanged. Params named "*.lora_*" (adapters already added) are
// never adapted again. Implemented beside BuildTransformerModel
// (plan/transformer_spec.cc), which names the weights.
absl::Status AddLoraAdapters(ModelDescription& model, int64_t rank);

// Whether a freeze pattern matches the param `name` of unit `unit`. The
// param's full name is "<unit>.<param>" (e.g. "layers.3.mlp.up_proj.weight",
// "embed.embed_tokens.weight"). The pattern is a glob over the full name:
// `*` matches any run of characters, dots included, `?` any one character,
// every other character itself. A pattern also matches everything below
// it: P matches what P.* matches, so "embed" freezes the whole unit "embed"
// and "layers.0" the first layer (but not "layers.07").
bool FreezePatternMatches(absl::string_view pattern, absl::string_view unit,
                          absl::string_view name);

// Sets trainable = false on every param that `pattern` matches
// (FreezePatternMatches). A tied param and its owner are one tensor: when
// either matches, both are frozen. InvalidArgument, naming the pattern and
// an example param name, when it matches no param.
absl::Status FreezeParams(ModelSpec& spec, absl::string_view pattern);

// Elements stored for a spec, split by ParamSpec::trainable. A tied param
// (tied_to) is its owner's tensor and is not counted again.
struct ParamCounts {
  int64_t trainable = 0;
  int64_t frozen = 0;
  int64_t total() const { return trainable + frozen; }
};
// `spec` must have passed Validate() (so the sums fit in int64_t).
ParamCounts CountParams(const ModelSpec& spec);

}  // namespace zeroshard

#endif  // ZEROSHARD_ESTIMATE_FINE_TUNING_H_
