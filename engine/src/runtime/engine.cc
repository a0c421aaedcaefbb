// Engine creation, start-up checks, param and gradient views.
#include <algorithm>
#include <cmath>
#include <cstdio>
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
  ZS_RETURN_IF_ERROR(internal::CheckQuantizedGradsBackend(train, device, comm));
  ZS_ASSIGN_OR_RETURN(internal::FlatLayout layout,
                      internal::FlatLayout::Create(model, comm.size()));
  if (layout.train_total_numel() == 0) {
    return absl::InvalidArgumentError(
        "Engine::Create: every param of the model is frozen (ParamSpec::trainable false): there "
        "is nothing to train; mark the params to train trainable");
  }
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
      mixed_(train.precision != Precision::kFp32),
      buffers_(layout_, plan_, rank_, param_dtype_, grad_dtype_),
      log_(train.check_collective_sequence),
      loss_scaler_(train.precision, train.loss_scale),
      optimizer_(train, BuildUpdateRuns(layout_, model_,
                                        [this](int u) { return buffers_.OwnedRange(u); })),
      norm_(layout_, rank_, grad_dtype_, device.host_accessible(), buffers_, *this) {
  const int units = layout_.num_spec_units();
  param_hashes_.resize(units);
  for (int u = 0; u < units; ++u) param_hashes_[u].assign(model_.units[u].params.size(), 0);
  for (int s = 0; s < layout_.num_units(); ++s) {
    frozen_now_.emplace_back(layout_.unit(s).params.size(), 0);
  }
  RuntimeServices& services = *this;
  checkpoint_ =
      std::make_unique<CheckpointWriter>(layout_, rank_, mixed_, param_dtype_, buffers_, services);
  gatherer_ = std::make_unique<ParamGatherer>(model_, layout_, plan_, rank_, param_dtype_, buffers_,
                                              services);
  reducer_ = std::make_unique<GradReducer>(model_, layout_, plan_, rank_, grad_dtype_,
                                           train_.grad_accum_steps, buffers_, services);
  // A unit's norm block sums are queued as soon as its gradient is final.
  reducer_->set_final_grad_hook([this](int u) -> absl::Status {
    ZS_RETURN_IF_ERROR(norm_.OnGradFinal(u));
    if (offload_ == nullptr || train_.offload.grads != MemoryTier::kHost) {
      return absl::OkStatus();
    }
    // The gradient's host copy, during the backward, after the compute
    // stream's work on it (a stage-2 accumulation, the norm's block sums).
    ZS_ASSIGN_OR_RETURN(std::shared_ptr<Event> done, RecordCompute());
    return offload_->OnGradFinal(u, done);
  });
}

EngineImpl::~EngineImpl() {
  if (started_ && std::getenv(kDebugCommWaitsEnvVar) != nullptr) {
    std::string waits = log_.FormatWaits(rank_, steps_since_start_);
    if (const int64_t gathers = gatherer_->segment_gathers(); gathers > 0) {
      // Stage 3: how many gathers found their all-gather issued ahead
      // (prefetched, or kept from an earlier Gather), and how many waited.
      absl::StrAppendFormat(
          &waits, "  stage-3 gathers: %d, issued ahead %d (%.1f%%), waited for %d (%.1f%%)\n",
          gathers, gatherer_->gathers_ahead(), 100.0 * gatherer_->gathers_ahead() / gathers,
          gatherer_->gathers_waited(), 100.0 * gatherer_->gathers_waited() / gathers);
    }
    std::fputs(waits.c_str(), stderr);
  }
  // A background checkpoint write owns its snapshot; let it finish (the
  // checkpoint stays incomplete without WaitForCheckpoint's commit). Then,
  // as peers may still be reading our buffers, finish every collective.
  checkpoint_.reset();
  reducer_.reset();
  gatherer_.reset();
}

absl::Status EngineImpl::Allocate() {
  // Exactly the plan's buffers, nothing else; the host tier's on a host
  // device beside ours (pinned beside a GPU).
  if (train_.offload.enabled()) {
    ZS_ASSIGN_OR_RETURN(host_tier_, CreateHostTierDevice(device_));
  }
  ZS_RETURN_IF_ERROR(buffers_.Allocate(device_, host_tier_.get()));
  ZS_ASSIGN_OR_RETURN(compute_, device_.CreateStream());
  ZS_ASSIGN_OR_RETURN(ops_, CreateDeviceOps(device_, *compute_));
  return AllocateOffload();
}

