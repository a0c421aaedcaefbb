// `zeroshard export CKPT --hf OUTDIR`: a GPT checkpoint (the ModelSpec of
// examples/gpt, whose params already have Hugging Face GPT-2's layouts) as a
// directory that transformers' GPT2LMHeadModel.from_pretrained loads:
// model.safetensors under HF's names and config.json.
#ifndef ZEROSHARD_TOOLS_HF_EXPORT_H_
#define ZEROSHARD_TOOLS_HF_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/dtype.h"

namespace zeroshard::tools {

// Hugging Face GPT-2's name of param `param` of unit `unit` of the GPT
// trainer's ModelSpec: "transformer.<param>" for the units "embed" and
// "final_norm", "transformer.h.<i>.<param>" for "h.<i>", "<param>" for
// "lm_head" (lm_head.weight, the tied alias of embed's wte.weight, which is
// never written). InvalidArgument naming the unit for any other unit.
absl::StatusOr<std::string> HfGpt2TensorName(const std::string& unit, const std::string& param);

// The config.json to write for a checkpoint whose trainer state (a JSON
// object, CheckpointInfo::trainer_state) holds "hf_config": that object
// plus "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
// "tie_word_embeddings": true, the three dropouts 0 (the trainer has none)
// and "torch_dtype" for `dtype`; pretty-printed. FailedPrecondition naming
// `source` when the state has no "hf_config" object (a checkpoint not
// written by the GPT trainer), InvalidArgument when it is not JSON.
absl::StatusOr<std::string> HfGpt2ConfigJson(const std::string& trainer_state, DType dtype,
                                             const std::string& source);

// Writes `out_dir`/model.safetensors (ExportSafetensors with HfGpt2TensorName)
// and `out_dir`/config.json (HfGpt2ConfigJson) for the checkpoint `path`.
// Atomic: both are written into a temporary directory beside `out_dir`,
// synced, and the directory is renamed to `out_dir` when complete; on any
// error nothing is left. `out_dir` must not exist or be an empty directory
// (InvalidArgument otherwise, before anything is read), and must not lie in
// the checkpoint directory. Errors of ReadCheckpointInfo, HfGpt2ConfigJson
// and ExportSafetensors otherwise.
absl::Status ExportHfGpt2(const std::string& path, const std::string& out_dir, DType dtype,
                          ExportStats* stats, const CheckpointProgress& progress = {});

}  // namespace zeroshard::tools

#endif  // ZEROSHARD_TOOLS_HF_EXPORT_H_
