// Engine::Step: reductions, global norm, clipping, fused Adam, param gathers.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "engine/src/runtime/engine_impl.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/norm.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

void EngineImpl::AccumulateInto(void* acc, const void* add, int64_t n) const {
  if (grad_dtype_ == DType::kFloat32) {
    float* a = static_cast<float*>(acc);
    const float* b = static_cast<const float*>(add);
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    return;
  }
  uint16_t* a = static_cast<uint16_t*>(acc);
  const uint16_t* b = static_cast<const uint16_t*>(add);
  for (int64_t i = 0; i < n; ++i) a[i] = Fp32ToBf16(Bf16ToFp32(a[i]) + Bf16ToFp32(b[i]));
}

absl::Status EngineImpl::DrainReductions() {
  while (!busy_slots_.empty()) ZS_RETURN_IF_ERROR(RetireOldestSlot());
  for (CommHandle& h : unit_reductions_) ZS_RETURN_IF_ERROR(WaitComm(h));
  return absl::OkStatus();
}

absl::Status EngineImpl::WaitParamGathers() {
  for (CommHandle& h : param_gathers_) ZS_RETURN_IF_ERROR(WaitComm(h));
  return absl::OkStatus();
}

absl::StatusOr<double> EngineImpl::GlobalSumSquares() {
  // Every rank sums squares over its shard of every unit, whatever the stage,
  // so each element is counted once. Blocks and the exact accumulator make
  // the result independent of the shard boundaries (kernels/cpu/norm.h).
  kernels::ExactSum sum;
  double* blocks = norm_blocks_.as<double>();
  for (int u = 0; u < layout_.num_units(); ++u) {
    const ElementRange shard = layout_.ShardRange(u, rank_);
    const size_t n = static_cast<size_t>(shard.size());
    const void* g = GradsAt(u, shard.begin);
    if (grad_dtype_ == DType::kFloat32) {
      kernels::BlockSumSquaresFp32(static_cast<const float*>(g), n, blocks);
    } else {
      kernels::BlockSumSquaresBf16(static_cast<const uint16_t*>(g), n, blocks);
    }
    sum.AddBlocks(blocks, (n + kernels::kNormBlock - 1) / kernels::kNormBlock);
  }
  sum.Normalize();
  CommHandle handle =
      comm_.AllReduce(sum.limbs(), sum.limbs(), kernels::ExactSum::kLimbs, DType::kInt64);
  ZS_RETURN_IF_ERROR(WaitComm(handle));
  return sum.Value();
}

void EngineImpl::ApplyOptimizer(double grad_scale, double lr) {
  kernels::AdamStepParams p;
  p.mode = train_.optimizer.kind == OptimizerKind::kAdamW ? kernels::AdamMode::kAdamW
                                                          : kernels::AdamMode::kAdamL2;
  p.lr = lr;
  p.beta1 = train_.optimizer.beta1;
  p.beta2 = train_.optimizer.beta2;
  p.eps = train_.optimizer.eps;
  p.grad_scale = grad_scale;
  p.step = applied_steps_;
  p.weight_decay = train_.optimizer.weight_decay;
  const kernels::AdamConstants decay = kernels::MakeAdamConstants(p);
  p.weight_decay = 0.0;
  const kernels::AdamConstants no_decay = kernels::MakeAdamConstants(p);

  for (const DecayRun& run : decay_runs_) {
    const kernels::AdamConstants& c = run.decay ? decay : no_decay;
    const int u = run.unit;
    const int64_t b = run.range.begin;
    const size_t n = static_cast<size_t>(run.range.size());
    float* m = OptimizerAt(adam_m_, u, b);
    float* v = OptimizerAt(adam_v_, u, b);
    if (!mixed_) {
      kernels::AdamFp32(static_cast<float*>(ParamsAt(u, b)),
                        static_cast<const float*>(GradsAt(u, b)), m, v, n, c);
    } else if (grad_dtype_ == DType::kFloat32) {
      kernels::AdamMixedBf16(OptimizerAt(master_, u, b), static_cast<uint16_t*>(ParamsAt(u, b)),
                             static_cast<const float*>(GradsAt(u, b)), m, v, n, c);
    } else {
      kernels::AdamMixedBf16GradBf16(OptimizerAt(master_, u, b),
                                     static_cast<uint16_t*>(ParamsAt(u, b)),
                                     static_cast<const uint16_t*>(GradsAt(u, b)), m, v, n, c);
    }
  }
}