absl::Status EngineImpl::ZeroOnCompute(void* dst, int64_t bytes) {
  return device_.ZeroAsync(dst, bytes, *compute_);
}

EngineStats EngineImpl::Stats() const {
  EngineStats stats = stats_;
  stats.loss_scale = loss_scaler_.scale();
  stats.prefetch_active = gatherer_->prefetch_active();
  stats.collectives = log_.total();
  if (offload_ != nullptr) stats.offload = offload_->Describe();
  stats.secondary_gathers = gatherer_->secondary_gathers();
  return stats;
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
  parallel_ = parallel;
  norm_.SetModelParallel(model_, parallel);
}

absl::Status EngineImpl::CheckUnit(int unit, const char* call) const {
  if (unit < 0 || unit >= layout_.num_spec_units()) {
    return absl::OutOfRangeError(absl::StrFormat("%s(%d): the model has units 0..%d", call, unit,
                                                 layout_.num_spec_units() - 1));
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

absl::Status EngineImpl::CheckTraining(const char* call) const {
  ZS_RETURN_IF_ERROR(CheckStarted(call));
  if (eval_mode_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s in eval mode: an evaluation pass gathers and releases only; call SetEvalMode(false) "
        "first",
        call));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::SetEvalMode(bool eval) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckStarted("SetEvalMode"));
  if (eval == eval_mode_) {
    return absl::FailedPreconditionError(
        eval ? "SetEvalMode(true): already in eval mode; end the pass with SetEvalMode(false)"
             : "SetEvalMode(false): not in eval mode");
  }
  if (const int held = gatherer_->held_unit(); held >= 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("SetEvalMode(%s) while unit '%s' is gathered; Release it first",
                        eval ? "true" : "false", model_.units[held].name));
  }
  eval_mode_ = eval;
  return gatherer_->SetEval(eval);
}

absl::Status EngineImpl::Poison(absl::Status status) {
  if (poisoned_.ok() && !status.ok()) poisoned_ = status;
  return status;
}

absl::Status EngineImpl::WaitComm(CommHandle& handle, WaitSite site) {
  // The communicator's message already names this rank and the peers.
  return Poison(log_.Wait(handle, site, timeline_));
}

UnitView EngineImpl::MakeView(const std::vector<void*>& bases, DType dtype, int unit) const {
  // bases[i] is segment SegmentsOf(unit)[i]'s memory, or null (no gradient).
  UnitView view;
  const std::vector<int>& segments = layout_.SegmentsOf(unit);
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  const std::vector<ParamSpec>& params = model_.units[unit].params;
  for (size_t p = 0; p < params.size(); ++p) {
    const ParamPlace place = layout_.PlaceOf(unit, static_cast<int>(p));
    const size_t at = static_cast<size_t>(
        std::find(segments.begin(), segments.end(), place.segment) - segments.begin());
    const ParamSlot& slot = layout_.unit(place.segment).params[place.slot];
    char* base = static_cast<char*>(bases[at]);
    if (base == nullptr) {
      view.params.push_back({nullptr, dtype, 0, &params[p].shape});
    } else {
      view.params.push_back({base + slot.offset * elem, dtype, slot.numel, &params[p].shape});
    }
  }
  return view;
}

