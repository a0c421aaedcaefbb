// The MLP-like ModelSpec the model-parallel tests share: `units` blocks
// "block.i" of a Megatron MLP with hidden size h: w1 [4h, h] and b1 [4h]
// column-parallel (split 0), w2 [h, 4h] row-parallel (split 1), b2 [h]
// replicated (no_decay biases).
#ifndef ZEROSHARD_TESTS_GRID_TEST_UTIL_H_
#define ZEROSHARD_TESTS_GRID_TEST_UTIL_H_

#include <cstdint>
#include <string>

#include "zeroshard/model_spec.h"

namespace zeroshard::testing {

inline ModelSpec MlpGridSpec(int units, int64_t h) {
  ModelSpec spec;
  for (int i = 0; i < units; ++i) {
    UnitSpec unit;
    unit.name = "block." + std::to_string(i);
    unit.params = {{"w1", {4 * h, h}, false, 0},
                   {"b1", {4 * h}, true, 0},
                   {"w2", {h, 4 * h}, false, 1},
                   {"b2", {h}, true, -1}};
    spec.units.push_back(std::move(unit));
  }
  return spec;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_GRID_TEST_UTIL_H_