absl::StatusOr<StepResult> EngineImpl::Step() {
  const absl::Time call_begin = absl::Now();
  ZS_RETURN_IF_ERROR(CheckStarted("Step"));
  for (int u = 0; u < layout_.num_units(); ++u) {
    if (open_grad_slot_[u] != kNoGradView || reduced_count_[u] != train_.grad_accum_steps) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Step(): unit '%s' has %d of %d micro-batch gradients reduced%s; every unit must be "
          "reduced once per micro-batch before Step()",
          model_.units[u].name, reduced_count_[u], train_.grad_accum_steps,
          open_grad_slot_[u] != kNoGradView ? " and an open GradView" : ""));
    }
  }
  ZS_RETURN_IF_ERROR(DrainReductions());

  const absl::Duration comm_before = step_comm_wait_;
  const absl::Time opt_begin = absl::Now();
  ZS_ASSIGN_OR_RETURN(const double sum_squares, GlobalSumSquares());
  StepResult result;
  result.step = step_ + 1;
  result.lr = train_.schedule.LrAt(result.step, train_.optimizer.lr);
  // The engine holds the SUM of world * accum micro-batch gradients; the
  // optimizer sees their mean.
  const double mean_scale = 1.0 / (static_cast<double>(world_) * train_.grad_accum_steps);
  result.grad_norm = std::sqrt(sum_squares) * mean_scale;
  if (!std::isfinite(result.grad_norm)) {
    result.skipped = true;
    result.clip_coef = 0.0;
    ++stats_.skipped_steps;
  } else {
    if (train_.max_grad_norm > 0.0) {
      // As torch.nn.utils.clip_grad_norm_: scale by max / (norm + 1e-6) when below 1.
      result.clip_coef = std::min(1.0, train_.max_grad_norm / (result.grad_norm + 1e-6));
    }
    ++applied_steps_;
    ApplyOptimizer(mean_scale * result.clip_coef, result.lr);
  }
  if (train_.zero_stage >= 1) {
    // Bring every rank's updated shard to all ranks; Gather(u) waits for it.
    for (int u = 0; u < layout_.num_units(); ++u) {
      const UnitSegment& seg = layout_.unit(u);
      void* unit_params = ParamsAt(u, 0);
      param_gathers_[u] = comm_.AllGather(ParamsAt(u, layout_.ShardRange(u, rank_).begin),
                                          unit_params, seg.shard_numel, param_dtype_);
    }
  }
  const absl::Time end = absl::Now();
  step_optimizer_ += (end - opt_begin) - (step_comm_wait_ - comm_before);

  for (int u = 0; u < layout_.num_units(); ++u) reduced_count_[u] = 0;
  ++step_;

  // Where this step's wall time went.
  step_engine_time_ += end - call_begin;
  StepTimes t;
  t.total = end - step_begin_;
  t.exposed_comm = step_comm_wait_;
  t.optimizer = step_optimizer_;
  t.input_wait = step_input_wait_;
  t.compute = t.total - step_engine_time_ - step_input_wait_;
  t.engine_other = step_engine_time_ - step_comm_wait_ - step_optimizer_;
  stats_.steps = step_;
  stats_.last = t;
  stats_.totals.total += t.total;
  stats_.totals.exposed_comm += t.exposed_comm;
  stats_.totals.optimizer += t.optimizer;
  stats_.totals.input_wait += t.input_wait;
  stats_.totals.compute += t.compute;
  stats_.totals.engine_other += t.engine_other;
  step_begin_ = end;
  step_engine_time_ = step_comm_wait_ = step_optimizer_ = step_input_wait_ = absl::ZeroDuration();
  return result;
}

}  // namespace zeroshard::internal
