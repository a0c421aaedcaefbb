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

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  // Exempt from weight decay (norms, biases): carried per param, never
  // guessed from names or positions.
  bool no_decay = false;

  // Product of `shape` (1 for a scalar).
  int64_t NumElements() const;
};

struct UnitSpec {
  std::string name;
  std::vector<ParamSpec> params;

  int64_t NumElements() const;
};

struct ModelSpec {
  std::vector<UnitSpec> units;

  int64_t NumParams() const;
  // Non-empty units with unique names, params with unique names within a
  // unit, every dimension positive, and a total element count that fits
  // int64_t (so NumElements() and NumParams() cannot overflow). The error
  // names the unit and param.
  absl::Status Validate() const;
};

}  // namespace zeroshard

#endif  // ZEROSHARD_MODEL_SPEC_H_
