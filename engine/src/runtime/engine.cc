// Engine creation, start-up checks, param and gradient views.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/runtime/engine_impl.h"
#include "engine/src/runtime/fingerprint.h"
#include "zeroshard/status.h"

namespace zeroshard {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const ModelSpec& model,
                                                       const TrainSpec& train, Device& device,
                                                       Communicator& comm) {
  ZS_RETURN_IF_ERROR(train.Validate());
  if (device.kind() != comm.memory_kind()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Engine::Create: device %s holds %s memory, but the '%s' communicator moves %s memory; "
        "use a %s communicator for this device (nccl for a CUDA device, local or mpi for the "
        "CPU)",
        device.name(), device.kind() == DeviceKind::kCuda ? "GPU" : "host", comm.backend(),
        comm.memory_kind() == DeviceKind::kCuda ? "GPU" : "host",
        device.kind() == DeviceKind::kCuda ? "GPU" : "host"));
  }
  if (const Device* group = comm.memory_device();
      group != nullptr && group->kind() == DeviceKind::kCuda && group->name() != device.name()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Engine::Create: the engine's device is %s but the '%s' communicator's group moves %s's "
        "memory; create the engine on %s (ranks as threads share one GPU)",
        device.name(), comm.backend(), group->name(), group->name()));
  }
  ZS_ASSIGN_OR_RETURN(internal::FlatLayout layout,
                      internal::FlatLayout::Create(model, comm.size()));
  ZS_ASSIGN_OR_RETURN(BufferPlan plan, internal::PlanBuffers(layout, train));
  auto engine = std::make_unique<internal::EngineImpl>(model, train, device, comm,
                                                       std::move(layout), std::move(plan));
  ZS_RETURN_IF_ERROR(engine->Allocate());
  return std::unique_ptr<Engine>(std::move(engine));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const ModelSpec& model,
                                                       const TrainSpec& train, Device& device,
                                                       Communicator& comm,
                                                       const ModelParallelOptions& parallel) {
  if (parallel.group == nullptr) return Create(model, train, device, comm);
  // The agreement moves a few host int64 words; a group whose collectives
  // need device buffers (nccl) is not supported yet.
  if (parallel.group->memory_kind() != DeviceKind::kCpu) {
    return absl::UnimplementedError(absl::StrFormat(
        "Engine::Create: the model-parallel group is a '%s' communicator of GPU memory; it must "
        "be a host memory communicator (local or mpi) for now",
        parallel.group->backend()));
  }
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Create(model, train, device, comm));
  static_cast<internal::EngineImpl*>(engine.get())->SetModelParallel(parallel);
  return engine;
}

