// Where a ModelDescription comes from: a JSON spec, a Hugging Face
// config.json, a built-in preset, or a bare parameter count. Every error
// names the source (file or preset) and the field, and says what to do.
#ifndef ZEROSHARD_ESTIMATE_MODEL_SOURCE_H_
#define ZEROSHARD_ESTIMATE_MODEL_SOURCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/estimate/model_description.h"

namespace zeroshard {

// A JSON spec:
//   {"name": "my-model",                          (optional)
//    "units": [{"name": "block.0",
//               "activation_bytes_per_sample": 1048576,   (optional, default 0)
//               "params": [{"name": "w", "shape": [512, 128], "no_decay": false}, ...]},
//              ...]}
// InvalidArgument for malformed JSON, missing or mistyped fields, integers
// above 2^63 - 1, more units or params than the ModelSpec limits (checked
// before the units are built), or a spec that fails ModelSpec::Validate.
// `source` names the file in errors.
absl::StatusOr<ModelDescription> ModelFromSpecJson(absl::string_view json_text,
                                                   absl::string_view source);

// The shape fields of a Hugging Face config.json for LlamaForCausalLM,
// MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM or
// GPT2LMHeadModel (picked by "architectures", else "model_type"). Honours
// num_key_value_heads, head_dim, tie_word_embeddings, attention_bias,
// mlp_bias, the dropout probabilities and (Mixtral) num_local_experts and
// num_experts_per_tok. InvalidArgument for other architectures, malformed
// JSON, missing or non-integer fields, sizes that are not positive or above
// their limit (num_hidden_layers / n_layer above kMaxLayers), and a dense
// architecture whose config declares experts (num_local_experts,
// num_experts, n_routed_experts, moe_intermediate_size, ...): counting such
// a model as dense would be silently wrong.
absl::StatusOr<TransformerShape> ParseHfConfig(absl::string_view json_text,
                                               absl::string_view source);

// ParseHfConfig, then BuildTransformerModel.
absl::StatusOr<ModelDescription> ModelFromHfConfig(absl::string_view json_text,
                                                   absl::string_view source);

// A built-in preset (see PresetNames()). NotFound, listing the presets,
// for an unknown name.
absl::StatusOr<ModelDescription> ModelFromPreset(absl::string_view name);
std::vector<std::string> PresetNames();

// `num_params` elements in one unit "params" with one param "flat": what the
// ZeRO paper's formulas count. No activations (there is no architecture).
// InvalidArgument unless 1 <= num_params <= kMaxModelElements.
absl::StatusOr<ModelDescription> ModelFromParamCount(int64_t num_params);

// The most ReadTextFile reads by default. Real inputs are kilobytes (a Llama
// config.json is 1 KiB, a calibrated machine profile 4 KiB, a spec of every
// unit and param the ModelSpec limits allow some 40 MiB); a path that names
// something else (a dataset, a disk image) is refused before it is read.
inline constexpr int64_t kMaxTextFileBytes = int64_t{64} << 20;  // 64 MiB

// The whole of `path` as text: a spec, an HF config.json or a machine
// profile. Only a regular file (or a symlink to one) of at most `max_bytes`
// bytes is read; a FIFO, socket or device (/dev/zero) is refused at once,
// without blocking and without reading a byte. `what` names the file's role
// in messages ("the --spec file"). Every error names the path:
// NotFound (no such file) and PermissionDenied, saying to check the path;
// FailedPrecondition for a file that is not regular (saying what it is);
// OutOfRange for a file above `max_bytes` (both sizes).
absl::StatusOr<std::string> ReadTextFile(const std::string& path,
                                         absl::string_view what = "the input file",
                                         int64_t max_bytes = kMaxTextFileBytes);

}  // namespace zeroshard

#endif  // ZEROSHARD_ESTIMATE_MODEL_SOURCE_H_
