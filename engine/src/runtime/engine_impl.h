// EngineImpl: the ZeRO stage 0-3 runtime behind zeroshard::Engine.
//
// Buffers (names and sizes from BufferPlan, allocated once in Create):
//   params   param dtype: each unit's full segment (stages 0-2, stage 3's
//            persistent units) or this rank's shard of it (stage 3)
//   grads    stages 0-1: full flat buffer; stage 2: this rank's shard
//   master   mixed precision only: stage 0 full, stages 1-2 shard (fp32)
//   adam_m/v stage 0 full, stages 1-2 shard (fp32)
//   grad_staging  slots of max-unit size for micro-batch gradients
//   param_gather  stage 3: slots units are all-gathered into
//
// "Segment coordinates" index a unit's padded segment; the optimizer of a
// rank covers its "owned range" of each unit: the whole segment in stage 0,
// its shard in stages 1-2.
#ifndef ZEROSHARD_RUNTIME_ENGINE_IMPL_H_
#define ZEROSHARD_RUNTIME_ENGINE_IMPL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/device/device_ops.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/runtime/step_timeline.h"
#include "kernels/cpu/norm.h"
#include "zeroshard/engine.h"

namespace zeroshard::internal {

// A run of a rank's owned range with one weight-decay setting.
struct DecayRun {
  int unit = 0;
  ElementRange range;  // segment coordinates
  bool decay = true;
};

// Set in the environment (any value): each engine prints on stderr, when it
// is destroyed, where its steps waited on collectives (EngineImpl::WaitSite).
inline constexpr char kDebugCommWaitsEnvVar[] = "ZS_DEBUG_COMM_WAITS";

class EngineImpl final : public Engine {
 public:
  EngineImpl(const ModelSpec& model, const TrainSpec& train, Device& device, Communicator& comm,
             FlatLayout layout, BufferPlan plan);
  ~EngineImpl() override;

  absl::Status Allocate();

  absl::Status SetParam(int unit, int param, absl::Span<const float> values) override;
  using Engine::Start;
  absl::Status Start(absl::Span<const TrainerSetting> settings) override;
  absl::StatusOr<UnitView> Gather(int unit) override;
  absl::Status Release(int unit) override;
  absl::StatusOr<UnitView> GradView(int unit) override;
  absl::Status ReduceGrads(int unit) override;
  absl::StatusOr<StepResult> Step() override;
  void RecordInputWait(absl::Duration d) override { timeline_.AddInputWait(d); }
  void RecordPipelineWait(absl::Duration d) override { timeline_.AddPipelineWait(d); }
  double loss_scale() const override { return loss_scale_; }
  absl::StatusOr<std::vector<float>> GetParam(int unit, int param) override;
  absl::Status Save(const std::string& dir, const std::string& trainer_state,
                    const CheckpointOptions& options) override;
  absl::Status WaitForCheckpoint() override;
  absl::StatusOr<CheckpointInfo> Load(const std::string& path) override;
  absl::Status PrepareCheckpointDirectory(const std::string& dir) override;