namespace internal {

EngineImpl::EngineImpl(const ModelSpec& model, const TrainSpec& train, Device& device,
                       Communicator& comm, FlatLayout layout, BufferPlan plan)
    : model_(model),
      train_(train),
      device_(device),
      comm_(comm),
      layout_(std::move(layout)),
      plan_(std::move(plan)),
      rank_(comm.rank()),
      world_(comm.size()),
      param_dtype_(train.param_dtype()),
      grad_dtype_(train.effective_grad_dtype()),
      mixed_(train.precision != Precision::kFp32) {
  const int units = layout_.num_units();
  param_hashes_.resize(units);
  for (int u = 0; u < units; ++u) param_hashes_[u].assign(model_.units[u].params.size(), 0);
  reduced_count_.assign(units, 0);
  open_grad_slot_.assign(units, kNoGradView);
  unit_reductions_.resize(units);
  param_gathers_.resize(units);
  unit_norm_done_.assign(units, 0);
  slots_.resize(plan_.grad_staging_slots);
  for (int s = 0; s < plan_.grad_staging_slots; ++s) free_slots_.push_back(s);
  // Where each unit's params live in the params buffer: its full segment,
  // or (stage 3) this rank's shard of it.
  int64_t offset = 0;
  for (int u = 0; u < units; ++u) {
    param_offset_.push_back(offset);
    offset += plan_.unit_resident[u] ? layout_.unit(u).padded_numel : layout_.unit(u).shard_numel;
  }
  gather_slots_.resize(plan_.gather_slots);
  unit_gather_slot_.assign(units, -1);
  gathered_.assign(units, 0);
  prefetch_depth_ = std::max(0, plan_.gather_slots - 1);
  if (train_.precision == Precision::kFp16Mixed) {
    loss_scale_ = train_.loss_scale.initial_scale;
    hysteresis_left_ = train_.loss_scale.hysteresis;
  }
  BuildDecayRuns();
}

EngineImpl::~EngineImpl() {
  if (started_ && std::getenv(kDebugCommWaitsEnvVar) != nullptr) PrintCommWaits();
  // A background checkpoint write owns its snapshot; let it finish (the
  // checkpoint stays incomplete without WaitForCheckpoint's commit).
  if (pending_checkpoint_ != nullptr && pending_checkpoint_->writer.joinable()) {
    pending_checkpoint_->writer.join();
  }
  // Peers may still be reading our buffers: finish every collective first.
  for (int s : busy_slots_) slots_[s].reduction.Wait().IgnoreError();
  for (CommHandle& h : unit_reductions_) h.Wait().IgnoreError();
  for (CommHandle& h : param_gathers_) h.Wait().IgnoreError();
  for (GatherSlot& g : gather_slots_) g.gather.Wait().IgnoreError();
}

absl::Status EngineImpl::Allocate() {
  // Exactly the plan's buffers, nothing else.
  for (const PlannedBuffer& b : plan_.buffers) {
    ZS_ASSIGN_OR_RETURN(DeviceBuffer buffer, device_.Allocate(b.bytes(), b.category, b.name));
    if (b.name == kParamsBuffer) {
      params_ = std::move(buffer);
    } else if (b.name == kGradsBuffer) {
      grads_ = std::move(buffer);
    } else if (b.name == kMasterBuffer) {
      master_ = std::move(buffer);
    } else if (b.name == kAdamMBuffer) {
      adam_m_ = std::move(buffer);
    } else if (b.name == kAdamVBuffer) {
      adam_v_ = std::move(buffer);
    } else if (b.name == kGradStagingBuffer) {
      staging_ = std::move(buffer);
    } else if (b.name == kNormBlocksBuffer) {
      norm_blocks_ = std::move(buffer);
    } else if (b.name == kParamGatherBuffer) {
      gather_pool_ = std::move(buffer);
    } else {
      return absl::InternalError(absl::StrFormat(
          "engine: the plan lists buffer '%s' that the engine does not use", b.name));
    }
  }
  ZS_ASSIGN_OR_RETURN(compute_, device_.CreateStream());
  ZS_ASSIGN_OR_RETURN(ops_, CreateDeviceOps(device_, *compute_));
  if (!device_.host_accessible()) {
    host_norm_blocks_.resize(static_cast<size_t>(norm_blocks_.bytes()) / sizeof(double));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::CopyOnCompute(void* dst, const void* src, int64_t bytes) const {
  return device_.CopyAsync(dst, src, bytes, *compute_);
}

absl::Status EngineImpl::StoreConverted(const float* values, int64_t n, DType dtype, void* dst,
                                        std::vector<uint16_t>& staging) const {
  if (dtype == DType::kFloat32) {
    return CopyOnCompute(dst, values, n * static_cast<int64_t>(sizeof(float)));
  }
  staging.resize(static_cast<size_t>(n));
  if (dtype == DType::kBFloat16) {
    ConvertFp32ToBf16(values, staging.data(), static_cast<size_t>(n));
  } else {
    ConvertFp32ToFp16(values, staging.data(), static_cast<size_t>(n));
  }
  return CopyOnCompute(dst, staging.data(), n * static_cast<int64_t>(sizeof(uint16_t)));
}

absl::Status EngineImpl::HostAllGather(const int64_t* mine, int64_t* all, int64_t count) {
  if (device_.host_accessible()) {
    CommHandle handle = comm_.AllGather(mine, all, count, DType::kInt64);
    return WaitComm(handle, WaitSite::kRecordExchange);
  }
  const int64_t bytes = count * static_cast<int64_t>(sizeof(int64_t));
  ZS_ASSIGN_OR_RETURN(int64_t * dev_mine, RecordExchange(count * (world_ + 1)));
  int64_t* dev_all = dev_mine + count;
  ZS_RETURN_IF_ERROR(CopyOnCompute(dev_mine, mine, bytes));
  ZS_RETURN_IF_ERROR(SyncCompute());
  CommHandle handle = comm_.AllGather(dev_mine, dev_all, count, DType::kInt64);
  ZS_RETURN_IF_ERROR(WaitComm(handle, WaitSite::kRecordExchange));
  ZS_RETURN_IF_ERROR(CopyOnCompute(all, dev_all, bytes * world_));
  return SyncCompute();
}

absl::Status EngineImpl::HostBroadcast(int64_t* words, int64_t count, int root) {
  if (device_.host_accessible()) {
    CommHandle handle = comm_.Broadcast(words, count, DType::kInt64, root);
    return WaitComm(handle, WaitSite::kRecordExchange);
  }
  const int64_t bytes = count * static_cast<int64_t>(sizeof(int64_t));
  ZS_ASSIGN_OR_RETURN(int64_t * temp, RecordExchange(count));
  ZS_RETURN_IF_ERROR(CopyOnCompute(temp, words, bytes));
  ZS_RETURN_IF_ERROR(SyncCompute());
  CommHandle handle = comm_.Broadcast(temp, count, DType::kInt64, root);
  ZS_RETURN_IF_ERROR(WaitComm(handle, WaitSite::kRecordExchange));
  ZS_RETURN_IF_ERROR(CopyOnCompute(words, temp, bytes));
  return SyncCompute();
}

absl::StatusOr<int64_t*> EngineImpl::RecordExchange(int64_t words) {
  const int64_t bytes = words * static_cast<int64_t>(sizeof(int64_t));
  if (record_exchange_.bytes() < bytes) {
    record_exchange_ = DeviceBuffer();  // free first: the ledger never holds both
    ZS_ASSIGN_OR_RETURN(record_exchange_, device_.Allocate(bytes, MemoryCategory::kWorkspace,
                                                           "host_record_exchange"));
  }
  return record_exchange_.as<int64_t>();
}

absl::StatusOr<std::shared_ptr<Event>> EngineImpl::RecordCompute() {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device_.CreateEvent());
  ZS_RETURN_IF_ERROR(event->Record(*compute_));
  return std::shared_ptr<Event>(std::move(event));
}

absl::Status EngineImpl::SyncCompute() {
  const absl::Status status = compute_->Synchronize();
  if (!status.ok()) {
    return Poison(absl::Status(status.code(), absl::StrFormat("%s: work on the compute stream "
                                                              "failed: %s",
                                                              device_.name(), status.message())));
  }
  return absl::OkStatus();
}

void EngineImpl::SetModelParallel(const ModelParallelOptions& parallel) {
  model_parallel_ = parallel.group;
  norm_ranges_.assign(layout_.num_units(), {});
  if (parallel.count_replicated) return;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitSegment& seg = layout_.unit(u);
    const UnitSpec& spec = model_.units[u];
    bool any_replicated = false;
    for (const ParamSpec& p : spec.params) any_replicated |= p.tp_split_dim < 0;
    if (!any_replicated) continue;
    // Runs of params alike (counted or replicated), each param taken with
    // the alignment gap after it (zero padding, so its squares are moot):
    // the runs then start at param offsets, multiples of 64, so no norm
    // block holds two runs of one kind and the blocks buffer suffices.
    std::vector<NormRange>& runs = norm_ranges_[u];
    for (size_t p = 0; p < seg.params.size(); ++p) {
      const bool counted = spec.params[p].tp_split_dim >= 0;
      const int64_t begin = p == 0 ? 0 : seg.params[p].offset;
      const int64_t end = p + 1 < seg.params.size() ? seg.params[p + 1].offset : seg.padded_numel;
      if (!runs.empty() && runs.back().counted == counted) {
        runs.back().range.end = end;
      } else {
        runs.push_back({{begin, end}, counted});
      }
    }
  }
}

void EngineImpl::BuildDecayRuns() {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const ElementRange owned = OwnedRange(u);
    const UnitSegment& seg = layout_.unit(u);
    const UnitSpec& spec = model_.units[u];
    // Each param's run also takes the alignment gap before it; the tail
    // padding joins the last run. Padding is zero, so its decay is moot.
    std::vector<DecayRun> runs;
    int64_t pos = owned.begin;
    for (size_t p = 0; p < seg.params.size() && pos < owned.end; ++p) {
      const int64_t end = std::min(seg.params[p].offset + seg.params[p].numel, owned.end);
      if (end <= pos) continue;
      runs.push_back({u, {pos, end}, !spec.params[p].no_decay});
      pos = end;
    }
    if (pos < owned.end) {
      const bool decay = runs.empty() ? true : runs.back().decay;
      runs.push_back({u, {pos, owned.end}, decay});
    }
    for (const DecayRun& run : runs) {
      if (!decay_runs_.empty() && decay_runs_.back().unit == u &&
          decay_runs_.back().decay == run.decay &&
          decay_runs_.back().range.end == run.range.begin) {
        decay_runs_.back().range.end = run.range.end;
      } else {
        decay_runs_.push_back(run);
      }
    }
  }
}

