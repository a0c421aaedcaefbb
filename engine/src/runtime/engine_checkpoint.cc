// Engine::Save, WaitForCheckpoint and Load (docs/checkpoint.md).
//
// Save checks the call and fills the manifest from the engine's state; the
// CheckpointWriter (checkpoint_writer.h) takes the snapshot, writes it on
// its thread and commits it at the next Save or WaitForCheckpoint.
//
// Load reads, on every rank, only the elements the rank owns in the new
// layout from the old files (whatever the old world size and stage), into
// fresh vectors; one all-gather decides, and only when every rank succeeded
// do the engine's buffers take the values.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/src/checkpoint/directory.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/segment_reader.h"
#include "engine/src/common/model_spec_changes.h"
#include "engine/src/common/train_spec_fields.h"
#include "engine/src/runtime/engine_impl.h"
#include "engine/src/runtime/fingerprint.h"
#include "engine/src/runtime/slice_reader.h"
#include "engine/src/runtime/status_words.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

absl::Status EngineImpl::CheckBetweenSteps(const char* call) const {
  ZS_RETURN_IF_ERROR(CheckTraining(call));
  for (int u = 0; u < layout_.num_spec_units(); ++u) {
    if (reducer_->view_open(u) || reducer_->reduced_count(u) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s in the middle of a step (unit '%s' has gradients of this step); call it after "
          "Step()",
          call, model_.units[u].name));
    }
  }
  if (const int held = gatherer_->held_unit(); held >= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s while unit '%s' is gathered; Release it first", call, model_.units[held].name));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::PrepareCheckpointDirectory(const std::string& dir) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(poisoned_);
  absl::Status local =
      started_ ? CheckBetweenSteps("PrepareCheckpointDirectory") : absl::OkStatus();
  if (local.ok() && dir.empty()) {
    local = absl::InvalidArgumentError("the checkpoint directory is empty");
  }
  return checkpoint_->CheckSharedDirectory(dir, dir, /*fresh=*/false, local,
                                           "PrepareCheckpointDirectory");
}

absl::Status EngineImpl::CheckSaveCall(const char* call, const std::string& dir,
                                       const std::string& state, const CheckpointOptions& options,
                                       int64_t* state_bytes) const {
  ZS_RETURN_IF_ERROR(CheckBetweenSteps(call));
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the checkpoint directory is empty", call));
  }
  if (options.keep_last < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: keep_last %d must be >= 1 (the newest complete checkpoint is always kept)", call,
        options.keep_last));
  }
  ZS_ASSIGN_OR_RETURN(*state_bytes, TrainerStateManifestBytes(state));
  return absl::OkStatus();
}

Manifest EngineImpl::StateManifest(const std::string& state) const {
  Manifest m;
  m.step = step_;
  m.applied_steps = optimizer_.applied_steps();
  m.skipped_steps = stats_.skipped_steps;
  m.world_size = world_;
  m.train = train_;
  const LossScaler::State& scale = loss_scaler_.state();
  m.loss_scale = scale.scale;
  m.hysteresis_left = scale.hysteresis_left;
  m.clean_steps = scale.clean_steps;
  m.skips_at_min_scale = scale.skips_at_min_scale;
  m.trainer_state = state;
  return m;
}

absl::Status EngineImpl::Save(const std::string& dir, const std::string& trainer_state,
                              const CheckpointOptions& options) {
  StepTimeline::Call call(timeline_);
  // What this rank can tell alone; the directory check below makes every
  // rank return the same verdict, so one rank's bad argument cannot leave
  // the others waiting in a collective.
  const std::string state = trainer_state.empty() ? "{}" : trainer_state;
  int64_t state_bytes = 0;
  const absl::Status local = CheckSaveCall("Save", dir, state, options, &state_bytes);
  if (!started_) return local;  // CheckBetweenSteps said so, on every rank alike
  // The previous checkpoint becomes complete (or reports its failure) first.
  ZS_RETURN_IF_ERROR(WaitForCheckpoint());

  Manifest m = StateManifest(state);
  // The manifest records what its JSON holds: no tensor-parallel split.
  m.model = model_;
  for (UnitSpec& unit : m.model.units) {
    for (ParamSpec& param : unit.params) param.tp_split_dim = -1;
  }
  m.model_fingerprint = FingerprintModelSpec(m.model);
  for (int u = 0; u < layout_.num_units(); ++u) {
    m.used_numel.push_back(layout_.unit(u).used_numel);
    m.shard_numel.push_back(layout_.unit(u).shard_numel);
  }
  ZS_RETURN_IF_ERROR(checkpoint_->Begin(dir, options, std::move(m), local, state_bytes));
  if (!options.background) return WaitForCheckpoint();
  return absl::OkStatus();
}

