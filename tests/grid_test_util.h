// The MLP-like ModelSpec the model-parallel tests share: `units` blocks
// "block.i" of a Megatron MLP with hidden size h: w1 [4h, h] and b1 [4h]
// column-parallel (split 0), w2 [h, 4h] row-parallel (split 1), b2 [h]
// replicated (no_decay biases).
#ifndef ZEROSHARD_TESTS_GRID_TEST_UTIL_H_
#define ZEROSHARD_TESTS_GRID_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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

// How far a model-parallel run is from its reference: the largest relative
// loss difference over the steps, and the weights' relative L2 distance
// over all params (params in the same order and sizes on both sides).
struct Distance {
  double loss_rel = 0.0;
  double weight_rel_l2 = 0.0;
};

inline Distance MeasureDistance(const std::vector<double>& losses,
                                const std::vector<std::vector<float>>& params,
                                const std::vector<double>& ref_losses,
                                const std::vector<std::vector<float>>& ref_params) {
  Distance d;
  for (size_t s = 0; s < ref_losses.size(); ++s) {
    d.loss_rel = std::max(d.loss_rel, std::fabs(losses[s] - ref_losses[s]) / ref_losses[s]);
  }
  double diff_sq = 0.0, norm_sq = 0.0;
  for (size_t t = 0; t < ref_params.size(); ++t) {
    for (size_t i = 0; i < ref_params[t].size(); ++i) {
      const double diff = static_cast<double>(params[t][i]) - ref_params[t][i];
      diff_sq += diff * diff;
      norm_sq += static_cast<double>(ref_params[t][i]) * ref_params[t][i];
    }
  }
  d.weight_rel_l2 = std::sqrt(diff_sq / norm_sq);
  return d;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_GRID_TEST_UTIL_H_