ElementRange EngineImpl::OwnedRange(int unit) const {
  if (!plan_.stage.optimizer_sharded) return {0, layout_.unit(unit).padded_numel};
  return layout_.ShardRange(unit, rank_);
}

void* EngineImpl::ParamsAt(int unit, int64_t seg_index) const {
  // A sharded unit's params hold only this rank's shard.
  const int64_t element = plan_.unit_resident[unit] ? param_offset_[unit] + seg_index
                                                    : param_offset_[unit] + seg_index -
                                                          layout_.ShardRange(unit, rank_).begin;
  return params_.as<char>() + element * static_cast<int64_t>(DTypeSize(param_dtype_));
}

void* EngineImpl::GradsAt(int unit, int64_t seg_index) const {
  const UnitSegment& seg = layout_.unit(unit);
  const int64_t element = plan_.stage.grads_sharded
                              ? seg.shard_offset + (seg_index - rank_ * seg.shard_numel)
                              : seg.offset + seg_index;
  return grads_.as<char>() + element * static_cast<int64_t>(DTypeSize(grad_dtype_));
}

float* EngineImpl::OptimizerAt(const DeviceBuffer& buf, int unit, int64_t seg_index) const {
  const UnitSegment& seg = layout_.unit(unit);
  const int64_t element = !plan_.stage.optimizer_sharded
                              ? seg.offset + seg_index
                              : seg.shard_offset + (seg_index - rank_ * seg.shard_numel);
  return buf.as<float>() + element;
}