absl::Status EngineImpl::WaitForCheckpoint() {
  // From Save too: the nested call counts once.
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(checkpoint_->Commit(poisoned_));
  return slices_ == nullptr ? absl::OkStatus() : slices_->writer->Commit(poisoned_);
}

absl::StatusOr<CheckpointInfo> EngineImpl::Load(const std::string& path) {
  return LoadImpl(path, nullptr);
}

absl::StatusOr<CheckpointInfo> EngineImpl::LoadSlices(
    const std::string& path, const std::vector<std::vector<ParamOrigin>>& origins) {
  return LoadImpl(path, &origins);
}

absl::StatusOr<CheckpointInfo> EngineImpl::LoadImpl(
    const std::string& path, const std::vector<std::vector<ParamOrigin>>* origins) {
  ZS_RETURN_IF_ERROR(poisoned_);
  if (started_) {
    return absl::FailedPreconditionError(
        "Load after Start(): load a checkpoint into a fresh engine, before Start, instead of "
        "SetParam");
  }
  // Each rank reads what it owns into fresh buffers; nothing of the engine
  // changes until every rank succeeded.
  const int units = layout_.num_units();
  std::vector<ElementRange> owned(units);
  std::vector<std::vector<float>> fresh(static_cast<size_t>(units) * kTensorsPerUnit);
  for (int u = 0; u < units; ++u) {
    // A frozen segment has params only: the rank reads what it holds.
    const bool frozen = !layout_.unit(u).trainable;
    owned[u] = frozen ? buffers_.ParamsHeld(u) : OwnedRange(u);
    for (int t = 0; t < (frozen ? 1 : kTensorsPerUnit); ++t) {
      fresh[static_cast<size_t>(u) * kTensorsPerUnit + t].assign(
          static_cast<size_t>(owned[u].size()), 0.0f);
    }
  }
  Manifest manifest;
  std::string step_dir;
  std::string resolve_note;
  uint64_t manifest_hash = 0;
  absl::Status read = [&]() -> absl::Status {
    ZS_ASSIGN_OR_RETURN(step_dir, ResolveCheckpointWithNote(path, &resolve_note));
    ZS_ASSIGN_OR_RETURN(manifest, ReadManifest(step_dir));
    // The storage must match; the param groups may change (reported below).
    // LoadSlices: each param names its place in the checkpoint's model.
    const std::string difference =
        origins != nullptr ? std::string() : DescribeModelStorageDifference(manifest.model, model_);
    if (!difference.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("checkpoint %s belongs to another model: %s", step_dir, difference));
    }
    const OptimizerSpec& a = manifest.train.optimizer;
    const OptimizerSpec& b = train_.optimizer;
    if (!MustMatchDifferences(manifest.train, train_).empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpoint %s: its optimizer is %s with beta1 %g, beta2 %g, eps %g; this engine's is "
          "%s with %g, %g, %g: the Adam moments do not carry over to another optimizer",
          step_dir, a.kind == OptimizerKind::kAdamW ? "AdamW" : "AdamL2", a.beta1, a.beta2, a.eps,
          b.kind == OptimizerKind::kAdamW ? "AdamW" : "AdamL2", b.beta1, b.beta2, b.eps));
    }
    manifest_hash = HashBytes(&manifest.step, sizeof(manifest.step), manifest.model_fingerprint);
    for (const FileRecord& f : manifest.files) {
      manifest_hash = HashBytes(&f.crc32c, sizeof(f.crc32c), manifest_hash);
    }
    // Each old rank's file holds a shard of the old layout: read from those
    // whose shards overlap what this rank owns.
    SegmentReader reader(step_dir, manifest);
    if (origins != nullptr) {
      return ReadParamSlices(model_, layout_, *origins, manifest, reader, owned, fresh);
    }
    for (int u = 0; u < units; ++u) {
      float* out[kTensorsPerUnit];
      for (int t = 0; t < kTensorsPerUnit; ++t) {
        std::vector<float>& values = fresh[static_cast<size_t>(u) * kTensorsPerUnit + t];
        out[t] = values.empty() ? nullptr : values.data();
      }
      ZS_RETURN_IF_ERROR(reader.Read(u, owned[u].begin, owned[u].end, out));
    }
    return absl::OkStatus();
  }();

  // Every rank's verdict, and which checkpoint it read.
  const int64_t words = 3 + kMessageWords;
  std::vector<int64_t> mine(static_cast<size_t>(words), 0);
  mine[0] = read.ok() ? 1 : 0;
  mine[1] = static_cast<int64_t>(manifest_hash);
  mine[2] = static_cast<int64_t>(read.code());
  PackMessage(read.ok() ? std::string() : std::string(read.message()), &mine[3]);
  std::vector<int64_t> all(static_cast<size_t>(words) * world_);
  log_.Note(CollectiveKind::kCheckpoint, -3, words);
  ZS_RETURN_IF_ERROR(HostAllGather(mine.data(), all.data(), words));
  if (!read.ok()) return read;
  for (int r = 0; r < world_; ++r) {
    const int64_t* rec = &all[static_cast<size_t>(r) * words];
    if (rec[0] != 1) {
      // The same code as the rank that failed, so every rank reports alike.
      return absl::Status(static_cast<absl::StatusCode>(rec[2]),
                          absl::StrFormat("Load: rank %d could not load the checkpoint, so no "
                                          "rank does: %s",
                                          r, UnpackMessage(rec + 3)));
    }
    if (rec[1] != all[1]) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Load: rank %d read another checkpoint than rank 0 (different step or files); every "
          "rank must load the same one",
          r));
    }
  }

  // Every rank succeeded: the engine takes the values (host -> device; the
  // 16-bit params converted on the host into `staging`, alive until the sync).
  std::vector<std::vector<uint16_t>> staging(static_cast<size_t>(units));
  for (int u = 0; u < units; ++u) {
    const ElementRange range = owned[u];
    const int64_t n = range.size();
    const float* master = fresh[static_cast<size_t>(u) * kTensorsPerUnit].data();
    ZS_RETURN_IF_ERROR(StoreParams(u, range.begin, n, master, staging[u]));
    if (!layout_.unit(u).trainable) continue;  // params only
    if (mixed_) ZS_RETURN_IF_ERROR(WriteState(StateTensor::kMaster, u, range.begin, n, master));
    ZS_RETURN_IF_ERROR(WriteState(StateTensor::kAdamM, u, range.begin, n,
                                  fresh[static_cast<size_t>(u) * kTensorsPerUnit + 1].data()));
    ZS_RETURN_IF_ERROR(WriteState(StateTensor::kAdamV, u, range.begin, n,
                                  fresh[static_cast<size_t>(u) * kTensorsPerUnit + 2].data()));
  }
  ZS_RETURN_IF_ERROR(SyncCompute());
  // Resident units of a sharded optimizer hold every rank's part of the
  // params: bring them together, as after a step.
  gatherer_->IssueUpdatedParamGathers();
  ZS_RETURN_IF_ERROR(gatherer_->WaitUpdatedParamGathers(WaitSite::kSave));
  step_ = manifest.step;
  optimizer_.set_applied_steps(manifest.applied_steps);
  stats_.skipped_steps = manifest.skipped_steps;
  if (train_.precision == Precision::kFp16Mixed &&
      manifest.train.precision == Precision::kFp16Mixed) {
    loss_scaler_.Restore({manifest.loss_scale, manifest.hysteresis_left, manifest.clean_steps,
                          manifest.skips_at_min_scale});
  }
  // Start() compares initial weights by these: every rank loaded the same
  // checkpoint (checked above), so they agree.
  for (auto& unit_hashes : param_hashes_) {
    for (uint64_t& h : unit_hashes) h = manifest_hash | 1;
  }
  CheckpointInfo info = DescribeCheckpoint(step_dir, manifest, resolve_note);
  if (manifest.world_size != world_) {
    info.changed_settings.push_back(
        absl::StrCat("world size ", manifest.world_size, " -> ", world_));
  }
  for (std::string& change :
       DescribeTrainSpecChanges(manifest.train, train_, manifest.unrecorded_train_fields)) {
    info.changed_settings.push_back(std::move(change));
  }
  for (std::string& change : DescribeParamGroupChanges(manifest.model, model_)) {
    info.changed_settings.push_back(std::move(change));
  }
  return info;
}

}  // namespace zeroshard::internal
