#include "engine/src/runtime/shard_optimizer.h"

#include <algorithm>
#include <utility>

#include "kernels/cpu/adam.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

ParamGroupSpec ParamGroupSpec::Of(const ParamSpec& param) {
  ParamGroupSpec group;
  group.lr_scale = param.lr_scale;
  group.weight_decay = param.no_decay ? std::optional<double>(0.0) : param.weight_decay;
  return group;
}

std::vector<UpdateRun> BuildUpdateRuns(const FlatLayout& layout, const ModelSpec& model,
                                       const std::function<ElementRange(int)>& owned_range) {
  std::vector<UpdateRun> merged;
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitSegment& seg = layout.unit(u);
    if (!seg.trainable) continue;  // no gradient, master or moments
    const ElementRange owned = owned_range(u);
    // Each param's run also takes the alignment gap before it; the tail
    // padding joins the last run. Padding is zero: any group leaves it zero.
    std::vector<UpdateRun> runs;
    int64_t pos = owned.begin;
    for (size_t p = 0; p < seg.params.size() && pos < owned.end; ++p) {
      const int64_t end = std::min(seg.params[p].offset + seg.params[p].numel, owned.end);
      if (end <= pos) continue;
      const ParamSlot& slot = seg.params[p];
      runs.push_back(
          {u, {pos, end}, ParamGroupSpec::Of(model.units[slot.spec_unit].params[slot.spec_param])});
      pos = end;
    }
    if (pos < owned.end) {
      const ParamGroupSpec group = runs.empty() ? ParamGroupSpec() : runs.back().group;
      runs.push_back({u, {pos, owned.end}, group});
    }
    for (const UpdateRun& run : runs) {
      if (!merged.empty() && merged.back().unit == u && merged.back().group == run.group &&
          merged.back().range.end == run.range.begin) {
        merged.back().range.end = run.range.end;
      } else {
        merged.push_back(run);
      }
    }
  }
  return merged;
}

ShardOptimizer::ShardOptimizer(const TrainSpec& train, std::vector<UpdateRun> runs)
    : spec_(train.optimizer),
      param_dtype_(train.param_dtype()),
      grad_dtype_(train.effective_grad_dtype()),
      mixed_(train.precision != Precision::kFp32),
      runs_(std::move(runs)) {
  IndexGroups();
}

void ShardOptimizer::set_runs(std::vector<UpdateRun> runs) {
  runs_ = std::move(runs);
  IndexGroups();
}

void ShardOptimizer::IndexGroups() {
  groups_.clear();
  run_group_.clear();
  // The distinct effective groups, sorted, and each run's index among them:
  // O(runs log runs), so that a model with a group per param stays cheap.
  auto effective = [this](const ParamGroupSpec& g) {
    return Group{g.lr_scale, g.weight_decay.value_or(spec_.weight_decay)};
  };
  auto less = [](const Group& a, const Group& b) {
    return a.lr_scale != b.lr_scale ? a.lr_scale < b.lr_scale : a.weight_decay < b.weight_decay;
  };
  for (const UpdateRun& run : runs_) groups_.push_back(effective(run.group));
  std::sort(groups_.begin(), groups_.end(), less);
  groups_.erase(std::unique(groups_.begin(), groups_.end(),
                            [](const Group& a, const Group& b) {
                              return a.lr_scale == b.lr_scale && a.weight_decay == b.weight_decay;
                            }),
                groups_.end());
  run_group_.reserve(runs_.size());
  for (const UpdateRun& run : runs_) {
    const auto at = std::lower_bound(groups_.begin(), groups_.end(), effective(run.group), less);
    run_group_.push_back(static_cast<int>(at - groups_.begin()));
  }
  constants_.resize(groups_.size());
}

void ShardOptimizer::BeginStep(double grad_scale, double lr) {
  ++applied_steps_;
  kernels::AdamStepParams p;
  p.mode =
      spec_.kind == OptimizerKind::kAdamW ? kernels::AdamMode::kAdamW : kernels::AdamMode::kAdamL2;
  p.beta1 = spec_.beta1;
  p.beta2 = spec_.beta2;
  p.eps = spec_.eps;
  p.grad_scale = grad_scale;
  p.step = applied_steps_;
  // torch's param groups: the group's learning rate is the schedule's times
  // its scale, and AdamW's decoupled decay uses that rate (p *= 1 -
  // lr_group * wd_group). Derived once per group, in double, as before.
  for (size_t g = 0; g < groups_.size(); ++g) {
    p.lr = lr * groups_[g].lr_scale;
    p.weight_decay = groups_[g].weight_decay;
    constants_[g] = kernels::MakeAdamConstants(p);
  }
}

AdamVariant ShardOptimizer::variant() const {
  if (!mixed_) return AdamVariant::kFp32;
  const bool grad16 = grad_dtype_ != DType::kFloat32;
  if (param_dtype_ == DType::kBFloat16) {
    return grad16 ? AdamVariant::kMixedBf16GradBf16 : AdamVariant::kMixedBf16;
  }
  return grad16 ? AdamVariant::kMixedFp16GradFp16 : AdamVariant::kMixedFp16;
}

absl::Status ShardOptimizer::Apply(const ShardBuffers& buffers, DeviceOps& ops, double grad_scale,
                                   double lr) {
  BeginStep(grad_scale, lr);
  for (size_t k = 0; k < runs_.size(); ++k) {
    const UpdateRun& run = runs_[k];
    const int u = run.unit;
    const int64_t b = run.range.begin;
    AdamArgs args;
    args.variant = variant();
    args.m = buffers.AdamMAt(u, b);
    args.v = buffers.AdamVAt(u, b);
    args.grad = buffers.GradsAt(u, b);
    args.n = run.range.size();
    if (!mixed_) {
      args.master = static_cast<float*>(buffers.ParamsAt(u, b));
    } else {
      args.master = buffers.MasterAt(u, b);
      args.param_out = static_cast<uint16_t*>(buffers.ParamsAt(u, b));
    }
    ZS_RETURN_IF_ERROR(ops.Adam(args, run_constants(k)));
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