void* EngineImpl::StagingSlotData(int slot) const {
  return staging_.as<char>() +
         slot * layout_.max_unit_numel() * static_cast<int64_t>(DTypeSize(grad_dtype_));
}

absl::Status EngineImpl::CheckUnit(int unit, const char* call) const {
  if (unit < 0 || unit >= layout_.num_units()) {
    return absl::OutOfRangeError(
        absl::StrFormat("%s(%d): the model has units 0..%d", call, unit, layout_.num_units() - 1));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::CheckStarted(const char* call) const {
  ZS_RETURN_IF_ERROR(poisoned_);
  if (!started_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s before Start(): set every param, then call Start() on every rank", call));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::Poison(absl::Status status) {
  if (poisoned_.ok() && !status.ok()) poisoned_ = status;
  return status;
}

absl::Status EngineImpl::WaitComm(CommHandle& handle, WaitSite site) {
  if (!handle.valid()) return absl::OkStatus();
  const absl::Duration begin = timeline_.Now();
  absl::Status status = handle.Wait();
  handle = CommHandle();
  const absl::Duration waited = timeline_.Now() - begin;
  timeline_.AddCommWait(waited);
  if (timeline_.running()) {
    site_wait_[static_cast<int>(site)] += waited;
    ++site_waits_[static_cast<int>(site)];
  }
  // The communicator's message already names this rank and the peers.
  if (!status.ok()) return Poison(status);
  return absl::OkStatus();
}

UnitView EngineImpl::MakeView(void* base, DType dtype, int unit) const {
  UnitView view;
  const UnitSegment& seg = layout_.unit(unit);
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  for (size_t p = 0; p < seg.params.size(); ++p) {
    view.params.push_back({static_cast<char*>(base) + seg.params[p].offset * elem, dtype,
                           seg.params[p].numel, &model_.units[unit].params[p].shape});
  }
  return view;
}

absl::Status EngineImpl::SetParam(int unit, int param, absl::Span<const float> values) {
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "SetParam"));
  const UnitSegment& seg = layout_.unit(unit);
  if (param < 0 || param >= static_cast<int>(seg.params.size())) {
    return absl::OutOfRangeError(absl::StrFormat("SetParam: unit '%s' has params 0..%d, not %d",
                                                 model_.units[unit].name, seg.params.size() - 1,
                                                 param));
  }
  if (started_) {
    return absl::FailedPreconditionError("SetParam after Start(): initial weights are fixed");
  }
  const ParamSlot& slot = seg.params[param];
  const std::string& name = model_.units[unit].params[param].name;
  if (static_cast<int64_t>(values.size()) != slot.numel) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SetParam(%s.%s): got %d values, the param has %d elements",
                        model_.units[unit].name, name, values.size(), slot.numel));
  }
  // A NaN or inf weight would poison every step (and, through the norm, every
  // rank) long after the trainer that wrote it returned: refuse it here.
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SetParam(%s.%s): element %d is %g; initial weights must be finite (check the "
          "initialiser or the checkpoint they came from)",
          model_.units[unit].name, name, i, values[i]));
    }
  }
  // The params keep the part of the tensor this rank holds, rounded to the
  // param dtype; the master keeps the exact fp32 values of the part it owns.
  const ElementRange held = plan_.unit_resident[unit] ? ElementRange{0, seg.padded_numel}
                                                      : layout_.ShardRange(unit, rank_);
  const int64_t begin = std::max(held.begin, slot.offset);
  const int64_t end = std::min(held.end, slot.offset + slot.numel);
  std::vector<uint16_t> staging;
  if (begin < end) {
    ZS_RETURN_IF_ERROR(StoreConverted(values.data() + (begin - slot.offset), end - begin,
                                      param_dtype_, ParamsAt(unit, begin), staging));
  }
  if (mixed_) {
    const ElementRange owned = OwnedRange(unit);
    const int64_t mb = std::max(owned.begin, slot.offset);
    const int64_t me = std::min(owned.end, slot.offset + slot.numel);
    if (mb < me) {
      ZS_RETURN_IF_ERROR(CopyOnCompute(OptimizerAt(master_, unit, mb),
                                       values.data() + (mb - slot.offset),
                                       (me - mb) * static_cast<int64_t>(sizeof(float))));
    }
  }
  ZS_RETURN_IF_ERROR(SyncCompute());
  param_hashes_[unit][param] = HashBytes(values.data(), values.size() * sizeof(float), 0) | 1;
  return absl::OkStatus();
}

