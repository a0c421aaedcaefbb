// The GPT trainer's weights as a Hugging Face GPT-2 directory, both ways:
// reading model.safetensors as initial weights (`--init-from DIR`) and
// writing the initial weights without a checkpoint (`--save-init DIR`).
// Public API only (ModelSpec and the dtype rules), no engine internals.
//
// Names: the ModelSpec's params already have GPT-2's layouts (Conv1D weights
// [in, out]); HfGpt2Name maps unit "embed" and "final_norm" to
// "transformer.<param>", "h.<i>" to "transformer.h.<i>.<param>" and
// "lm_head" to "<param>" (lm_head.weight, tied to embed's wte.weight).
#ifndef ZEROSHARD_EXAMPLES_GPT_HF_WEIGHTS_H_
#define ZEROSHARD_EXAMPLES_GPT_HF_WEIGHTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_model.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"
#include "zeroshard/input_file.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::gpt {

// Values of every param of a ModelSpec: [unit][param][element], row-major in
// the param's shape. A tied alias's entry is empty (its values are its
// owner's).
using ParamValues = std::vector<std::vector<std::vector<float>>>;

// Hugging Face GPT-2's name of param `param` of unit `unit` (see above);
// InvalidArgument naming the unit for a unit the GPT trainer does not have.
absl::StatusOr<std::string> HfGpt2Name(const std::string& unit, const std::string& param);

// Reads `dir`/model.safetensors (or `dir` itself when it is a file) as
// values for `spec`. Accepts F32, BF16 and F16 tensors (converted exactly to
// fp32), names with or without the "transformer." prefix (GPT2LMHeadModel's
// and GPT2Model's state dicts), and lm_head.weight present or absent: when
// present it must equal transformer.wte.weight (after conversion), as it
// does in a tied model. The causal-mask buffers older GPT-2 files carry
// (h.<i>.attn.bias, h.<i>.attn.masked_bias) are skipped. InvalidArgument
// naming the file and the tensor for: a param of `spec` with no tensor, a
// tensor `spec` has no param for (or two names for one param), a shape that
// differs from the spec's (both shapes given), another dtype, an
// lm_head.weight that differs from wte, a damaged header or data range.
// NotFound when there is no model.safetensors (a sharded checkpoint,
// model.safetensors.index.json, is not supported: say so); OpenHfGpt2Weights's
// errors.
absl::StatusOr<ParamValues> ReadHfGpt2Weights(const std::string& dir, const ModelSpec& spec);

// `dir`/model.safetensors (or `dir` itself when it is not a directory),
// opened as every input file is (zeroshard/input_file.h): a FIFO, a device, a
// socket or a directory is refused (FailedPrecondition, saying what it is)
// before a byte is read; the file's size is known, and ReadHfGpt2Weights
// reads only within it. NotFound as ReadHfGpt2Weights says. The trainer
// calls it before anything starts, so that bad weights are refused at once.
absl::StatusOr<InputFile> OpenHfGpt2Weights(const std::string& dir);

// Compares the model of `dir`/config.json with the run's (`run`, read from
// `run_config_path`): their identities (GptModelIdentity: every field that
// fixes the shapes or the math, since the weights' shapes do not show
// n_head, the epsilon or the activation) must be equal. FailedPrecondition
// naming every field that differs with both values, or when `dir` has no
// config.json; the config's own errors (ParseGptConfig) as they are.
absl::Status CheckHfGpt2Config(const std::string& dir, const GptConfig& run,
                               const std::string& run_config_path);

// Writes `dir`/model.safetensors (every param of `spec` but tied aliases,
// under HfGpt2Name, in `dtype`: kFloat32 exactly or kBFloat16 rounded to
// nearest even; metadata {"format": "pt"}) and `dir`/config.json
// (`hf_config_json`, a JSON object: the run's config.json, plus
// "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
// "tie_word_embeddings": true and the dropouts 0), so that
// GPT2LMHeadModel.from_pretrained(dir) loads it with no missing or
// unexpected keys. `values` as ReadHfGpt2Weights returns them (an alias's
// entry empty, or equal to its owner's). Atomic: written into a temporary
// directory beside `dir` and renamed when complete; nothing is left on an
// error. InvalidArgument when `dir` exists and is not an empty directory,
// values do not match the spec's sizes (naming the param), the config is
// not a JSON object, or dtype is not fp32 or bf16; Internal for I/O errors
// (naming the file).
absl::Status WriteHfGpt2Dir(const std::string& dir, const ModelSpec& spec,
                            const ParamValues& values, const std::string& hf_config_json,
                            DType dtype = DType::kFloat32);

// Engine::SetParam of every param of engine.model() but tied aliases, from
// `values` (as ReadHfGpt2Weights returns them): the trainer's --init-from.
// Before Start(); every rank passes the same values. The engine's errors
// (a wrong size names the param), or InvalidArgument when `values` does not
// have the model's units and params.
absl::Status SetEngineParams(Engine& engine, const ParamValues& values);

// Engine::GetParam of every param of engine.model() but tied aliases (their
// entries empty): what WriteHfGpt2Dir takes (the trainer's --save-init).
// Collective when the weights are sharded: every rank calls it together.
absl::StatusOr<ParamValues> GetEngineParams(Engine& engine);

}  // namespace zeroshard::gpt

#endif  // ZEROSHARD_EXAMPLES_GPT_HF_WEIGHTS_H_
