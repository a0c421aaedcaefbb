#include "engine/src/runtime/shard_optimizer.h"

#include <algorithm>
#include <utility>

#include "kernels/cpu/adam.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

std::vector<DecayRun> BuildDecayRuns(const FlatLayout& layout, const ModelSpec& model,
                                     const std::function<ElementRange(int)>& owned_range) {
  std::vector<DecayRun> decay_runs;
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitSegment& seg = layout.unit(u);
    if (!seg.trainable) continue;  // no gradient, master or moments
    const ElementRange owned = owned_range(u);
    // Each param's run also takes the alignment gap before it; the tail
    // padding joins the last run. Padding is zero, so its decay is moot.
    std::vector<DecayRun> runs;
    int64_t pos = owned.begin;
    for (size_t p = 0; p < seg.params.size() && pos < owned.end; ++p) {
      const int64_t end = std::min(seg.params[p].offset + seg.params[p].numel, owned.end);
      if (end <= pos) continue;
      const ParamSlot& slot = seg.params[p];
      runs.push_back(
          {u, {pos, end}, !model.units[slot.spec_unit].params[slot.spec_param].no_decay});
      pos = end;
    }
    if (pos < owned.end) {
      const bool decay = runs.empty() ? true : runs.back().decay;
      runs.push_back({u, {pos, owned.end}, decay});
    }
    for (const DecayRun& run : runs) {
      if (!decay_runs.empty() && decay_runs.back().unit == u &&
          decay_runs.back().decay == run.decay && decay_runs.back().range.end == run.range.begin) {
        decay_runs.back().range.end = run.range.end;
      } else {
        decay_runs.push_back(run);
      }
    }
  }
  return decay_runs;
}

ShardOptimizer::ShardOptimizer(const TrainSpec& train, std::vector<DecayRun> runs)
    : spec_(train.optimizer),
      param_dtype_(train.param_dtype()),
      grad_dtype_(train.effective_grad_dtype()),
      mixed_(train.precision != Precision::kFp32),
      runs_(std::move(runs)) {}

absl::Status ShardOptimizer::Apply(const ShardBuffers& buffers, DeviceOps& ops, double grad_scale,
                                   double lr) {
  ++applied_steps_;
  kernels::AdamStepParams p;
  p.mode =
      spec_.kind == OptimizerKind::kAdamW ? kernels::AdamMode::kAdamW : kernels::AdamMode::kAdamL2;
  p.lr = lr;
  p.beta1 = spec_.beta1;
  p.beta2 = spec_.beta2;
  p.eps = spec_.eps;
  p.grad_scale = grad_scale;
  p.step = applied_steps_;
  p.weight_decay = spec_.weight_decay;
  const kernels::AdamConstants decay = kernels::MakeAdamConstants(p);
  p.weight_decay = 0.0;
  const kernels::AdamConstants no_decay = kernels::MakeAdamConstants(p);

  for (const DecayRun& run : runs_) {
    const kernels::AdamConstants& c = run.decay ? decay : no_decay;
    const int u = run.unit;
    const int64_t b = run.range.begin;
    AdamArgs args;
    args.m = buffers.AdamMAt(u, b);
    args.v = buffers.AdamVAt(u, b);
    args.grad = buffers.GradsAt(u, b);
    args.n = run.range.size();
    const bool grad16 = grad_dtype_ != DType::kFloat32;
    if (!mixed_) {
      args.variant = AdamVariant::kFp32;
      args.master = static_cast<float*>(buffers.ParamsAt(u, b));
    } else {
      args.master = buffers.MasterAt(u, b);
      args.param_out = static_cast<uint16_t*>(buffers.ParamsAt(u, b));
      if (param_dtype_ == DType::kBFloat16) {
        args.variant = grad16 ? AdamVariant::kMixedBf16GradBf16 : AdamVariant::kMixedBf16;
      } else {
        args.variant = grad16 ? AdamVariant::kMixedFp16GradFp16 : AdamVariant::kMixedFp16;
      }
    }
    ZS_RETURN_IF_ERROR(ops.Adam(args, c));
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