absl::StatusOr<UnitView> EngineImpl::Gather(int unit) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckStarted("Gather"));
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "Gather"));
  if (!plan_.unit_resident[unit]) return GatherSharded(unit);
  // Stages 1-3: the updated params of the last step arrive asynchronously;
  // waiting here (not in Step) lets them overlap the forward of earlier units.
  ZS_RETURN_IF_ERROR(WaitComm(param_gathers_[unit], WaitSite::kParamGather));
  gathered_[unit] = 1;
  return MakeView(ParamsAt(unit, 0), param_dtype_, unit);
}

std::string EngineImpl::DescribeGathered() const {
  // At most a few names: a message stays one short line.
  constexpr int kMaxNames = 3;
  std::vector<std::string> names;
  int count = 0;
  for (size_t u = 0; u < gathered_.size(); ++u) {
    if (!gathered_[u]) continue;
    if (++count <= kMaxNames) names.push_back("'" + model_.units[u].name + "'");
  }
  if (count == 0) return "no unit is gathered";
  std::string text = absl::StrJoin(names, ", ");
  if (count > kMaxNames) absl::StrAppend(&text, " and ", count - kMaxNames, " more");
  return absl::StrCat(text, count == 1 ? " is" : " are", " gathered");
}

absl::Status EngineImpl::Release(int unit) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckStarted("Release"));
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "Release"));
  // A Release without its Gather (or a second one) is a trainer bug at every
  // stage, with the same words at every stage, though only stage 3 has a
  // buffer to give back.
  if (!gathered_[unit]) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Release(%s): the unit is not gathered (%s); every Release follows a Gather of the same "
        "unit, once",
        model_.units[unit].name, DescribeGathered()));
  }
  gathered_[unit] = 0;
  if (plan_.unit_resident[unit]) return absl::OkStatus();
  // The slot keeps the unit's data until it is needed for another unit, so
  // a Gather of the same unit right after (forward to backward) is free.
  gather_slots_[unit_gather_slot_[unit]].held = false;
  held_unit_ = -1;
  return absl::OkStatus();
}

