// The flags that size the residual MLP (--hidden, --blocks, --micro-batch),
// registered the same way by mlp_demo and every benchmark that trains it.
// Header-only; the program links zs_cli_flags.
#ifndef ZEROSHARD_EXAMPLES_MLP_MODEL_FLAGS_H_
#define ZEROSHARD_EXAMPLES_MLP_MODEL_FLAGS_H_

#include "cli/flags.h"
#include "examples/mlp/mlp.h"

namespace zeroshard {
namespace mlp {

// Registers --hidden, --blocks (at least `min_blocks`) and --micro-batch,
// each an integer up to cli::kMaxCount, into *model.
inline cli::FlagSet& AddModelFlags(cli::FlagSet& flags, MlpConfig* model, int min_blocks = 1) {
  return flags.Int("hidden", &model->hidden, 1, cli::kMaxCount)
      .Int("blocks", &model->blocks, min_blocks, cli::kMaxCount)
      .Int("micro-batch", &model->micro_batch, 1, cli::kMaxCount);
}

}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_MODEL_FLAGS_H_
