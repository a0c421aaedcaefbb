// The GPT example's model: a GPT-2-architecture decoder described by a
// Hugging Face config.json, as the engine's ModelSpec.
//
// Units, in forward order (the names are GPT-2's, so that a checkpoint
// exports to Hugging Face by a rename, docs/gpt.md):
//   0          "embed"       wte.weight [V, C], wpe.weight [P, C]
//   1 .. L     "h.i"         GPT-2's 12 block params (internal::BlockParam order)
//   L + 1      "final_norm"  ln_f.weight [C], ln_f.bias [C]
//   L + 2      "lm_head"     lm_head.weight [V, C], tied to embed's wte.weight
// The head is the engine's tied param (ParamSpec::tied_to): stored once, its
// two uses' gradients summed by the engine. Weight decay applies to the four
// matmul weights of each block only; biases, LayerNorms and the embeddings
// (hence the tied head) are no_decay, as nanoGPT groups them.
#ifndef ZEROSHARD_EXAMPLES_GPT_GPT_MODEL_H_
#define ZEROSHARD_EXAMPLES_GPT_GPT_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/gpt/internal/gpt_math.h"
#include "zeroshard/engine.h"
#include "zeroshard/model_spec.h"

namespace zeroshard {
namespace gpt {

struct GptConfig {
  int64_t layers = 0;      // n_layer
  int64_t heads = 0;       // n_head
  int64_t width = 0;       // n_embd
  int64_t positions = 0;   // n_positions
  int64_t vocab = 0;       // vocab_size
  double eps = 1e-5;       // layer_norm_epsilon
  double init_std = 0.02;  // initializer_range: --seed's initialisation only
  // The config's dropout probabilities that are not zero (given, or
  // transformers' default 0.1 for a field left out), e.g. "attn_pdrop 0.1":
  // the trainer computes no dropout, and gpt_train says so once.
  std::vector<std::string> dropout_ignored;
  // The config.json object as read (exported with the weights; kept in
  // checkpoints as the trainer state's "hf_config").
  std::string json;

  int embed_unit() const { return 0; }
  int block_unit(int64_t i) const { return static_cast<int>(1 + i); }
  int final_norm_unit() const { return static_cast<int>(layers + 1); }
  int head_unit() const { return static_cast<int>(layers + 2); }
  int num_units() const { return static_cast<int>(layers + 3); }
};

// Reads a GPT-2 config.json with the estimator's reader (ParseHfConfig), so
// that `zeroshard estimate --hf-config` and the trainer read one file the
// same way. Refuses, naming the field, what the trainer does not compute:
// another architecture, untied embeddings, n_inner other than 4 n_embd, an
// activation other than gelu_new, scale_attn_weights false,
// scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn true,
// add_cross_attention true. Dropout is not computed either; the fields are
// accepted and listed in GptConfig::dropout_ignored.
absl::StatusOr<GptConfig> ParseGptConfig(const std::string& json_text, const std::string& origin);
absl::StatusOr<GptConfig> ReadGptConfig(const std::string& path);
// A config.json for the given sizes (tests, and --print-config).
std::string GptConfigJson(int64_t layers, int64_t heads, int64_t width, int64_t positions,
                          int64_t vocab);

ModelSpec BuildGptModelSpec(const GptConfig& cfg);

// The model's identity: every field that fixes its shapes or its math, as
// a JSON object of name -> value. The config.json fields the trainer reads
// (resolved: a field left out has its default), the tie, the vocabulary
// before padding, and the version of the rules by which a grid splits the
// model (GridGptTrainer). Every checkpoint records it in its trainer state
// ("model"); CheckSameModel compares it on every path that takes weights
// from elsewhere (a resume on one rank or on a grid, --init-from).
std::string GptModelIdentity(const GptConfig& cfg);
// The identity's field names, in order (the test walks them).
std::vector<std::string> GptModelIdentityFields();
// The identity a checkpoint's trainer state records: its "model" object,
// or, for a checkpoint written before the identity was recorded, the one
// its "hf_config" gives. FailedPrecondition naming `origin` when it has
// neither (not a gpt_train checkpoint).
absl::StatusOr<std::string> RecordedGptModelIdentity(const std::string& trainer_state_json,
                                                     const std::string& origin);
// OK when the identities `there` (of the weights' source, named `source`)
// and `here` (of this run's config, named `config`) are equal field for
// field. Else FailedPrecondition: "<source>: the weights belong to another
// model: n_head is 2 there and 4 in <config>; ..." (every field that
// differs, both values), then `remedy`.
absl::Status CheckSameModel(const std::string& there, const std::string& here,
                            const std::string& source, const std::string& config,
                            const std::string& remedy);

// GPT-2's initialisation, from `seed` alone (every rank computes the same
// values): weights N(0, 0.02), the two residual projections (attn.c_proj,
// mlp.c_proj) N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1. Sets
// every stored param through Engine::SetParam (collective).
absl::Status InitGptParams(Engine& engine, const GptConfig& cfg, uint64_t seed);
// One param's initial values (unit and param indices of BuildGptModelSpec).
std::vector<float> InitialParam(const GptConfig& cfg, int unit, int param, uint64_t seed);

internal::GptDims Dims(const GptConfig& cfg, int64_t micro_batch, int64_t seq);

}  // namespace gpt
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_GPT_GPT_MODEL_H_
