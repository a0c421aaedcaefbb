// ModelSpec: what the engine shards. An ordered list of units (a layer or a
// group of small layers); a unit holds named params. Units are the grain of
// gathering, gradient reduction and checkpoint files.
#ifndef ZEROSHARD_MODEL_SPEC_H_
#define ZEROSHARD_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

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

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  // Exempt from weight decay (norms, biases): carried per param, never
  // guessed from names or positions.
  bool no_decay = false;

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

  // Sum of the units' elements; -1 when a count does not fit in int64_t.
  // Exact and at most kMaxModelElements for a spec that passes Validate().
  int64_t NumParams() const;
  // Non-empty units with unique names, params with unique names within a
  // unit, every dimension positive, and the limits above: at most kMaxUnits
  // units and kMaxModelTensors params, at most kMaxModelElements elements in
  // all (every product and sum checked for overflow). InvalidArgument naming
  // the unit and param (and the limit) otherwise. Checks the counts before
  // anything proportional to them is allocated.
  absl::Status Validate() const;
};

}  // namespace zeroshard

#endif  // ZEROSHARD_MODEL_SPEC_H_
