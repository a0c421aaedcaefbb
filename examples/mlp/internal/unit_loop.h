// The one training loop of the MLP trainers (MlpTrainer, GridMlpTrainer,
// gpu::CudaMlpTrainer): the engine calls of a micro-batch and of a step, in
// the order the engine's contract asks for (zeroshard/engine.h), with the
// block math they differ in (CPU, CUDA, a tensor-parallel shard) passed in.
// Written once, so a change of the protocol (say, a prefetch hint) is made
// in one place for every trainer.
#ifndef ZEROSHARD_EXAMPLES_MLP_INTERNAL_UNIT_LOOP_H_
#define ZEROSHARD_EXAMPLES_MLP_INTERNAL_UNIT_LOOP_H_

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace internal {

// The forward of one micro-batch over `num_units` units: for each unit in
// order, Gather it, `compute(unit, params)` (absl::Status), Release it. Each
// unit is released before the next is gathered (stage 3 holds one gathered
// unit at a time), so `compute` must be done reading `params` when it
// returns; what the backward needs it keeps in its own buffers.
template <typename Compute>
absl::Status ForwardUnits(Engine& engine, int num_units, Compute&& compute) {
  for (int u = 0; u < num_units; ++u) {
    ZS_ASSIGN_OR_RETURN(const UnitView params, engine.Gather(u));
    ZS_RETURN_IF_ERROR(compute(u, params));
    ZS_RETURN_IF_ERROR(engine.Release(u));
  }
  return absl::OkStatus();
}

// The backward of one micro-batch: for each unit in reverse, Gather it (the
// weights again), `compute(unit, params)` into the trainer's own gradient
// buffer, then GradView, `write(unit, grad_view)` (overwrite every element,
// done when it returns: the engine reads it next), ReduceGrads, Release.
// Computing before asking for the grad view matters: GradView may block on
// an earlier reduction, and the copy in `write` is cheap. A unit for which
// `has_grads(unit)` is false (all its params frozen) has no gradient view
// and no reduction: it is gathered, computed and released only.
template <typename HasGrads, typename Compute, typename Write>
absl::Status BackwardUnits(Engine& engine, int num_units, HasGrads&& has_grads, Compute&& compute,
                           Write&& write) {
  for (int u = num_units - 1; u >= 0; --u) {
    ZS_ASSIGN_OR_RETURN(const UnitView params, engine.Gather(u));
    ZS_RETURN_IF_ERROR(compute(u, params));
    if (has_grads(u)) {
      ZS_ASSIGN_OR_RETURN(const UnitView grad_view, engine.GradView(u));
      ZS_RETURN_IF_ERROR(write(u, grad_view));
      ZS_RETURN_IF_ERROR(engine.ReduceGrads(u));
    }
    ZS_RETURN_IF_ERROR(engine.Release(u));
  }
  return absl::OkStatus();
}

// The same for a model whose every unit trains.
template <typename Compute, typename Write>
absl::Status BackwardUnits(Engine& engine, int num_units, Compute&& compute, Write&& write) {
  return BackwardUnits(
      engine, num_units, [](int) { return true; }, std::forward<Compute>(compute),
      std::forward<Write>(write));
}

// One optimizer step: `micro_batch(m, loss_scale)` (absl::StatusOr<double>,
// the micro-batch's unscaled loss) for m = 0 .. grad_accum_steps - 1, then
// engine.Step(), whose result goes to *last_step. The loss scale is read once
// and is constant within the step (the engine unscales what the trainer
// writes). Returns the sum of the micro-batch losses on this rank.
template <typename MicroBatch>
absl::StatusOr<double> AccumulateAndStep(Engine& engine, MicroBatch&& micro_batch,
                                         StepResult* last_step) {
  const int accum = engine.train().grad_accum_steps;
  const float loss_scale = static_cast<float>(engine.loss_scale());
  double local_loss_sum = 0.0;
  for (int m = 0; m < accum; ++m) {
    ZS_ASSIGN_OR_RETURN(const double loss, micro_batch(m, loss_scale));
    local_loss_sum += loss;
  }
  ZS_ASSIGN_OR_RETURN(*last_step, engine.Step());
  return local_loss_sum;
}

// Multiplies the backward's seed dL/dy by the loss scale. Scale the seed,
// not the gradients: every later value is linear in it, so the scale reaches
// all gradients, and small fp16 gradients stay above the underflow
// threshold. With a scale of 1 (fp32, bf16) the arithmetic is left exactly
// as it was.
inline void ScaleLossSeed(float loss_scale, std::vector<float>* dy) {
  if (loss_scale == 1.0f) return;
  for (float& d : *dy) d *= loss_scale;
}

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_INTERNAL_UNIT_LOOP_H_