  const ModelSpec& model() const override { return model_; }
  const TrainSpec& train() const override { return train_; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int64_t steps() const override { return step_; }
  EngineStats Stats() const override;
  const MemoryLedger& ledger() const override { return device_.ledger(); }

  // Internal (tests): the dynamic loss scale and its counters.
  struct LossScaleState {
    double scale = 1.0;
    int hysteresis_left = 0;
    int64_t clean_steps = 0;
    int skips_at_min_scale = 0;
    bool operator==(const LossScaleState& o) const {
      return scale == o.scale && hysteresis_left == o.hysteresis_left &&
             clean_steps == o.clean_steps && skips_at_min_scale == o.skips_at_min_scale;
    }
  };
  LossScaleState loss_scale_state() const {
    return {loss_scale_, hysteresis_left_, clean_steps_, skips_at_min_scale_};
  }
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
  // open_grad_slot_ values besides a slot index.
  static constexpr int kNoGradView = -2;      // no GradView open for the unit
  static constexpr int kDirectGradView = -1;  // view into the gradient buffer itself

  // A gradient staging slot and the reduction reading from it.
  struct StagingSlot {
    int unit = -1;
    int micro = 0;
    CommHandle reduction;  // stage 2: reduce-scatter in flight
  };

  absl::Status CheckUnit(int unit, const char* call) const;
  // The label every collective of `unit` carries (Communicator tag): two
  // ranks that move different units of equal size fail instead of mixing.
  static uint64_t UnitTag(int unit) { return static_cast<uint64_t>(unit) + 1; }
  absl::Status CheckStarted(const char* call) const;
  absl::Status Poison(absl::Status status);
  // Where the engine waits on a collective: each wait is booked to its
  // site, and with ZS_DEBUG_COMM_WAITS set in the environment the engine
  // prints the per-site totals of its steps on stderr when it is destroyed
  // (a measurement aid: which call exposes communication).
  enum class WaitSite {
    kGradViewSlot,    // GradView: every staging slot's reduction in flight
    kStepReductions,  // Step: the reductions of the last micro-batch
    kRecordExchange,  // the norm's all-gather (and Start's, Save's exchanges)
    kParamGather,     // Gather, stages 1-2: the updated params' all-gather
    kStage3Gather,    // Gather, stage 3: the unit's all-gather (prefetch missed)
    kStage3Evict,     // Gather, stage 3: a slot's all-gather before reuse
    kStage3Drop,      // Step, stage 3: the gather pool's all-gathers
    kGetParam,        // GetParam (and its wait for the param all-gathers)
    kSave,            // Save: the updated params' all-gathers
    kModelParallel,   // the model-parallel group's norm all-reduce
    kNumSites
  };
  static const char* WaitSiteName(WaitSite site);
  // Waits on `handle`, counting the time as exposed communication.
  absl::Status WaitComm(CommHandle& handle, WaitSite site);
  // The ZS_DEBUG_COMM_WAITS report (see WaitSite).
  void PrintCommWaits() const;

  // A stage-3 gather buffer and the unit it holds (or receives).
  struct GatherSlot {
    int unit = -1;
    bool held = false;   // between Gather and Release
    CommHandle gather;   // all-gather in flight into the slot
    int64_t issued = 0;  // issue counter, to evict the oldest
  };

  enum class CollectiveKind : uint64_t {
    kAllReduceGrads = 1,
    kReduceScatterGrads,
    kAllGatherParams,
    kGatherUnit,
    kGatherForRead,
    kFingerprint,
    kCheckpoint
  };
  // Folds one collective into this step's sequence hash (every rank must
  // issue the same sequence; Step() compares).
  void NoteCollective(CollectiveKind kind, int unit, int64_t count);

  // Stage 3.
  absl::StatusOr<UnitView> GatherSharded(int unit);
  absl::StatusOr<int> AcquireGatherSlot(int protect_from);
  absl::Status IssueUnitGather(int unit, int slot);
  absl::Status PrefetchFrom(size_t order_pos);
  absl::Status DropGatherPool();
  void* GatherSlotData(int slot) const;
  void DisablePrefetch(const std::string& why);

  // Element pointers (byte arithmetic on the typed buffers).
  void* ParamsAt(int unit, int64_t seg_index) const;
  void* GradsAt(int unit, int64_t seg_index) const;  // seg_index in the owned part
  float* OptimizerAt(const DeviceBuffer& buf, int unit, int64_t seg_index) const;
  void* StagingSlotData(int slot) const;
  ElementRange OwnedRange(int unit) const;

  UnitView MakeView(void* base, DType dtype, int unit) const;
  // "no unit is gathered", or the units that are ("'block.1' is gathered").
  std::string DescribeGathered() const;
  absl::StatusOr<int> AcquireStagingSlot();
  // Finishes the oldest in-flight staging slot: waits for its reduction and
  // (stage 2, micro-batch > 0) adds the reduced shard into the gradient shard.
  absl::Status RetireOldestSlot(WaitSite site);
  absl::Status DrainReductions();
  // Retires, without blocking, the reductions that have completed (in issue
  // order), so that their units' norm block sums run during the backward.
  absl::Status RetireCompletedReductions();
  // True when a unit's norm block sums are computed as soon as its gradient
  // is final (enqueued into its own part of norm_blocks, summed in Step);
  // false with model parallelism, whose norm cuts shards into runs.
  bool EarlyNorm() const { return norm_ranges_.empty(); }
  // Enqueues the block sums of squares of this rank's shard of unit `u`
  // (its gradient must be final) into the unit's blocks of norm_blocks.
  absl::Status EnqueueUnitNorm(int u);
  // A collective on one rank that reads and writes the same memory moves
  // nothing: the engine does not issue it (the sum of one rank is its
  // input, bit for bit).
  bool NoOpCollective(const void* send, const void* recv) const {
    return world_ == 1 && send == recv;
  }
  absl::Status WaitParamGathers(WaitSite site);

  // Enqueues acc += add (n gradient elements) on the compute stream.
  absl::Status AccumulateInto(void* acc, const void* add, int64_t n);
  // Waits for the compute stream: before the host or the communicator
  // touches a buffer that enqueued work reads or writes.
  absl::Status SyncCompute();
  // An event marking the work enqueued on the compute stream so far (for a
  // collective that must start after it: Communicator::AllReduceAfter).
  absl::StatusOr<std::shared_ptr<Event>> RecordCompute();
  // Collectives on small int64 records that live in host memory (start-up,
  // norm, checkpoint agreement), waited for. When the device's memory is not
  // host memory (the communicator then moves device memory) they go through a
  // device temporary, ledgered as workspace while it lives.
  absl::Status HostAllGather(const int64_t* mine, int64_t* all, int64_t count);
  absl::Status HostBroadcast(int64_t* words, int64_t count, int root);
  // The device temporary of those exchanges, at least `words` int64 long:
  // kept and grown as needed (a per-call cudaMalloc/cudaFree would stall the
  // GPU every step); workspace in the ledger, outside the plan.
  absl::StatusOr<int64_t*> RecordExchange(int64_t words);
  // Enqueues a copy between host memory and the device's buffers (either
  // direction) on the compute stream; the host memory must live until the
  // next SyncCompute.
  absl::Status CopyOnCompute(void* dst, const void* src, int64_t bytes) const;
  // Writes fp32 `values` into device memory `dst` as `dtype` (converted on the
  // host into `staging`, which must live until the next SyncCompute).
  absl::Status StoreConverted(const float* values, int64_t n, DType dtype, void* dst,
                              std::vector<uint16_t>& staging) const;
  // Exact sum of squares of the reduced gradient over all ranks, fused with
  // the collective-sequence check (one all-gather per step); with model
  // parallelism also over the model-parallel group (one all-reduce more).
  absl::StatusOr<double> GlobalSumSquaresAndCheckSequence();
  // Adds the squares of this rank's shard of unit `u` to `sum`, block by
  // block; of its runs that do not count (norm_ranges_) only the number of
  // non-finite values.
  absl::Status AddShardSquares(int u, kernels::ExactSum& sum);
  // The phases of Step(), in order (engine_step.cc).
  absl::Status CheckStepPreconditions() const;
  // Global norm (with the sequence check), clipping and the fused update on
  // this rank's shard; a non-finite norm skips the update.
  absl::StatusOr<StepResult> NormClipAndUpdate();
  // Optimizer sharded: all-gathers of the updated params, waited for in Gather.
  void IssueParamGathers();
  // Stage 3: turns prefetch on after the first step (or off when the order
  // changed) and gathers the next step's first units.
  absl::Status StartNextStepPrefetch();
  // Ends the step on the timeline (the next one begins), books its times
  // into stats_.
  void RecordStepTimes();
  // fp16: adjusts the dynamic loss scale after a step; an error after too
  // many skipped steps at the minimum scale.
  absl::Status UpdateLossScale(bool overflow);
  absl::Status ApplyOptimizer(double grad_scale, double lr);
  void BuildDecayRuns();

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

  DeviceBuffer params_, grads_, master_, adam_m_, adam_v_, staging_, norm_blocks_, gather_pool_;
  // The per-step arithmetic runs through ops_ on compute_ (declared after the
  // buffers: destroyed first, so queued work never outlives them).
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<DeviceOps> ops_;
  std::vector<double> host_norm_blocks_;  // when norm_blocks_ is not host memory
  DeviceBuffer record_exchange_;          // see RecordExchange
  std::vector<int64_t> param_offset_;     // per unit: first element in params_

  // Checkpoints (engine_checkpoint.cc): a Save whose file write may still be
  // running on its writer thread, committed by WaitForCheckpoint.
  struct PendingCheckpoint {
    std::string root;
    std::string partial_dir;
    std::string final_dir;
    CheckpointOptions options;
    Manifest manifest;  // all but `files`, which rank 0 fills at commit
    std::thread writer;
    absl::Status write_status;  // set by the writer
    FileRecord record;          // set by the writer
  };
  absl::Status CheckBetweenSteps(const char* call) const;
  // Collective, the directory check of Save and PrepareCheckpointDirectory:
  // rank 0 creates `root` and `check_dir` (first removing `check_dir` when
  // `fresh`: a crashed save's partial step) and writes a probe with a fresh
  // number there; every rank must read that number through its own path
  // and be able to create a file there. Every rank returns the same status:
  // the first failing rank's (`local`: what a rank found wrong before),
  // or FailedPrecondition naming the ranks that see another directory.
  absl::Status CheckSharedDirectory(const std::string& root, const std::string& check_dir,
                                    bool fresh, const absl::Status& local, const char* call);
  std::unique_ptr<PendingCheckpoint> pending_checkpoint_;
  // This rank's shard as the rank file holds it, copied by Save and read by
  // the writer thread until WaitForCheckpoint joins it; kept between saves
  // unless CheckpointOptions::keep_snapshot is false.
  std::vector<float> checkpoint_snapshot_;
  // The size of this engine's widest manifest with an empty trainer state
  // ("{}"), measured at the first Save (-1 before).
  int64_t widest_manifest_bytes_ = -1;

  // Start-up (engine_start.cc).
  // What Start() compares when the fixed-size header matched.
  // Per rank that differs from rank 0: which units differ (one all-gather of
  // each unit's element count and fingerprint; same unit count on every rank).
  absl::StatusOr<std::vector<std::string>> UnitDifferences();
  absl::Status CheckWeightsAndSettingsAgree(absl::Span<const TrainerSetting> settings);
  absl::Status StartMismatch(const std::vector<std::string>& per_rank) const;
  // Every rank's `mine` (the same length on every rank), in rank order;
  // `phase` (-1, -2, -3) tells the exchanges apart in the sequence record.
  absl::StatusOr<std::vector<int64_t>> ExchangeStartRecord(const std::vector<int64_t>& mine,
                                                           int phase);
  bool started_ = false;
  std::vector<std::vector<uint64_t>> param_hashes_;  // 0 = not set
  absl::Status poisoned_;

  // Per-step state.
  absl::Duration step_comm_busy_begin_;  // comm_.busy_time() when the step began
  int64_t step_ = 0;                     // Step() calls completed (restored by Load)
  int64_t steps_since_start_ = 0;        // Step() calls since Start (stage 3 records the first)
  int64_t applied_steps_ = 0;            // optimizer updates applied (bias correction)
  std::vector<int> reduced_count_;       // per unit: ReduceGrads calls this step
  std::vector<int> open_grad_slot_;      // per unit: slot of an open GradView, -1 direct, -2 none
  std::vector<CommHandle> unit_reductions_;  // per unit: boundary / first-micro reduction
  std::vector<CommHandle> param_gathers_;    // per unit: all-gather of updated params
  std::deque<int> reduction_order_;   // stages 0-1: units with a reduction pending, in issue order
  std::vector<char> unit_norm_done_;  // per unit: its norm block sums are enqueued this step
  std::vector<StagingSlot> slots_;
  std::deque<int> busy_slots_;  // in issue order
  std::deque<int> free_slots_;
  std::vector<DecayRun> decay_runs_;

  // Stage 3 gather pool and prefetch.
  std::vector<GatherSlot> gather_slots_;
  std::vector<int> unit_gather_slot_;  // per unit: slot holding it, -1
  int held_unit_ = -1;
  // Per unit, every stage: between a Gather and its Release. Resident units
  // need no work on Release, but their pairing is checked all the same, so
  // that a trainer's missing Gather fails at stage 0 as at stage 3.
  std::vector<char> gathered_;
  int64_t gather_issue_counter_ = 0;
  std::vector<int> recorded_order_;  // Gather() calls of the first step
  size_t order_pos_ = 0;             // this step's position in it
  bool prefetch_active_ = false;
  bool prefetch_fallback_reported_ = false;
  int prefetch_depth_ = 0;

  // Dynamic loss scaling (fp16).
  double loss_scale_ = 1.0;
  int hysteresis_left_ = 1;
  int64_t clean_steps_ = 0;
  int skips_at_min_scale_ = 0;

  // Model parallelism: the group the norm and the skip decision are agreed
  // over (null: none), and per unit its segment cut into runs that count in
  // this rank's norm and runs that do not (replicated params, when
  // count_replicated is false; empty for a unit without any: all counts).
  struct NormRange {
    ElementRange range;  // segment coordinates
    bool counted = true;
  };
  Communicator* model_parallel_ = nullptr;
  std::vector<std::vector<NormRange>> norm_ranges_;

  // Collective-sequence check.
  uint64_t sequence_hash_ = 0;
  int64_t sequence_count_ = 0;
  int64_t collectives_total_ = 0;

  // Timing: every public call that can run during training opens a
  // StepTimeline::Call on timeline_ first.
  EngineStats stats_;
  StepTimeline timeline_;
  // Per WaitSite: the time waited during steps, and how many waits blocked.
  absl::Duration site_wait_[static_cast<int>(WaitSite::kNumSites)] = {};
  int64_t site_waits_[static_cast<int>(WaitSite::kNumSites)] = {};
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_ENGINE_IMPL_H_
