// A minimal trainer for engine tests that need control over each rank's
// gradients and gather order: deterministic pseudo-random gradients that
// depend on the step, rank, unit and element, written through the engine's
// public API in the stage-3 loop shape (Gather/Release forward, then
// Gather/GradView/ReduceGrads/Release backward).
#ifndef ZEROSHARD_TESTS_RUNTIME_SYNTHETIC_TRAINER_H_
#define ZEROSHARD_TESTS_RUNTIME_SYNTHETIC_TRAINER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"

namespace zeroshard::testing {

// Units of different sizes; "block.1" and "block.3" have the same shapes.
ModelSpec SyntheticSpec();
// Deterministic initial values for (unit, param).
std::vector<float> SyntheticInit(const ModelSpec& spec, int unit, int param);

struct SyntheticHooks {
  // The unit to gather in place of `unit` (forward pass), by default `unit`.
  std::function<int(int64_t step, int rank, int unit)> forward_unit;
  // Called after the gradient of `unit` was written, before ReduceGrads.
  std::function<void(int64_t step, int rank, int unit, UnitView& grads)> after_grads;
};

// One optimizer step (grad_accum_steps micro-batches) on one rank.
// `device` is the engine's device when its memory is not host memory (a
// CUDA device): the views are then read and written through copies on a
// stream of it. The hooks need host-accessible views.
absl::StatusOr<StepResult> SyntheticStep(Engine& engine, const ModelSpec& spec,
                                         const SyntheticHooks& hooks = {},
                                         Device* device = nullptr);

// SetParam for every param with SyntheticInit, then Start().
absl::Status SyntheticStart(Engine& engine, const ModelSpec& spec);

// All params (fp32, from GetParam: collective).
absl::StatusOr<std::vector<std::vector<float>>> AllParams(Engine& engine, const ModelSpec& spec);

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_RUNTIME_SYNTHETIC_TRAINER_H_
