#include "engine/src/plan/gpt_example_tensors.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "zeroshard/estimate/fine_tuning.h"

namespace zeroshard::internal {
namespace {

absl::Status NotTheExample(const ModelDescription& model, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--activations gpt-example counts the GPT example's tensors (examples/gpt), but model '",
      model.name, "' ", why, "; use --activations korthikanti for other models"));
}

// Largest per-unit element count over `model`'s units, an alias counted in
// the unit that reads it (the trainer's buffer for one unit holds it);
// trainable params only when `trainable_only`. Validated specs stay below
// 2^56 elements, so the sums cannot overflow.
int64_t LargestUnit(const ModelSpec& spec, bool trainable_only) {
  int64_t largest = 0;
  for (const UnitSpec& unit : spec.units) {
    int64_t n = 0;
    for (const ParamSpec& p : unit.params) {
      if (!trainable_only || p.trainable) n += p.NumElements();
    }
    largest = std::max(largest, n);
  }
  return largest;
}

}  // namespace

absl::StatusOr<std::vector<TrainerTensor>> GptExampleTensors(const ModelDescription& model,
                                                             const PlanOptions& options) {
  if (!model.transformer.has_value()) {
    return NotTheExample(model, "is not a transformer (give --config / --hf-config)");
  }
  const TransformerShape& t = *model.transformer;
  if (t.architecture != "GPT2LMHeadModel") {
    return NotTheExample(model, absl::StrCat("is a ", t.architecture, ", not a GPT2LMHeadModel"));
  }
  if (!t.tied_embeddings) {
    return NotTheExample(model, "has tie_word_embeddings false; the example ties its LM head");
  }
  if (t.intermediate != 4 * t.hidden || t.heads * t.head_dim != t.hidden) {
    return NotTheExample(
        model, absl::StrFormat("has n_inner %d and %d heads of %d with n_embd %d; the example "
                               "needs n_inner = 4 n_embd and n_head x head_dim = n_embd",
                               t.intermediate, t.heads, t.head_dim, t.hidden));
  }
  // The example trains every param of GPT-2's 12 per block: no adapters,
  // nothing frozen.
  const int64_t block_params =
      static_cast<int64_t>(model.spec.units[model.first_layer_unit].params.size());
  if (block_params != 12 || CountParams(model.spec).frozen > 0) {
    return NotTheExample(model,
                         "has LoRA adapters or frozen params; the example trains every param of "
                         "GPT-2 (drop --lora and --freeze)");
  }
  if (options.recompute == Recompute::kSelective) {
    return absl::InvalidArgumentError(
        "--activations gpt-example: the GPT example recomputes whole blocks or nothing; give "
        "--recompute none or full");
  }
  const int64_t b = options.micro_batch;
  const int64_t s = options.seq;
  const int64_t c = t.hidden;
  const CheckedInt64 n = CheckedInt64(b) * s;
  const CheckedInt64 nc = n * c;
  // BlockActsFloats: N (15 C + 4) + B H T^2.
  const CheckedInt64 block_acts =
      n * (CheckedInt64(c) * 15 + 4) + CheckedInt64(b) * t.heads * s * s;
  const int64_t kept_blocks = options.recompute == Recompute::kFull ? 1 : t.layers;
  constexpr int64_t kFloat = 4;  // fp32
  constexpr int64_t kInt32 = 4;  // token ids
  struct Entry {
    const char* name;
    MemoryCategory category;
    int64_t element_bytes;
    CheckedInt64 numel;
  };
  std::vector<Entry> entries = {
      {"gpt.block_inputs", MemoryCategory::kActivations, kFloat, nc * (t.layers + 1)},
      {"gpt.block_acts", MemoryCategory::kActivations, kFloat, block_acts * kept_blocks},
      {"gpt.final_norm", MemoryCategory::kActivations, kFloat, nc + n * 2},
      {"gpt.logits", MemoryCategory::kActivations, kFloat, n * t.vocab},
      {"gpt.tokens", MemoryCategory::kActivations, kInt32, n * 2},
      {"gpt.grad_io", MemoryCategory::kWorkspace, kFloat, nc * 2},
      // BlockScratchFloats: N 6C (d fc [N, 4C], two [N, C]) + T^2 (one
      // head's d att).
      {"gpt.block_scratch", MemoryCategory::kWorkspace, kFloat, nc * 6 + CheckedInt64(s) * s},
      {"gpt.unit_grads", MemoryCategory::kWorkspace, kFloat,
       LargestUnit(model.spec, /*trainable_only=*/true)},
  };
  if (options.precision != Precision::kFp32) {
    // The engine's params are 16-bit; the trainer computes on an fp32 copy.
    entries.push_back({"gpt.unit_params", MemoryCategory::kWorkspace, kFloat,
                       LargestUnit(model.spec, /*trainable_only=*/false)});
  }
  std::vector<TrainerTensor> out;
  for (const Entry& e : entries) {
    const CheckedInt64 bytes = e.numel * e.element_bytes;
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--activations gpt-example: %s passes 2^63 bytes (--seq %d, --micro-batch %d); "
          "lower --seq or --micro-batch",
          e.name, s, b));
    }
    out.push_back({e.name, e.category, *bytes.value()});
  }
  return out;
}

}  // namespace zeroshard::internal