absl::StatusOr<int> EngineImpl::AcquireStagingSlot() {
  if (free_slots_.empty()) ZS_RETURN_IF_ERROR(RetireOldestSlot(WaitSite::kGradViewSlot));
  const int slot = free_slots_.front();
  free_slots_.pop_front();
  return slot;
}

absl::Status EngineImpl::RetireOldestSlot(WaitSite site) {
  if (busy_slots_.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GradView: all %d gradient staging buffers are held by open GradViews; reduce a unit "
        "before opening more, or raise TrainSpec::num_grad_buffers",
        slots_.size()));
  }
  const int s = busy_slots_.front();
  busy_slots_.pop_front();
  StagingSlot& slot = slots_[s];
  ZS_RETURN_IF_ERROR(WaitComm(slot.reduction, site));
  if (slot.micro > 0) {
    // Stage 2, later micro-batch: the reduce-scatter left this rank's summed
    // block in place in the slot; add it to the gradient shard. Slots retire
    // in issue order, so micro-batches accumulate in order.
    const UnitSegment& seg = layout_.unit(slot.unit);
    const ElementRange shard = layout_.ShardRange(slot.unit, rank_);
    const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
    ZS_RETURN_IF_ERROR(AccumulateInto(GradsAt(slot.unit, shard.begin),
                                      static_cast<char*>(StagingSlotData(s)) + shard.begin * elem,
                                      seg.shard_numel));
  }
  // Slots retire in issue order: the unit's last micro-batch completes its
  // gradient shard.
  if (slot.micro == train_.grad_accum_steps - 1) ZS_RETURN_IF_ERROR(EnqueueUnitNorm(slot.unit));
  slot.unit = -1;
  free_slots_.push_back(s);
  return absl::OkStatus();
}

absl::StatusOr<UnitView> EngineImpl::GradView(int unit) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckStarted("GradView"));
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "GradView"));
  const std::string& name = model_.units[unit].name;
  if (open_grad_slot_[unit] != kNoGradView) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GradView(%s) called twice without ReduceGrads in between", name));
  }
  if (reduced_count_[unit] >= train_.grad_accum_steps) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GradView(%s): the unit already has %d micro-batch gradients this step "
                        "(grad_accum_steps); call Step() first",
                        name, reduced_count_[unit]));
  }
  if (!plan_.stage.grads_sharded && reduced_count_[unit] == 0) {
    // Stages 0-1: the first micro-batch writes straight into the full
    // gradient buffer, whose padding is zero and never written.
    open_grad_slot_[unit] = kDirectGradView;
    return MakeView(GradsAt(unit, 0), grad_dtype_, unit);
  }
  ZS_ASSIGN_OR_RETURN(int slot, AcquireStagingSlot());
  // The slot held another unit: zero this unit's padding so that it reduces
  // (and stays) zero. The trainer overwrites every param element.
  char* data = static_cast<char*>(StagingSlotData(slot));
  const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
  for (const ElementRange& pad : layout_.PaddingRanges(unit)) {
    ZS_RETURN_IF_ERROR(device_.ZeroAsync(data + pad.begin * elem, pad.size() * elem, *compute_));
  }
  // The trainer writes the view from the host: the zeroing, and the
  // accumulation that last read the slot, must be done.
  ZS_RETURN_IF_ERROR(SyncCompute());
  open_grad_slot_[unit] = slot;
  return MakeView(data, grad_dtype_, unit);
}

