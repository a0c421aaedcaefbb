// EngineImpl: the ZeRO stage 0-3 runtime behind zeroshard::Engine.
//
// EngineImpl orchestrates the owners of the engine's state; each has its
// own files in this folder (docs/architecture.md, "The runtime's owners"):
//   ShardBuffers      the plan's buffers and where each unit's elements live
//   GradReducer       staging slots, the queue of gradient reductions, the
//                     final-gradient hook (the norm's block sums)
//   GradNorm          this rank's exact sum of squares, model-parallel runs
//   ParamGatherer     Gather/Release, the updated params' all-gathers, the
//                     stage-3 gather pool and prefetch
//   ShardOptimizer    the update of the owned range (Adam, decay runs)
//   LossScaler        the fp16 dynamic loss scale (a value)
//   CollectiveLog     the collective count, sequence hash and wait sites
//   CheckpointWriter  snapshot, writer thread, commit, `latest`, retention
// EngineImpl itself keeps the public calls' checks, the start-up agreement
// (engine_start.cc), Step's phases and the norm's exchange (engine_step.cc),
// Load (engine_checkpoint.cc), the compute stream and the record exchanges.
#ifndef ZEROSHARD_RUNTIME_ENGINE_IMPL_H_
#define ZEROSHARD_RUNTIME_ENGINE_IMPL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "engine/src/device/device_ops.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/runtime/checkpoint_writer.h"
#include "engine/src/runtime/collective_log.h"
#include "engine/src/runtime/grad_norm.h"
#include "engine/src/runtime/grad_reducer.h"
#include "engine/src/runtime/loss_scaler.h"
#include "engine/src/runtime/offload_optimizer.h"
#include "engine/src/runtime/param_gatherer.h"
#include "engine/src/runtime/runtime_services.h"
#include "engine/src/runtime/shard_buffers.h"
#include "engine/src/runtime/shard_optimizer.h"
#include "engine/src/runtime/slice_checkpoint.h"
#include "engine/src/runtime/step_timeline.h"
#include "zeroshard/engine.h"

namespace zeroshard::internal {

// qgZ (TrainSpec::zeropp.quantized_grad_bits) quantizes and sums on the
// host: Unimplemented for a device whose gradients are not in host memory
// (engine_zeropp.cc).
absl::Status CheckQuantizedGradsBackend(const TrainSpec& train, const Device& device,
                                        const Communicator& comm);

class EngineImpl final : public Engine, private RuntimeServices {
 public:
  EngineImpl(const ModelSpec& model, const TrainSpec& train, Device& device, Communicator& comm,
             FlatLayout layout, BufferPlan plan);
  ~EngineImpl() override;

  absl::Status Allocate();
  // hpZ: splits the secondary groups off the engine's communicator (after
  // checking each lies on one node) and hands this rank's to the gatherer;
  // in Start, once the ranks' TrainSpecs are known to agree.
  absl::Status SetUpSecondaryGroup();
  // Allocate's part for TrainSpec::offload: the swap files, the streamed
  // update, the gatherer's shard fetch (engine_offload.cc).
  absl::Status AllocateOffload();

  // SetParam's and SetFrozenParam's checks of the indices, a tie, the size
  // and the values (`call` names the caller in the message).
  absl::Status CheckParamValues(const char* call, int unit, int param,
                                absl::Span<const float> values) const;
  absl::Status SetParam(int unit, int param, absl::Span<const float> values) override;
  using Engine::Start;
  absl::Status Start(absl::Span<const TrainerSetting> settings) override;
  absl::StatusOr<UnitView> Gather(int unit) override;
  absl::Status Release(int unit) override;
  absl::Status SetEvalMode(bool eval) override;
  absl::StatusOr<UnitView> GradView(int unit) override;
  absl::Status ReduceGrads(int unit) override;
  absl::StatusOr<StepResult> Step() override;
  absl::Status SetTrainable(int unit, int param, bool trainable) override;
  absl::Status SetFrozenParam(int unit, int param, absl::Span<const float> values) override;
  void RecordInputWait(absl::Duration d) override { timeline_.AddInputWait(d); }
  void RecordPipelineWait(absl::Duration d) override { timeline_.AddPipelineWait(d); }
  double loss_scale() const override { return loss_scaler_.scale(); }
  absl::StatusOr<std::vector<float>> GetParam(int unit, int param) override;
  absl::Status Save(const std::string& dir, const std::string& trainer_state,
                    const CheckpointOptions& options) override;
  absl::Status WaitForCheckpoint() override;
  absl::StatusOr<CheckpointInfo> Load(const std::string& path) override;
  absl::Status SaveSlices(const std::string& dir, const std::string& trainer_state,
                          const ModelSpec& whole,
                          const std::vector<std::vector<ParamOrigin>>& origins, Communicator& world,
                          const CheckpointOptions& options) override;
  absl::StatusOr<CheckpointInfo> LoadSlices(
      const std::string& path, const std::vector<std::vector<ParamOrigin>>& origins) override;
  // Load and LoadSlices (`origins` null: this engine's model is the
  // checkpoint's).
  absl::StatusOr<CheckpointInfo> LoadImpl(const std::string& path,
                                          const std::vector<std::vector<ParamOrigin>>* origins);
  absl::Status PrepareCheckpointDirectory(const std::string& dir) override;
  absl::Status PrepareCheckpointDirectory(const std::string& dir, Communicator& world) override;

