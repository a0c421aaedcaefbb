// Engine::Step: reductions, global norm, clipping, fused Adam, param gathers.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/runtime/engine_impl.h"
#include "kernels/cpu/norm.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

absl::StatusOr<double> EngineImpl::GlobalSumSquaresAndCheckSequence() {
  // This rank's exact sum of squares (grad_norm.h); every rank's, as
  // integers, make the norm independent of how it is sharded.
  absl::StatusOr<kernels::ExactSum> local = norm_.LocalSum();
  if (!local.ok()) return Poison(local.status());
  const kernels::ExactSum& sum = *local;
  // One all-gather carries both the accumulator limbs and this step's
  // collective-sequence record, so the divergence check costs no extra
  // round trip.
  constexpr int kLimbs = kernels::ExactSum::kLimbs;
  const bool check = train_.check_collective_sequence;
  const int kRecord = check ? kLimbs + 2 : kLimbs;
  int64_t mine[kLimbs + 2];
  for (int k = 0; k < kLimbs; ++k) mine[k] = sum.limbs()[k];
  if (check) {
    mine[kLimbs] = static_cast<int64_t>(log_.sequence_hash());
    mine[kLimbs + 1] = log_.sequence_count();
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
  ZS_RETURN_IF_ERROR(norm_.AddModelParallel(total));
  return total.Value();
}

// Step() in phases, each a function below: check the calls that came
// before, finish the reductions, the norm and the update, then start the
// next step's communication and book the time.
absl::StatusOr<StepResult> EngineImpl::Step() {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckStepPreconditions());
  ZS_RETURN_IF_ERROR(reducer_->Drain());
  // Stage 3: the optimizer rewrites the param shards the gathered copies
  // came from; finish and forget them.
  ZS_RETURN_IF_ERROR(gatherer_->DropPool());

  // The optimizer: norm (its all-gather's wait is exposed communication),
  // clipping, the update and the loss scale.
  const absl::Duration comm_before = timeline_.comm_wait();
  const absl::Duration opt_begin = timeline_.Now();
  ZS_ASSIGN_OR_RETURN(StepResult result, NormClipAndUpdate());
  ZS_RETURN_IF_ERROR(Poison(loss_scaler_.Update(result.skipped, step_ + 1)));
  timeline_.AddOptimizer((timeline_.Now() - opt_begin) - (timeline_.comm_wait() - comm_before));

  log_.BeginNextStep();
  gatherer_->IssueUpdatedParamGathers();
  ZS_RETURN_IF_ERROR(gatherer_->EndStep(step_ + 1, steps_since_start_ == 0));
  reducer_->BeginNextStep();
  norm_.BeginNextStep();
  ++step_;
  ++steps_since_start_;
  RecordStepTimes();
  return result;
}