absl::Status EngineImpl::ReduceGrads(int unit) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckStarted("ReduceGrads"));
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "ReduceGrads"));
  const int open = open_grad_slot_[unit];
  if (open == kNoGradView) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ReduceGrads(%s) without a GradView: get the view, write the gradient, then reduce",
        model_.units[unit].name));
  }
  open_grad_slot_[unit] = kNoGradView;
  const int micro = reduced_count_[unit]++;
  const bool last_micro = micro == train_.grad_accum_steps - 1;
  const UnitSegment& seg = layout_.unit(unit);
  const ElementRange shard = layout_.ShardRange(unit, rank_);

  if (!plan_.stage.grads_sharded) {
    if (open >= 0) {
      ZS_RETURN_IF_ERROR(AccumulateInto(GradsAt(unit, 0), StagingSlotData(open), seg.padded_numel));
      free_slots_.push_back(open);
    }
    if (last_micro) {
      // Stages 0-1 reduce once per step, when the unit's gradient is summed
      // over this rank's micro-batches; asynchronously, so the reduction
      // overlaps the backward of the units before it. The communicator reads
      // the buffer the accumulation above writes: it waits for that work
      // itself (an event on the compute stream), not this thread.
      void* grads = GradsAt(unit, 0);
      if (NoOpCollective(grads, GradsAt(unit, shard.begin))) {
        // One rank: the gradient is final once accumulated (same stream).
        return EnqueueUnitNorm(unit);
      }
      std::shared_ptr<Event> ready;
      if (open >= 0) {
        ZS_ASSIGN_OR_RETURN(ready, RecordCompute());
      }
      if (!plan_.stage.optimizer_sharded) {
        unit_reductions_[unit] =
            comm_.AllReduceAfter(ready, grads, grads, seg.padded_numel, grad_dtype_, UnitTag(unit));
        NoteCollective(CollectiveKind::kAllReduceGrads, unit, seg.padded_numel);
      } else {
        unit_reductions_[unit] = comm_.ReduceScatterAfter(
            ready, grads, GradsAt(unit, shard.begin), seg.shard_numel, grad_dtype_, UnitTag(unit));
        NoteCollective(CollectiveKind::kReduceScatterGrads, unit, seg.shard_numel);
      }
      reduction_order_.push_back(unit);
    }
    return RetireCompletedReductions();
  }

  // Stage 2: reduce-scatter every micro-batch. The first writes straight into
  // the gradient shard; later ones reduce in place in the slot and are added
  // when the slot retires.
  StagingSlot& slot = slots_[open];
  slot.unit = unit;
  slot.micro = micro;
  void* data = StagingSlotData(open);
  const int64_t elem = static_cast<int64_t>(DTypeSize(grad_dtype_));
  void* recv =
      micro == 0 ? GradsAt(unit, shard.begin) : static_cast<char*>(data) + shard.begin * elem;
  slot.reduction = comm_.ReduceScatter(data, recv, seg.shard_numel, grad_dtype_, UnitTag(unit));
  NoteCollective(CollectiveKind::kReduceScatterGrads, unit, seg.shard_numel);
  busy_slots_.push_back(open);
  return RetireCompletedReductions();
}

absl::StatusOr<std::vector<float>> EngineImpl::GetParam(int unit, int param) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "GetParam"));
  const UnitSegment& seg = layout_.unit(unit);
  if (param < 0 || param >= static_cast<int>(seg.params.size())) {
    return absl::OutOfRangeError(absl::StrFormat("GetParam: unit '%s' has params 0..%d, not %d",
                                                 model_.units[unit].name, seg.params.size() - 1,
                                                 param));
  }
  ZS_RETURN_IF_ERROR(WaitParamGathers(WaitSite::kGetParam));
  const ParamSlot& slot = seg.params[param];
  std::vector<float> out(slot.numel);
  // The fp32 values live in the master (mixed precision) or the params (fp32).
  const bool full_here = mixed_ ? !plan_.stage.optimizer_sharded : plan_.unit_resident[unit];
  if (full_here) {
    const void* src = mixed_ ? static_cast<const void*>(OptimizerAt(master_, unit, slot.offset))
                             : ParamsAt(unit, slot.offset);
    ZS_RETURN_IF_ERROR(
        CopyOnCompute(out.data(), src, slot.numel * static_cast<int64_t>(sizeof(float))));
    ZS_RETURN_IF_ERROR(SyncCompute());
    return out;
  }
  // Sharded: gather the unit into a temporary (a diagnostic path, not a
  // training one): host memory outside the ledger on a host device; device
  // memory, ledgered as workspace while it lives, elsewhere.
  std::vector<float> segment;
  DeviceBuffer device_segment;
  float* gathered_into = nullptr;
  if (device_.host_accessible()) {
    segment.resize(static_cast<size_t>(seg.padded_numel));
    gathered_into = segment.data();
  } else {
    ZS_ASSIGN_OR_RETURN(device_segment,
                        device_.Allocate(seg.padded_numel * static_cast<int64_t>(sizeof(float)),
                                         MemoryCategory::kWorkspace, "get_param_gather"));
    gathered_into = device_segment.as<float>();
  }
  const ElementRange shard = layout_.ShardRange(unit, rank_);
  const void* mine = mixed_ ? static_cast<const void*>(OptimizerAt(master_, unit, shard.begin))
                            : ParamsAt(unit, shard.begin);
  CommHandle handle =
      comm_.AllGather(mine, gathered_into, seg.shard_numel, DType::kFloat32, UnitTag(unit));
  NoteCollective(CollectiveKind::kGatherForRead, unit, seg.shard_numel);
  const absl::Status gathered = WaitComm(handle, WaitSite::kGetParam);
  if (!gathered.ok()) {
    return absl::Status(
        gathered.code(),
        absl::StrFormat("GetParam(%s.%s) (collective tag %d): %s; every rank must call GetParam "
                        "for the same unit at the same time",
                        model_.units[unit].name, model_.units[unit].params[param].name,
                        UnitTag(unit), gathered.message()));
  }
  ZS_RETURN_IF_ERROR(CopyOnCompute(out.data(), gathered_into + slot.offset,
                                   slot.numel * static_cast<int64_t>(sizeof(float))));
  ZS_RETURN_IF_ERROR(SyncCompute());
  return out;
}

}  // namespace internal
}  // namespace zeroshard

