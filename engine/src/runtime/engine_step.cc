// Engine::Step: reductions, global norm, clipping, fused Adam, param gathers.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/runtime/engine_impl.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/norm.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

// The planner sizes norm_blocks with the layout's block size; the kernels sum
// blocks of their own. They must be the same number.
static_assert(static_cast<int64_t>(kernels::kNormBlock) == kNormBlockElements,
              "kernels::kNormBlock must equal the layout's kNormBlockElements");

absl::Status EngineImpl::AccumulateInto(void* acc, const void* add, int64_t n) {
  // 16-bit gradients: widened, added in fp32, rounded once per micro-batch.
  return ops_->Accumulate(acc, add, n, grad_dtype_);
}

absl::Status EngineImpl::DrainReductions() {
  while (!busy_slots_.empty()) ZS_RETURN_IF_ERROR(RetireOldestSlot(WaitSite::kStepReductions));
  // In issue order, so that each unit's norm runs on the compute stream
  // while the host waits for the next unit's reduction.
  while (!reduction_order_.empty()) {
    const int u = reduction_order_.front();
    reduction_order_.pop_front();
    ZS_RETURN_IF_ERROR(WaitComm(unit_reductions_[u], WaitSite::kStepReductions));
    ZS_RETURN_IF_ERROR(EnqueueUnitNorm(u));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::RetireCompletedReductions() {
  while (!busy_slots_.empty() && slots_[busy_slots_.front()].reduction.Ready()) {
    ZS_RETURN_IF_ERROR(RetireOldestSlot(WaitSite::kStepReductions));
  }
  while (!reduction_order_.empty() && unit_reductions_[reduction_order_.front()].Ready()) {
    const int u = reduction_order_.front();
    reduction_order_.pop_front();
    ZS_RETURN_IF_ERROR(WaitComm(unit_reductions_[u], WaitSite::kStepReductions));
    ZS_RETURN_IF_ERROR(EnqueueUnitNorm(u));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::EnqueueUnitNorm(int u) {
  if (!EarlyNorm() || unit_norm_done_[u]) return absl::OkStatus();
  // Each unit's shard is a whole number of norm blocks and its blocks have
  // their own place in norm_blocks (which holds the whole shard's), so the
  // units' sums can be enqueued at any time and in any order; the exact
  // accumulator makes their sum independent of that order.
  const UnitSegment& seg = layout_.unit(u);
  const ElementRange shard = layout_.ShardRange(u, rank_);
  ZS_RETURN_IF_ERROR(
      ops_->BlockSumSquares(GradsAt(u, shard.begin), seg.shard_numel, grad_dtype_,
                            norm_blocks_.as<double>() + seg.shard_offset / kNormBlockElements));
  unit_norm_done_[u] = 1;
  return absl::OkStatus();
}

absl::Status EngineImpl::WaitParamGathers(WaitSite site) {
  for (CommHandle& h : param_gathers_) ZS_RETURN_IF_ERROR(WaitComm(h, site));
  return absl::OkStatus();
}

absl::Status EngineImpl::AddShardSquares(int u, kernels::ExactSum& sum) {
  const ElementRange shard = layout_.ShardRange(u, rank_);
  // The pieces of the shard: all of it, or (model parallelism, a unit with
  // replicated params this rank does not count) its intersection with each
  // run, cut where the segment's norm blocks begin, so that every block sum
  // covers part of one fixed block and the norm does not depend on dp.
  std::vector<ElementRange> counted;
  std::vector<ElementRange> ignored;
  if (norm_ranges_.empty() || norm_ranges_[u].empty()) {
    counted.push_back(shard);
  } else {
    for (const NormRange& run : norm_ranges_[u]) {
      const int64_t begin = std::max(run.range.begin, shard.begin);
      const int64_t end = std::min(run.range.end, shard.end);
      if (begin >= end) continue;
      std::vector<ElementRange>& pieces = run.counted ? counted : ignored;
      const int64_t aligned =
          std::min(end, (begin + kNormBlockElements - 1) / kNormBlockElements * kNormBlockElements);
      if (aligned > begin) pieces.push_back({begin, aligned});
      if (end > aligned) pieces.push_back({aligned, end});
    }
  }
  double* blocks = norm_blocks_.as<double>();
  const int64_t capacity = norm_blocks_.bytes() / static_cast<int64_t>(sizeof(double));
  const bool on_host = device_.host_accessible();
  // Block sums of `pieces` into `target`, flushed (copied to the host and
  // added exactly) whenever the blocks buffer is full and at the end.
  auto add_pieces = [&](const std::vector<ElementRange>& pieces,
                        kernels::ExactSum& target) -> absl::Status {
    int64_t used = 0;
    auto flush = [&]() -> absl::Status {
      const double* host_blocks = blocks;
      if (!on_host) {
        ZS_RETURN_IF_ERROR(device_.CopyAsync(host_norm_blocks_.data(), blocks,
                                             used * static_cast<int64_t>(sizeof(double)),
                                             *compute_));
        host_blocks = host_norm_blocks_.data();
      }
      ZS_RETURN_IF_ERROR(SyncCompute());
      target.AddBlocks(host_blocks, static_cast<size_t>(used));
      used = 0;
      return absl::OkStatus();
    };
    for (const ElementRange& piece : pieces) {
      const int64_t n = piece.size();
      const int64_t num_blocks = (n + kNormBlockElements - 1) / kNormBlockElements;
      if (used > 0 && used + num_blocks > capacity) ZS_RETURN_IF_ERROR(flush());
      ZS_RETURN_IF_ERROR(
          ops_->BlockSumSquares(GradsAt(u, piece.begin), n, grad_dtype_, blocks + used));
      used += num_blocks;
    }
    // Also with no blocks: the single-piece path always synced here.
    return flush();
  };
  ZS_RETURN_IF_ERROR(add_pieces(counted, sum));
  if (!ignored.empty()) {
    // A replicated param's gradient that is not finite here must skip the
    // step as surely as one in a counted param: its count joins the sum's.
    kernels::ExactSum replicated;
    ZS_RETURN_IF_ERROR(add_pieces(ignored, replicated));
    sum.limbs()[kernels::ExactSum::kValueLimbs] += replicated.non_finite();
  }
  return absl::OkStatus();
}

absl::StatusOr<double> EngineImpl::GlobalSumSquaresAndCheckSequence() {
  // Every rank sums squares over its shard of every unit, whatever the stage,
  // so each element is counted once. Blocks and the exact accumulator make
  // the result independent of the shard boundaries (kernels/cpu/norm.h).
  // The block sums are computed on the device, one unit at a time (the
  // blocks buffer holds the largest shard's), and added exactly on the host.
  kernels::ExactSum sum;
  if (EarlyNorm()) {
    // Most units' block sums were enqueued as their gradients became final
    // (ReduceGrads, the reductions' retirement); one wait and one exact sum
    // over every block.
    for (int u = 0; u < layout_.num_units(); ++u) ZS_RETURN_IF_ERROR(EnqueueUnitNorm(u));
    const int64_t blocks = layout_.shard_numel() / kNormBlockElements;
    const double* host_blocks = norm_blocks_.as<double>();
    if (!device_.host_accessible()) {
      ZS_RETURN_IF_ERROR(device_.CopyAsync(host_norm_blocks_.data(), host_blocks,
                                           blocks * static_cast<int64_t>(sizeof(double)),
                                           *compute_));
      host_blocks = host_norm_blocks_.data();
    }
    ZS_RETURN_IF_ERROR(SyncCompute());
    sum.AddBlocks(host_blocks, static_cast<size_t>(blocks));
    for (int u = 0; u < layout_.num_units(); ++u) unit_norm_done_[u] = 0;
  } else {
    for (int u = 0; u < layout_.num_units(); ++u) ZS_RETURN_IF_ERROR(AddShardSquares(u, sum));
  }
  sum.Normalize();
  // One all-gather carries both the accumulator limbs and this step's
  // collective-sequence record, so the divergence check costs no extra
  // round trip.
  constexpr int kLimbs = kernels::ExactSum::kLimbs;
  const bool check = train_.check_collective_sequence;
  const int kRecord = check ? kLimbs + 2 : kLimbs;
  int64_t mine[kLimbs + 2];
  for (int k = 0; k < kLimbs; ++k) mine[k] = sum.limbs()[k];
  if (check) {
    mine[kLimbs] = static_cast<int64_t>(sequence_hash_);
    mine[kLimbs + 1] = sequence_count_;
  }
  std::vector<int64_t> all(static_cast<size_t>(kRecord) * world_);
  ZS_RETURN_IF_ERROR(HostAllGather(mine, all.data(), kRecord));
  std::vector<int> differ;
  for (int r = 1; check && r < world_; ++r) {
    if (all[r * kRecord + kLimbs] != all[kLimbs] ||
        all[r * kRecord + kLimbs + 1] != all[kLimbs + 1]) {
      differ.push_back(r);
    }
  }
  if (!differ.empty()) {
    const int r = differ.front();
    return Poison(absl::FailedPreconditionError(absl::StrFormat(
        "collective sequence check at step %d: rank(s) %s issued different collectives from "
        "rank 0 since the previous step (rank 0: %d collectives, rank %d: %d, different units, "
        "kinds or sizes); the ranks diverged: every rank must make the same Gather, GradView and "
        "ReduceGrads calls in the same order",
        step_ + 1, absl::StrJoin(differ, ", "), all[kLimbs + 1], r,
        all[r * kRecord + kLimbs + 1])));
  }
  // Integer sums: the order of ranks does not matter.
  kernels::ExactSum total;
  for (int r = 0; r < world_; ++r) {
    for (int k = 0; k < kLimbs; ++k) total.limbs()[k] += all[r * kRecord + k];
  }
  if (model_parallel_ != nullptr) {
    // The other tp/pp shards' sums, as integers again, so the norm is exact
    // and the same on every rank of the group; the non-finite count travels
    // in the last limb, so every shard also skips the same steps. Normalized
    // first: each limb then stays below world x 2^32, far from overflow.
    total.Normalize();
    CommHandle handle =
        model_parallel_->AllReduce(total.limbs(), total.limbs(), kLimbs, DType::kInt64);
    ZS_RETURN_IF_ERROR(WaitComm(handle, WaitSite::kModelParallel));
  }
  return total.Value();
}

absl::Status EngineImpl::UpdateLossScale(bool overflow) {
  if (train_.precision != Precision::kFp16Mixed) return absl::OkStatus();
  const LossScaleSpec& ls = train_.loss_scale;
  if (overflow) {
    clean_steps_ = 0;
    if (loss_scale_ <= ls.min_scale && ++skips_at_min_scale_ >= ls.max_skips_at_min_scale) {
      return Poison(absl::FailedPreconditionError(absl::StrFormat(
          "Step %d: %d steps in a row had non-finite gradients at the minimum loss scale %g; the "
          "model has diverged or the data holds inf/NaN (lower the learning rate, check the "
          "inputs, or train in bf16)",
          step_ + 1, skips_at_min_scale_, ls.min_scale)));
    }
    if (--hysteresis_left_ <= 0) {
      loss_scale_ = std::max(ls.min_scale, loss_scale_ * ls.backoff_factor);
      hysteresis_left_ = ls.hysteresis;
    }
    return absl::OkStatus();
  }
  skips_at_min_scale_ = 0;
  if (++clean_steps_ >= ls.growth_interval) {
    loss_scale_ *= ls.growth_factor;
    clean_steps_ = 0;
    hysteresis_left_ = ls.hysteresis;
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::ApplyOptimizer(double grad_scale, double lr) {
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
    AdamArgs args;
    args.m = OptimizerAt(adam_m_, u, b);
    args.v = OptimizerAt(adam_v_, u, b);
    args.grad = GradsAt(u, b);
    args.n = static_cast<int64_t>(n);
    const bool grad16 = grad_dtype_ != DType::kFloat32;
    if (!mixed_) {
      args.variant = AdamVariant::kFp32;
      args.master = static_cast<float*>(ParamsAt(u, b));
    } else {
      args.master = OptimizerAt(master_, u, b);
      args.param_out = static_cast<uint16_t*>(ParamsAt(u, b));
      if (param_dtype_ == DType::kBFloat16) {
        args.variant = grad16 ? AdamVariant::kMixedBf16GradBf16 : AdamVariant::kMixedBf16;
      } else {
        args.variant = grad16 ? AdamVariant::kMixedFp16GradFp16 : AdamVariant::kMixedFp16;
      }
    }
    ZS_RETURN_IF_ERROR(ops_->Adam(args, c));
  }
  // The param all-gathers (and the trainer's next Gather) read the updated
  // params.
  return SyncCompute();
}

// Step() in phases, each a function below: check the calls that came
// before, finish the reductions, the norm and the update, then start the
// next step's communication and book the time.
absl::StatusOr<StepResult> EngineImpl::Step() {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckStepPreconditions());
  ZS_RETURN_IF_ERROR(DrainReductions());
  // Stage 3: the optimizer rewrites the param shards the gathered copies
  // came from; finish and forget them.
  ZS_RETURN_IF_ERROR(DropGatherPool());

  // The optimizer: norm (its all-gather's wait is exposed communication),
  // clipping, the update and the loss scale.
  const absl::Duration comm_before = timeline_.comm_wait();
  const absl::Duration opt_begin = timeline_.Now();
  ZS_ASSIGN_OR_RETURN(StepResult result, NormClipAndUpdate());
  ZS_RETURN_IF_ERROR(UpdateLossScale(result.skipped));
  timeline_.AddOptimizer((timeline_.Now() - opt_begin) - (timeline_.comm_wait() - comm_before));

  sequence_hash_ = 0;
  sequence_count_ = 0;
  IssueParamGathers();
  ZS_RETURN_IF_ERROR(StartNextStepPrefetch());
  for (int u = 0; u < layout_.num_units(); ++u) reduced_count_[u] = 0;
  ++step_;
  ++steps_since_start_;
  RecordStepTimes();
  return result;
}

absl::Status EngineImpl::CheckStepPreconditions() const {
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
  if (held_unit_ >= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Step(): unit '%s' is still gathered; Release it first", model_.units[held_unit_].name));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> EngineImpl::NormClipAndUpdate() {
  ZS_ASSIGN_OR_RETURN(const double sum_squares, GlobalSumSquaresAndCheckSequence());
  StepResult result;
  result.step = step_ + 1;
  result.lr = train_.schedule.LrAt(result.step, train_.optimizer.lr);
  result.loss_scale = loss_scale_;
  // The engine holds the SUM of world * accum micro-batch gradients, each
  // multiplied by the loss scale; the optimizer sees their unscaled mean.
  const double mean_scale =
      1.0 / (static_cast<double>(world_) * train_.grad_accum_steps * loss_scale_);
  result.grad_norm = std::sqrt(sum_squares) * mean_scale;
  // Every rank sees the same sum (the non-finite count travels in it), so
  // every rank skips together.
  if (!std::isfinite(result.grad_norm)) {
    result.skipped = true;
    result.clip_coef = 0.0;
    ++stats_.skipped_steps;
    return result;
  }
  if (train_.max_grad_norm > 0.0) {
    // As torch.nn.utils.clip_grad_norm_: scale by max / (norm + 1e-6) when below 1.
    result.clip_coef = std::min(1.0, train_.max_grad_norm / (result.grad_norm + 1e-6));
  }
  ++applied_steps_;
  ZS_RETURN_IF_ERROR(ApplyOptimizer(mean_scale * result.clip_coef, result.lr));
  return result;
}

void EngineImpl::IssueParamGathers() {
  // Only this rank's shard was updated: bring every rank's updated shard of
  // the resident units to all ranks; Gather(u) waits for it, so the
  // all-gathers overlap the forward of earlier units.
  if (!plan_.stage.optimizer_sharded) return;
  for (int u = 0; u < layout_.num_units(); ++u) {
    if (!plan_.unit_resident[u]) continue;
    const UnitSegment& seg = layout_.unit(u);
    if (world_ == 1) continue;  // the shard is the whole unit, updated in place
    param_gathers_[u] = comm_.AllGather(ParamsAt(u, layout_.ShardRange(u, rank_).begin),
                                        ParamsAt(u, 0), seg.shard_numel, param_dtype_, UnitTag(u));
    NoteCollective(CollectiveKind::kAllGatherParams, u, seg.shard_numel);
  }
}

absl::Status EngineImpl::StartNextStepPrefetch() {
  if (plan_.gather_slots == 0) return absl::OkStatus();
  // Stage 3 prefetch: the first step recorded the gather order; from then
  // on the next step's first units are gathered while the trainer loads
  // its data. A step that gathered fewer units than the first falls back.
  if (steps_since_start_ == 0) {
    prefetch_active_ = prefetch_depth_ > 0 && !recorded_order_.empty();
  } else if (prefetch_active_ && order_pos_ != recorded_order_.size()) {
    DisablePrefetch(absl::StrFormat("step %d made %d gathers, the first step %d", step_ + 1,
                                    order_pos_, recorded_order_.size()));
  }
  order_pos_ = 0;
  if (prefetch_active_) ZS_RETURN_IF_ERROR(PrefetchFrom(0));
  return absl::OkStatus();
}

void EngineImpl::RecordStepTimes() {
  // The timeline splits the step (zeroshard/engine.h, StepTimes); the
  // communicator's busy time is read beside it.
  const absl::Duration busy = comm_.busy_time();
  const StepTimes t = timeline_.EndStep(busy - step_comm_busy_begin_);
  step_comm_busy_begin_ = busy;
  stats_.steps = steps_since_start_;
  stats_.last = t;
  StepTimes& sum = stats_.totals;
  sum.compute += t.compute;
  sum.exposed_comm += t.exposed_comm;
  sum.optimizer += t.optimizer;
  sum.input_wait += t.input_wait;
  sum.engine_other += t.engine_other;
  sum.pipeline_bubble += t.pipeline_bubble;
  sum.total += t.total;
  sum.comm_busy += t.comm_busy;
  sum.hidden_comm += t.hidden_comm;
  sum.unplaced_wait += t.unplaced_wait;
}

}  // namespace zeroshard::internal