absl::Status EngineImpl::CheckParamValues(const char* call, int unit, int param,
                                          absl::Span<const float> values) const {
  ZS_RETURN_IF_ERROR(CheckUnit(unit, call));
  const UnitSpec& spec = model_.units[unit];
  if (param < 0 || param >= static_cast<int>(spec.params.size())) {
    return absl::OutOfRangeError(absl::StrFormat("%s: unit '%s' has params 0..%d, not %d", call,
                                                 spec.name, spec.params.size() - 1, param));
  }
  const std::string& name = spec.params[param].name;
  if (const auto& tie = spec.params[param].tied_to; tie.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s(%s.%s): the param is tied to %s.%s (ParamSpec::tied_to) and stored there; set "
        "%s.%s instead",
        call, spec.name, name, tie->unit, tie->param, tie->unit, tie->param));
  }
  const ParamPlace place = layout_.PlaceOf(unit, param);
  const int64_t numel = layout_.unit(place.segment).params[place.slot].numel;
  if (static_cast<int64_t>(values.size()) != numel) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s(%s.%s): got %d values, the param has %d "
                        "elements",
                        call, spec.name, name, values.size(), numel));
  }
  // A NaN or inf weight would poison every step (and, through the norm, every
  // rank) long after the trainer that wrote it returned: refuse it here.
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s(%s.%s): element %d is %g; weights must be finite (check the initialiser, the "
          "checkpoint or the replica's source they came from)",
          call, spec.name, name, i, values[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::SetParam(int unit, int param, absl::Span<const float> values) {
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "SetParam"));
  if (started_) {
    return absl::FailedPreconditionError("SetParam after Start(): initial weights are fixed");
  }
  ZS_RETURN_IF_ERROR(CheckParamValues("SetParam", unit, param, values));
  const ParamPlace place = layout_.PlaceOf(unit, param);
  const int s = place.segment;
  const ParamSlot& slot = layout_.unit(s).params[place.slot];
  // The params keep the part of the tensor this rank holds, rounded to the
  // param dtype; the master keeps the exact fp32 values of the part it owns
  // (a frozen param has no master: its params are all it has).
  const ElementRange held = buffers_.ParamsHeld(s);
  const int64_t begin = std::max(held.begin, slot.offset);
  const int64_t end = std::min(held.end, slot.offset + slot.numel);
  std::vector<uint16_t> staging;
  if (begin < end) {
    ZS_RETURN_IF_ERROR(
        StoreParams(s, begin, end - begin, values.data() + (begin - slot.offset), staging));
  }
  if (mixed_ && layout_.unit(s).trainable) {
    const ElementRange owned = OwnedRange(s);
    const int64_t mb = std::max(owned.begin, slot.offset);
    const int64_t me = std::min(owned.end, slot.offset + slot.numel);
    if (mb < me) {
      ZS_RETURN_IF_ERROR(
          WriteState(StateTensor::kMaster, s, mb, me - mb, values.data() + (mb - slot.offset)));
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
  ZS_ASSIGN_OR_RETURN(std::vector<void*> bases,
                      gatherer_->Gather(unit, step_ + 1, steps_since_start_ == 0));
  return MakeView(bases, param_dtype_, unit);
}

absl::Status EngineImpl::Release(int unit) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckStarted("Release"));
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "Release"));
  return gatherer_->Release(unit);
}

absl::StatusOr<UnitView> EngineImpl::GradView(int unit) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckTraining("GradView"));
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "GradView"));
  ZS_ASSIGN_OR_RETURN(std::vector<void*> bases, reducer_->OpenView(unit));
  UnitView view = MakeView(bases, grad_dtype_, unit);
  // Params frozen by SetTrainable: a zero gradient the trainer does not see.
  bool zeroed = false;
  for (size_t p = 0; p < view.params.size(); ++p) {
    const ParamPlace place = layout_.PlaceOf(unit, static_cast<int>(p));
    if (!frozen_now_[place.segment][place.slot] || view.params[p].data == nullptr) continue;
    ZS_RETURN_IF_ERROR(ZeroOnCompute(
        view.params[p].data, view.params[p].numel * static_cast<int64_t>(DTypeSize(grad_dtype_))));
    view.params[p] = {nullptr, grad_dtype_, 0, view.params[p].shape};
    zeroed = true;
  }
  if (zeroed) ZS_RETURN_IF_ERROR(SyncCompute());
  return view;
}

absl::Status EngineImpl::ReduceGrads(int unit) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckTraining("ReduceGrads"));
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "ReduceGrads"));
  if (!reducer_->HasGrads(unit)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ReduceGrads(%s): every param of the unit is frozen (ParamSpec::trainable false), so it "
        "has no gradient; skip its GradView and ReduceGrads",
        model_.units[unit].name));
  }
  return reducer_->Reduce(unit);
}