absl::Status EngineImpl::CheckStepPreconditions() const {
  ZS_RETURN_IF_ERROR(CheckTraining("Step"));
  for (int u = 0; u < layout_.num_spec_units(); ++u) {
    // A unit of frozen params only has no gradient to reduce.
    const int want = reducer_->HasGrads(u) ? train_.grad_accum_steps : 0;
    if (reducer_->view_open(u) || reducer_->reduced_count(u) != want) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Step(): unit '%s' has %d of %d micro-batch gradients reduced%s; every unit must be "
          "reduced once per micro-batch before Step()",
          model_.units[u].name, reducer_->reduced_count(u), want,
          reducer_->view_open(u) ? " and an open GradView" : ""));
    }
  }
  if (const int held = gatherer_->held_unit(); held >= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Step(): unit '%s' is still gathered; Release it first", model_.units[held].name));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> EngineImpl::NormClipAndUpdate() {
  ZS_ASSIGN_OR_RETURN(const double sum_squares, GlobalSumSquaresAndCheckSequence());
  StepResult result;
  result.step = step_ + 1;
  result.lr = train_.schedule.LrAt(result.step, train_.optimizer.lr);
  result.loss_scale = loss_scaler_.scale();
  // The engine holds the SUM of world * accum micro-batch gradients, each
  // multiplied by the loss scale; the optimizer sees their unscaled mean.
  const double mean_scale =
      1.0 / (static_cast<double>(world_) * train_.grad_accum_steps * loss_scaler_.scale());
  result.grad_norm = std::sqrt(sum_squares) * mean_scale;
  // Every rank sees the same sum (the non-finite count travels in it), so
  // every rank skips together.
  if (!std::isfinite(result.grad_norm)) {
    result.skipped = true;
    result.clip_coef = 0.0;
    ++stats_.skipped_steps;
    // The gradients' host copies of the skipped step must be done before
    // the next step's reductions overwrite what they read.
    if (offload_ != nullptr) ZS_RETURN_IF_ERROR(Poison(offload_->Quiesce()));
    return result;
  }
  if (train_.max_grad_norm > 0.0) {
    // As torch.nn.utils.clip_grad_norm_: scale by max / (norm + 1e-6) when below 1.
    result.clip_coef = std::min(1.0, train_.max_grad_norm / (result.grad_norm + 1e-6));
  }
  if (offload_ != nullptr) {
    // The state's tier: a removed or truncated swap file fails the step
    // here, by name, before any chunk is read. The gradients are final once
    // the compute stream (the norm's block sums) is done with them.
    ZS_RETURN_IF_ERROR(Poison(offload_->CheckFiles()));
    ZS_RETURN_IF_ERROR(SyncCompute());
    ZS_RETURN_IF_ERROR(
        Poison(offload_->Apply(optimizer_, mean_scale * result.clip_coef, result.lr)));
  } else {
    ZS_RETURN_IF_ERROR(optimizer_.Apply(buffers_, *ops_, mean_scale * result.clip_coef, result.lr));
  }
  // The param all-gathers (and the trainer's next Gather) read the updated
  // params.
  ZS_RETURN_IF_ERROR(SyncCompute());
  return result;
}

absl::Status EngineImpl::SetFrozenParam(int unit, int param, absl::Span<const float> values) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckBetweenSteps("SetFrozenParam"));
  ZS_RETURN_IF_ERROR(CheckParamValues("SetFrozenParam", unit, param, values));
  const UnitSpec& spec = model_.units[unit];
  if (spec.params[param].trainable) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SetFrozenParam(%s.%s): the param is declared trainable, so the optimizer owns its "
        "values; only a param declared frozen (ParamSpec::trainable false) takes new values "
        "between steps",
        spec.name, spec.params[param].name));
  }
  const ParamPlace place = layout_.PlaceOf(unit, param);
  const int s = place.segment;
  const ParamSlot& slot = layout_.unit(s).params[place.slot];
  // Stages 1-2 may still be all-gathering the segment's params after the
  // last step, and stage 3 keeps a frozen segment's gathered copy across
  // steps: both would bring the old values back.
  ZS_RETURN_IF_ERROR(gatherer_->WaitUpdatedParamGathers(WaitSite::kSetFrozenParam));
  ZS_RETURN_IF_ERROR(Poison(gatherer_->DropSegment(s)));
  const ElementRange held = buffers_.ParamsHeld(s);
  const int64_t begin = std::max(held.begin, slot.offset);
  const int64_t end = std::min(held.end, slot.offset + slot.numel);
  std::vector<uint16_t> staging;
  if (begin < end) {
    ZS_RETURN_IF_ERROR(
        StoreParams(s, begin, end - begin, values.data() + (begin - slot.offset), staging));
  }
  return SyncCompute();
}

