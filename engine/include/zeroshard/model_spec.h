// ModelSpec: what the engine shards. An ordered list of units (a layer or a
// group of small layers); a unit holds named params. Units are the grain of
// gathering, gradient reduction and checkpoint files.
#ifndef ZEROSHARD_MODEL_SPEC_H_
#define ZEROSHARD_MODEL_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zeroshard {

// Limits every ModelSpec must respect; Validate() checks them. They keep
// every element and byte count derived from a spec inside int64_t with
// headroom: 2^56 elements at 16 bytes of model state each is 2^60 bytes, and
// layout padding for up to 2^20 ranks adds less than 2^44 elements.
// Elements (parameters) in the whole model: 2^56 = 72,057,594,037,927,936.
inline constexpr int64_t kMaxModelElements = int64_t{1} << 56;
// Units in a model (a transformer has one per layer plus three).
inline constexpr int64_t kMaxUnits = 65536;
// Params (tensors) in a model, all units together.
inline constexpr int64_t kMaxModelTensors = int64_t{1} << 20;

// A param of another unit, by names (ParamSpec::tied_to).
struct ParamRef {
  std::string unit;
  std::string param;
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  // Exempt from weight decay (norms, biases): carried per param, never
  // guessed from names or positions.
  bool no_decay = false;
  // Tensor parallelism: the dimension of `shape` that is divided across the
  // tp ranks (Megatron: 0 for a column-parallel weight [out, in] and its
  // bias, 1 for a row-parallel weight), or -1 for a param every tp rank
  // holds whole (replicated: norms, a row-parallel layer's bias). Validate()
  // checks that it names a dimension (or is -1); it changes nothing when
  // tp = 1. ShardModelSpec keeps it in the shard's spec, where the engine
  // reads it to count replicated params once in the global gradient norm
  // (ModelParallelOptions::count_replicated).
  int tp_split_dim = -1;

  // Whether the optimizer trains the param. A frozen param (false) keeps
  // the values it was given: the engine allocates no gradient, master or
  // moments for it, reduces nothing for it and leaves it out of the
  // gradient norm; stage 3 still gathers it for the forward and backward.
  // GradView gives it an entry with data == nullptr (numel 0), and a unit
  // whose params are all frozen has no GradView at all (docs/engine_api.md).
  // Engine::SetTrainable freezes a param declared trainable between steps.
  bool trainable = true;
  // Tied weights: this param IS the param `tied_to` names, which lives in
  // an earlier unit (its owner), e.g. an LM head's weight naming the token
  // embedding's. Same shape; stored once, as the owner (one fp32 master,
  // one pair of moments, one checkpoint entry under the owner's name).
  // Gathering either unit makes it available; each unit writes its own
  // use's gradient through its GradView and the engine sums the uses in the
  // order of their ReduceGrads calls. Its trainable, no_decay, lr_scale,
  // weight_decay and tp_split_dim must equal the owner's (Validate); the
  // trainer sets its value through the owner (SetParam of the alias is
  // InvalidArgument naming the owner).
  std::optional<ParamRef> tied_to = std::nullopt;
  // Param groups, as torch's: the learning rate of this param is
  // schedule(step) * lr_scale, and its decoupled weight decay is
  // `weight_decay` (unset: OptimizerSpec::weight_decay). no_decay means a
  // decay of 0 and cannot be combined with weight_decay. Params with equal
  // (lr_scale, decay) form one group; the fused update applies each group's
  // constants per run of the shard, in the same pass.
  double lr_scale = 1.0;
  std::optional<double> weight_decay = std::nullopt;

  // Product of `shape` (1 for a scalar); -1 when the product does not fit
  // in int64_t (Validate() refuses such a shape).
  int64_t NumElements() const;
};

struct UnitSpec {
  std::string name;
  std::vector<ParamSpec> params;

  // Sum of the params' elements; -1 when a param's count or the sum does
  // not fit in int64_t.
  int64_t NumElements() const;
};

struct ModelSpec {
  std::vector<UnitSpec> units;

  // Sum of the units' elements, a tied param (tied_to) counted in every
  // unit that names it; -1 when a count does not fit in int64_t. Exact and
  // at most kMaxModelElements for a spec that passes Validate(). The
  // checkpoint manifest records this count.
  int64_t NumParams() const;
  // The elements stored: NumParams() less every tied param (an alias is its
  // owner's tensor, stored, trained and counted once). What a parameter
  // count or a FLOP count means (the planner's). -1 as NumParams().
  int64_t NumStoredParams() const;
  // Non-empty units with unique names, params with unique names within a
  // unit, every dimension positive, tp_split_dim -1 or a dimension of the
  // param's shape, lr_scale finite and >= 0, weight_decay finite and >= 0
  // and not set with no_decay, every tied_to naming a param of an earlier
  // unit that is not itself tied, with the same shape and settings, and the
  // limits above: at most kMaxUnits units and kMaxModelTensors params, at
  // most kMaxModelElements elements in all (every product and sum checked
  // for overflow). InvalidArgument naming the unit and param (and the limit)
  // otherwise. Checks the counts before anything proportional to them is
  // allocated; ties are resolved in O(n log n), and not at all in a model
  // without them.
  absl::Status Validate() const;
};

// Pipeline stages: `pp` contiguous runs of units, balanced by element count
// of the full (unsplit) units. Element [s] is stage s's [first, last) unit
// range; the ranges are contiguous, cover every unit in order and each holds
// at least one unit. Guarantee: the largest stage holds the fewest elements
// any such split can achieve (an optimal linear partition; the bound is found
// by bisection, O(units x log(elements))). Among the splits with that bound
// the later stages are filled first, so the first stage, which keeps the
// most micro-batches in flight under 1F1B, is the lightest. InvalidArgument
// for an invalid spec, or when pp < 1 or pp > units.
absl::StatusOr<std::vector<std::pair<int, int>>> PipelineStageUnits(const ModelSpec& model, int pp);

// The part of `model` that position (tp_rank, pp_rank) of a tp x pp split
// holds: the units of pipeline stage pp_rank (PipelineStageUnits), each
// param with its tp_split_dim divided by tp (replicated params whole).
// Every tp_rank gets the same shapes (the split is even), so the shard specs
// of one pipeline stage differ only in the values the trainer loads. Unit
// and param names, no_decay, tp_split_dim and the other ParamSpec fields
// are kept. InvalidArgument (naming the unit and param) when a split
// dimension is not divisible by tp, when a tie (tied_to) would cross
// pipeline stages, for an invalid spec (tp_split_dim out of range
// included), or for ranks out of range. The planner sizes exactly this spec, and the
// engine lays it out.
absl::StatusOr<ModelSpec> ShardModelSpec(const ModelSpec& model, int tp, int tp_rank, int pp,
                                         int pp_rank);

}  // namespace zeroshard

#endif  // ZEROSHARD_MODEL_SPEC_H_