absl::StatusOr<std::vector<float>> EngineImpl::GetParam(int unit, int param) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(CheckUnit(unit, "GetParam"));
  const UnitSpec& spec = model_.units[unit];
  if (param < 0 || param >= static_cast<int>(spec.params.size())) {
    return absl::OutOfRangeError(absl::StrFormat("GetParam: unit '%s' has params 0..%d, not %d",
                                                 spec.name, spec.params.size() - 1, param));
  }
  ZS_RETURN_IF_ERROR(gatherer_->WaitUpdatedParamGathers(WaitSite::kGetParam));
  // An alias reads its owner's storage.
  const ParamPlace place = layout_.PlaceOf(unit, param);
  const int s = place.segment;
  const UnitSegment& seg = layout_.unit(s);
  const ParamSlot& slot = seg.params[place.slot];
  // The fp32 values live in the master (mixed precision, trainable) or the
  // params (fp32; a frozen param in the param dtype, its only copy).
  const bool from_master = mixed_ && seg.trainable;
  const DType dtype = from_master ? DType::kFloat32 : param_dtype_;
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  const bool full_here = from_master ? !plan_.stage.optimizer_sharded : plan_.unit_resident[s];
  std::vector<float> out(slot.numel);
  std::vector<uint16_t> halves(dtype == DType::kFloat32 ? 0 : slot.numel);
  void* host = dtype == DType::kFloat32 ? static_cast<void*>(out.data()) : halves.data();
  auto to_fp32 = [&]() {
    if (dtype == DType::kBFloat16) ConvertBf16ToFp32(halves.data(), out.data(), halves.size());
    if (dtype == DType::kFloat16) ConvertFp16ToFp32(halves.data(), out.data(), halves.size());
  };
  if (full_here) {
    if (from_master) {
      ZS_RETURN_IF_ERROR(ReadState(StateTensor::kMaster, s, slot.offset, slot.numel, out.data()));
    } else {
      ZS_RETURN_IF_ERROR(CopyOnCompute(host, ParamsAt(s, slot.offset), slot.numel * elem));
    }
    ZS_RETURN_IF_ERROR(SyncCompute());
    to_fp32();
    return out;
  }
  // Sharded: gather the segment into a temporary (a diagnostic path, not a
  // training one): host memory outside the ledger on a host device; device
  // memory, ledgered as workspace while it lives, elsewhere.
  std::vector<char> segment;
  DeviceBuffer device_segment;
  char* gathered_into = nullptr;
  if (device_.host_accessible()) {
    segment.resize(static_cast<size_t>(seg.padded_numel * elem));
    gathered_into = segment.data();
  } else {
    ZS_ASSIGN_OR_RETURN(
        device_segment,
        device_.Allocate(seg.padded_numel * elem, MemoryCategory::kWorkspace, "get_param_gather"));
    gathered_into = device_segment.as<char>();
  }
  const ElementRange shard = layout_.ShardRange(s, rank_);
  const void* mine = from_master ? static_cast<const void*>(buffers_.MasterAt(s, shard.begin))
                                 : ParamsAt(s, shard.begin);
  // An offloaded master: this rank's shard from its tier, into the memory
  // the communicator moves (host memory, or a device temporary).
  // A shard of params on the host tier likewise.
  std::vector<float> offloaded;
  DeviceBuffer device_shard;
  const bool params_off_device = !from_master && buffers_.ParamsOffDevice(s);
  if ((from_master && offload_ != nullptr) || params_off_device) {
    if (from_master) {
      offloaded.resize(static_cast<size_t>(seg.shard_numel));
      ZS_RETURN_IF_ERROR(
          ReadState(StateTensor::kMaster, s, shard.begin, seg.shard_numel, offloaded.data()));
      mine = offloaded.data();
    } else if (buffers_.ParamsOnNvme(s)) {
      // fp32: the params (the master) in their swap file.
      offloaded.resize(static_cast<size_t>(seg.shard_numel));
      ZS_RETURN_IF_ERROR(offload_->Read(StateTensor::kParams,
                                        buffers_.OptimizerIndex(s, shard.begin), seg.shard_numel,
                                        offloaded.data()));
      mine = offloaded.data();
    }
    if (!device_.host_accessible()) {
      ZS_ASSIGN_OR_RETURN(
          device_shard,
          device_.Allocate(seg.shard_numel * elem, MemoryCategory::kWorkspace, "get_param_shard"));
      ZS_RETURN_IF_ERROR(CopyOnCompute(device_shard.data(), mine, seg.shard_numel * elem));
      ZS_RETURN_IF_ERROR(SyncCompute());
      mine = device_shard.data();
    }
  }
  CommHandle handle =
      comm_.AllGather(mine, gathered_into, seg.shard_numel, dtype, CollectiveLog::UnitTag(s));
  log_.Note(CollectiveKind::kGatherForRead, s, seg.shard_numel);
  const absl::Status gathered = WaitComm(handle, WaitSite::kGetParam);
  if (!gathered.ok()) {
    return absl::Status(
        gathered.code(),
        absl::StrFormat("GetParam(%s.%s) (collective tag %d): %s; every rank must call GetParam "
                        "for the same unit at the same time",
                        spec.name, spec.params[param].name, CollectiveLog::UnitTag(s),
                        gathered.message()));
  }
  ZS_RETURN_IF_ERROR(CopyOnCompute(host, gathered_into + slot.offset * elem, slot.numel * elem));
  ZS_RETURN_IF_ERROR(SyncCompute());
  to_fp32();
  return out;
}

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
        return absl::InternalError(absl::StrFormat(
            "rank %d: padding [%d, %d) of unit '%s' in buffer '%s' is not zero", rank_, pad.begin,
            pad.end, model_.units[layout_.unit(u).spec_unit].name, buffer));
      };
      const ElementRange params_held = buffers_.ParamsHeld(u);
      const int64_t pb = std::max(pad.begin, params_held.begin);
      const int64_t pe = std::min(pad.end, params_held.end);
      if (pb < pe && buffers_.ParamsOnNvme(u)) {
        std::vector<unsigned char> bytes(static_cast<size_t>((pe - pb) * psize), 0xff);
        const absl::Status read = offload_->Read(
            StateTensor::kParams, buffers_.OptimizerIndex(u, pb), pe - pb, bytes.data());
        for (unsigned char b : bytes) {
          if (!read.ok() || b != 0) return fail(kParamsBuffer);
        }
      } else if (pb < pe && !all_zero(ParamsAt(u, pb), (pe - pb) * psize)) {
        return fail(kParamsBuffer);
      }
      if (!layout_.unit(u).trainable) continue;  // params only
      const int64_t gb = std::max(pad.begin, grads_held.begin);
      const int64_t ge = std::min(pad.end, grads_held.end);
      if (gb < ge && !all_zero(buffers_.GradsAt(u, gb), (ge - gb) * gsize))
        return fail(kGradsBuffer);
      const int64_t ob = std::max(pad.begin, owned.begin);
      const int64_t oe = std::min(pad.end, owned.end);
      if (ob >= oe) continue;
      const int64_t bytes = (oe - ob) * static_cast<int64_t>(sizeof(float));
      if (offload_ != nullptr) {
        // The state's tier, read through it.
        std::vector<float> values(static_cast<size_t>(oe - ob));
        auto zero_on_tier = [&](StateTensor t) {
          if (!ReadState(t, u, ob, oe - ob, values.data()).ok()) return false;
          for (float v : values) {
            if (v != 0.0f || std::signbit(v)) return false;
          }
          return true;
        };
        if (!zero_on_tier(StateTensor::kAdamM)) return fail(kAdamMBuffer);
        if (!zero_on_tier(StateTensor::kAdamV)) return fail(kAdamVBuffer);
        if (mixed_ && !zero_on_tier(StateTensor::kMaster)) return fail(kMasterBuffer);
        continue;
      }
      if (!all_zero(buffers_.AdamMAt(u, ob), bytes)) return fail(kAdamMBuffer);
      if (!all_zero(buffers_.AdamVAt(u, ob), bytes)) return fail(kAdamVBuffer);
      if (mixed_ && !all_zero(buffers_.MasterAt(u, ob), bytes)) return fail(kMasterBuffer);
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zeroshard