absl::Status EngineImpl::SetTrainable(int unit, int param, bool trainable) {
  StepTimeline::Call call(timeline_);
  // What this rank can tell alone; the exchange below makes every rank
  // return the same verdict, so one rank's mistake cannot leave the others
  // waiting in a collective.
  absl::Status local = CheckBetweenSteps("SetTrainable");
  if (!started_) return local;  // every rank alike
  ZS_RETURN_IF_ERROR(poisoned_);
  if (local.ok()) local = CheckUnit(unit, "SetTrainable");
  if (local.ok() && (param < 0 || param >= static_cast<int>(model_.units[unit].params.size()))) {
    local = absl::OutOfRangeError(
        absl::StrFormat("SetTrainable: unit '%s' has params 0..%d, not %d", model_.units[unit].name,
                        model_.units[unit].params.size() - 1, param));
  }
  if (local.ok()) {
    const ParamSpec& spec = model_.units[unit].params[param];
    const std::string name = absl::StrCat(model_.units[unit].name, ".", spec.name);
    if (spec.tied_to.has_value()) {
      local = absl::InvalidArgumentError(absl::StrFormat(
          "SetTrainable(%s): the param is tied to %s.%s; freeze or unfreeze that one", name,
          spec.tied_to->unit, spec.tied_to->param));
    } else if (!spec.trainable) {
      local = absl::InvalidArgumentError(absl::StrFormat(
          "SetTrainable(%s): the param is declared frozen (ParamSpec::trainable false), so it has "
          "no gradient or optimizer state to train with; declare it trainable and freeze it with "
          "SetTrainable(..., false) instead",
          name));
    }
  }
  // Every rank's call, compared with rank 0's.
  const int64_t mine[4] = {unit, param, trainable ? 1 : 0, static_cast<int64_t>(local.code())};
  std::vector<int64_t> all(static_cast<size_t>(4) * world_);
  log_.Note(CollectiveKind::kSetTrainable, -4, 4);
  const absl::Status exchanged = HostAllGather(mine, all.data(), 4);
  if (!exchanged.ok()) {
    return absl::Status(
        exchanged.code(),
        absl::StrFormat("SetTrainable(%d, %d, %s): the ranks did not all call it "
                        "(every rank must, between the same steps): %s",
                        unit, param, trainable ? "true" : "false", exchanged.message()));
  }
  if (!local.ok()) return local;
  std::vector<std::string> differ;
  for (int r = 0; r < world_; ++r) {
    const int64_t* rec = &all[static_cast<size_t>(r) * 4];
    if (rec[3] != 0) {
      return absl::Status(static_cast<absl::StatusCode>(rec[3]),
                          absl::StrFormat("SetTrainable: rank %d refused its call, so no rank "
                                          "applies it (see rank %d's error)",
                                          r, r));
    }
    if (rec[0] != all[0] || rec[1] != all[1] || rec[2] != all[2]) {
      differ.push_back(absl::StrFormat("rank %d called SetTrainable(%d, %d, %s)", r, rec[0], rec[1],
                                       rec[2] ? "true" : "false"));
    }
  }
  if (!differ.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "SetTrainable: rank 0 called SetTrainable(%d, %d, %s) but %s; every rank must freeze and "
        "unfreeze the same params between the same steps",
        all[0], all[1], all[2] ? "true" : "false", absl::StrJoin(differ, ", ")));
  }
  const ParamPlace place = layout_.PlaceOf(unit, param);
  frozen_now_[place.segment][place.slot] = trainable ? 0 : 1;
  optimizer_.set_runs(ExcludeFrozenNow(
      BuildUpdateRuns(layout_, model_, [this](int u) { return buffers_.OwnedRange(u); })));
  return absl::OkStatus();
}

std::vector<UpdateRun> EngineImpl::ExcludeFrozenNow(std::vector<UpdateRun> runs) const {
  // Cut the params frozen by SetTrainable out of the update runs.
  std::vector<UpdateRun> out;
  for (const UpdateRun& run : runs) {
    const UnitSegment& seg = layout_.unit(run.unit);
    int64_t pos = run.range.begin;
    for (size_t k = 0; k < seg.params.size(); ++k) {
      if (!frozen_now_[run.unit][k]) continue;
      const int64_t fb = std::max(pos, seg.params[k].offset);
      const int64_t fe = std::min(run.range.end, seg.params[k].offset + seg.params[k].numel);
      if (fb >= fe) continue;
      if (fb > pos) {
        UpdateRun piece = run;
        piece.range = {pos, fb};
        out.push_back(piece);
      }
      pos = fe;
    }
    if (pos < run.range.end) {
      UpdateRun piece = run;
      piece.range = {pos, run.range.end};
      out.push_back(piece);
    }
  }
  return out;
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