namespace zeroshard::internal {

absl::Status EngineImpl::CheckPaddingIsZero() const {
  // Reads the device's bytes through a host copy (any device).
  std::vector<unsigned char> host;
  auto all_zero = [&](const void* p, int64_t bytes) {
    host.assign(static_cast<size_t>(bytes), 0xff);
    if (!CopyOnCompute(host.data(), p, bytes).ok() || !compute_->Synchronize().ok()) return false;
    for (unsigned char b : host) {
      if (b != 0) return false;
    }
    return true;
  };
  const int64_t psize = static_cast<int64_t>(DTypeSize(param_dtype_));
  const int64_t gsize = static_cast<int64_t>(DTypeSize(grad_dtype_));
  for (int u = 0; u < layout_.num_units(); ++u) {
    const ElementRange owned = OwnedRange(u);
    const ElementRange shard = layout_.ShardRange(u, rank_);
    const ElementRange grads_held =
        plan_.stage.grads_sharded ? shard : ElementRange{0, layout_.unit(u).padded_numel};
    for (const ElementRange& pad : layout_.PaddingRanges(u)) {
      auto fail = [&](const char* buffer) {
        return absl::InternalError(
            absl::StrFormat("rank %d: padding [%d, %d) of unit '%s' in buffer '%s' is not zero",
                            rank_, pad.begin, pad.end, model_.units[u].name, buffer));
      };
      const ElementRange params_held =
          plan_.unit_resident[u] ? ElementRange{0, layout_.unit(u).padded_numel} : shard;
      const int64_t pb = std::max(pad.begin, params_held.begin);
      const int64_t pe = std::min(pad.end, params_held.end);
      if (pb < pe && !all_zero(ParamsAt(u, pb), (pe - pb) * psize)) return fail(kParamsBuffer);
      const int64_t gb = std::max(pad.begin, grads_held.begin);
      const int64_t ge = std::min(pad.end, grads_held.end);
      if (gb < ge && !all_zero(GradsAt(u, gb), (ge - gb) * gsize)) return fail(kGradsBuffer);
      const int64_t ob = std::max(pad.begin, owned.begin);
      const int64_t oe = std::min(pad.end, owned.end);
      if (ob >= oe) continue;
      const int64_t bytes = (oe - ob) * static_cast<int64_t>(sizeof(float));
      if (!all_zero(OptimizerAt(adam_m_, u, ob), bytes)) return fail(kAdamMBuffer);
      if (!all_zero(OptimizerAt(adam_v_, u, ob), bytes)) return fail(kAdamVBuffer);
      if (mixed_ && !all_zero(OptimizerAt(master_, u, ob), bytes)) return fail(kMasterBuffer);
    }
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