  const ModelSpec& model() const override { return model_; }
  const TrainSpec& train() const override { return train_; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int64_t steps() const override { return step_; }
  EngineStats Stats() const override;
  const MemoryLedger& ledger() const override { return device_.ledger(); }
  const MemoryLedger& tier_ledger(MemoryTier tier) const override;

  // Internal (tests): the dynamic loss scale and its counters.
  using LossScaleState = LossScaler::State;
  LossScaleState loss_scale_state() const { return loss_scaler_.state(); }
  // Internal (tests): the plan the engine allocated, and a check that every
  // padding element of every buffer this rank holds is still zero.
  const BufferPlan& plan() const { return plan_; }
  const FlatLayout& layout() const { return layout_; }
  absl::Status CheckPaddingIsZero() const;

  // Model parallelism (Engine::Create with ModelParallelOptions): Step()
  // adds the sums of squares (and the non-finite count) of `parallel.group`
  // to this rank's, and without `count_replicated` leaves the replicated
  // params out of this rank's sum.
  void SetModelParallel(const ModelParallelOptions& parallel);

 private:
  // RuntimeServices, for the owners (engine.cc).
  Communicator& comm() override { return comm_; }
  CollectiveLog& log() override { return log_; }
  DeviceOps& ops() override { return *ops_; }
  absl::Status WaitComm(CommHandle& handle, WaitSite site) override;
  absl::Status ZeroOnCompute(void* dst, int64_t bytes) override;
  absl::Status CopyOnCompute(void* dst, const void* src, int64_t bytes) const override;
  absl::Status SyncCompute() override;
  absl::StatusOr<std::shared_ptr<Event>> RecordCompute() override;
  // When the device's memory is not host memory (the communicator then
  // moves device memory) they go through a device temporary, ledgered as
  // workspace while it lives.
  absl::Status HostAllGather(const int64_t* mine, int64_t* all, int64_t count) override;
  absl::Status HostBroadcast(int64_t* words, int64_t count, int root) override;
  // The device temporary of those exchanges, at least `words` int64 long:
  // kept and grown as needed (a per-call cudaMalloc/cudaFree would stall the
  // GPU every step); workspace in the ledger, outside the plan.
  absl::StatusOr<int64_t*> RecordExchange(int64_t words);

  absl::Status CheckUnit(int unit, const char* call) const;
  absl::Status CheckStarted(const char* call) const;
  // CheckStarted, and FailedPrecondition in eval mode (SetEvalMode): the
  // calls of a training step.
  absl::Status CheckTraining(const char* call) const;
  // Checks of Save and PrepareCheckpointDirectory: started, between steps.
  absl::Status CheckBetweenSteps(const char* call) const;
  absl::Status Poison(absl::Status status);
  // The unit's params in memory `bases` (one per segment of
  // layout_.SegmentsOf(unit), null where there is no gradient).
  UnitView MakeView(const std::vector<void*>& bases, DType dtype, int unit) const;
  // Writes fp32 `values` into device memory `dst` as `dtype` (converted on the
  // host into `staging`, which must live until the next SyncCompute).
  absl::Status StoreConverted(const float* values, int64_t n, DType dtype, void* dst,
                              std::vector<uint16_t>& staging) const;
  // `n` elements of an optimizer state tensor of `unit` from segment index
  // `seg_index` of its owned range, to or from host memory, on whichever
  // tier holds it: on the device enqueued on the compute stream (the host
  // memory must live until SyncCompute), elsewhere done on return.
  // kMaster only with mixed precision.
  absl::Status ReadState(StateTensor tensor, int unit, int64_t seg_index, int64_t n,
                         float* host) const;
  absl::Status WriteState(StateTensor tensor, int unit, int64_t seg_index, int64_t n,
                          const float* host);
  // fp32 `values` of `unit`'s segment elements [seg_begin, seg_begin + n)
  // into its params as the param dtype: on the device (StoreConverted), or
  // in the NVMe tier's swap file (written on return).
  absl::Status StoreParams(int unit, int64_t seg_begin, int64_t n, const float* values,
                           std::vector<uint16_t>& staging);
  // Shorthands into buffers_ (shard_buffers.h).
  void* ParamsAt(int unit, int64_t seg_index) const { return buffers_.ParamsAt(unit, seg_index); }
  ElementRange OwnedRange(int unit) const { return buffers_.OwnedRange(unit); }

  // Exact sum of squares of the reduced gradient over all ranks (GradNorm),
  // fused with the collective-sequence check (one all-gather per step);
  // with model parallelism also over the model-parallel group.
  absl::StatusOr<double> GlobalSumSquaresAndCheckSequence();
  // The phases of Step(), in order (engine_step.cc).
  absl::Status CheckStepPreconditions() const;
  // Global norm (with the sequence check), clipping and the fused update on
  // this rank's shard; a non-finite norm skips the update.
  absl::StatusOr<StepResult> NormClipAndUpdate();
  // `runs` without the params frozen by SetTrainable.
  std::vector<UpdateRun> ExcludeFrozenNow(std::vector<UpdateRun> runs) const;
  // Ends the step on the timeline (the next one begins), books its times
  // into stats_.
  void RecordStepTimes();

  // Start-up (engine_start.cc).
  // Per rank that differs from rank 0: which units differ (one all-gather of
  // each unit's element count and fingerprint; same unit count on every rank).
  absl::StatusOr<std::vector<std::string>> UnitDifferences();
  absl::Status CheckWeightsAndSettingsAgree(absl::Span<const TrainerSetting> settings);
  absl::Status StartMismatch(const std::vector<std::string>& per_rank) const;
  // Every rank's `mine` (the same length on every rank), in rank order;
  // `phase` (-1, -2, -3) tells the exchanges apart in the sequence record.
  absl::StatusOr<std::vector<int64_t>> ExchangeStartRecord(const std::vector<int64_t>& mine,
                                                           int phase);

  ModelSpec model_;
  TrainSpec train_;
  Device& device_;
  Communicator& comm_;
  FlatLayout layout_;
  BufferPlan plan_;
  int rank_ = 0;
  int world_ = 1;
  DType param_dtype_;
  DType grad_dtype_;
  bool mixed_ = false;

  // The host tier (TrainSpec::offload; null without offload) and the NVMe
  // tier's ledger, declared before the buffers they hold.
  std::unique_ptr<Device> host_tier_;
  MemoryLedger host_ledger_unused_;  // tier_ledger(kHost) without a host tier
  MemoryLedger nvme_ledger_;
  ShardBuffers buffers_;
  // The per-step arithmetic runs through ops_ on compute_ (declared after the
  // buffers: destroyed first, so queued work never outlives them).
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<DeviceOps> ops_;
  DeviceBuffer record_exchange_;  // see RecordExchange
  // The offloaded optimizer state's update (null on the device tier).
  std::unique_ptr<OffloadOptimizer> offload_;

  CollectiveLog log_;
  LossScaler loss_scaler_;
  ShardOptimizer optimizer_;
  GradNorm norm_;
  // Declared after the buffers and the stream: destroyed first, each waiting
  // for its collectives in flight (peers may still read our buffers) and the
  // writer for its thread.
  std::unique_ptr<CheckpointWriter> checkpoint_;
  // SaveSlices' writer of the whole model's checkpoint over the grid's
  // world (engine_save_slices.cc), made by the first SaveSlices.
  std::unique_ptr<SliceCheckpoint> slices_;
  // The exchange of SaveSlices: this world rank's shard of the whole
  // model's checkpoint, in the rank file's order.
  absl::Status GatherWholeShard(const std::vector<std::vector<ParamOrigin>>& origins,
                                std::vector<float>* out);
  // Save's and SaveSlices' checks of their arguments, what this rank can
  // tell alone (`state_bytes`: the trainer state's bytes in the manifest).
  absl::Status CheckSaveCall(const char* call, const std::string& dir, const std::string& state,
                             const CheckpointOptions& options, int64_t* state_bytes) const;
  // The manifest of a checkpoint of this engine's state (all but the
  // model, its layout and the world size).
  Manifest StateManifest(const std::string& state) const;
  ModelParallelOptions parallel_;
  // hpZ's group (declared before the gatherer, which waits on its
  // all-gathers when destroyed).
  std::unique_ptr<Communicator> secondary_group_;
  std::unique_ptr<ParamGatherer> gatherer_;
  std::unique_ptr<GradReducer> reducer_;

  bool started_ = false;
  bool eval_mode_ = false;                           // SetEvalMode
  std::vector<std::vector<uint64_t>> param_hashes_;  // 0 = not set
  // Per segment and slot: a trainable param frozen by SetTrainable.
  std::vector<std::vector<char>> frozen_now_;
  absl::Status poisoned_;

  // Per-step state.
  absl::Duration step_comm_busy_begin_;  // comm_.busy_time() when the step began
  int64_t step_ = 0;                     // Step() calls completed (restored by Load)
  int64_t steps_since_start_ = 0;        // Step() calls since Start (stage 3 records the first)

  // Timing: every public call that can run during training opens a
  // StepTimeline::Call on timeline_ first.
  EngineStats stats_;
  StepTimeline timeline_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_ENGINE_IMPL_H_
