// Engine: executes a ZeRO plan on one rank.
//
// One Engine per rank, all created with the same ModelSpec and TrainSpec over
// one Communicator group. The trainer code is the same for every stage:
//
//   ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, device, comm));
//   for each unit u, param p: engine->SetParam(u, p, initial_values);
//   ZS_RETURN_IF_ERROR(engine->Start({TrainerSetting::Int("micro_batch", 32)}));
//                                           // fingerprint check across ranks
//   loop:
//     for each micro-batch:
//       forward:  for u in order:   view = engine->Gather(u); compute; engine->Release(u)
//       backward: for u reversed:   view = engine->Gather(u); g = engine->GradView(u);
//                                   write g (overwrite); engine->ReduceGrads(u);
//                                   engine->Release(u)
//     engine->Step();
//
// The stage only changes what the engine keeps resident and which collective
// it issues. Gradients written through GradView are per micro-batch; the
// engine sums them over micro-batches and ranks, and the optimizer sees
// their mean (divided by world size x grad_accum_steps).
#ifndef ZEROSHARD_ENGINE_H_
#define ZEROSHARD_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {

// A param's elements in a flat engine buffer. Valid until the matching
// Release() (params) or ReduceGrads() (grads).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
  const std::vector<int64_t>* shape = nullptr;  // the ParamSpec's shape

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// One unit's params (or gradients), in ModelSpec order.
struct UnitView {
  std::vector<TensorView> params;
};

// What one optimizer step did.
struct StepResult {
  int64_t step = 0;         // 1-based count of optimizer steps taken so far
  double lr = 0.0;          // learning rate applied
  double grad_norm = 0.0;   // global L2 norm of the averaged gradient, BEFORE clipping
  double clip_coef = 1.0;   // factor applied to the gradient (1 when not clipped)
  bool skipped = false;     // non-finite gradient: no update was applied
  double loss_scale = 1.0;  // the scale this step's gradients carried (fp16); 1 otherwise
};

// Where a step's wall time went, on this rank.
//
// The timeline (one monotonic clock): a step runs from its boundary, the
// end of Start() for the first step and the end of the previous Step()
// after that, to the end of its own Step(). Engine time is the wall time
// inside engine calls (Gather, Release, GradView, ReduceGrads, Step, Save,
// WaitForCheckpoint, GetParam; a call made inside another counts once); the
// rest of the step is outside the engine. Time before Start() ends (SetParam,
// Load, Start's own exchanges) belongs to no step; a Save, GetParam or
// WaitForCheckpoint between two steps belongs to the next step. So make the
// trainer's own set-up (data loader, buffers) before Start(): after it, the
// set-up is the first step's compute (mlp_demo's teacher took 0.4 s there).
//
// The six parts below never overlap, each is >= 0 and they add up to `total`
// exactly, on every rank and every step (Durations are integers):
//   engine time  = exposed_comm + optimizer + engine_other
//   outside time = compute + input_wait + pipeline_bubble
struct StepTimes {
  absl::Duration compute;          // outside engine calls, less the reported waits: the
                                   // trainer's own work (its own collectives included)
  absl::Duration exposed_comm;     // inside engine calls, blocked on the engine's collectives
  absl::Duration optimizer;        // inside Step(): norm, clipping and the fused update, less
                                   // the collective waits inside it
  absl::Duration input_wait;       // reported with RecordInputWait(), as booked (see there)
  absl::Duration engine_other;     // the rest of the engine time: gradient accumulation,
                                   // staging, views, checks, issuing collectives
  absl::Duration pipeline_bubble;  // reported with RecordPipelineWait(), as booked (see there)
  absl::Duration total;            // boundary to boundary
  // Not part of the split:
  // How long this rank's collectives ran during the step (the communicator's
  // Communicator::busy_time, the trainer's own collectives on it included).
  absl::Duration comm_busy;
  // The communication hidden behind other work: max(0, comm_busy -
  // exposed_comm). An estimate: busy time counts a collective from its
  // start to its end, waits for slow peers included, so a collective that
  // ran while the engine was not waiting for it counts here.
  absl::Duration hidden_comm;
  // Reported waits the step could not hold (see RecordInputWait): a trainer
  // that reports more than it waited outside engine calls. Zero when the
  // trainer measures its waits as documented.
  absl::Duration unplaced_wait;
};

// A setting of the trainer that every rank must share (its micro-batch size,
// its data seed, ...), compared across ranks by Start() beside the engine's
// own settings, and named with both values when it differs.
struct TrainerSetting {
  static TrainerSetting Int(std::string name, int64_t value) {
    return {std::move(name), /*is_real=*/false, value, 0.0};
  }
  static TrainerSetting Real(std::string name, double value) {
    return {std::move(name), /*is_real=*/true, 0, value};
  }

  std::string name;
  bool is_real = false;
  int64_t int_value = 0;
  double real_value = 0.0;  // compared bit for bit
};

struct EngineStats {
  int64_t steps = 0;  // Step() calls on this engine (a loaded checkpoint's steps not counted)
  int64_t skipped_steps = 0;
  double loss_scale = 1.0;       // current (fp16); 1 otherwise
  bool prefetch_active = false;  // stage 3: gathers issued ahead from the recorded order
  int64_t collectives = 0;       // issued by this engine so far
  // Stage 3 with hpZ (TrainSpec::zeropp.secondary_partition_size): gathers
  // served within the secondary group instead of across the world.
  int64_t secondary_gathers = 0;
  StepTimes last;    // the most recent step
  StepTimes totals;  // every field summed over all steps
  // TrainSpec::offload at work, in one line (empty without offload): the
  // tier, the chunk, and for NVMe the swap files' I/O path and why ("io_uring
  // (queue depth 32), O_DIRECT", or the thread pool with io_uring's refusal).
  std::string offload;
};

// Model parallelism around the engine (docs/parallelism.md).
struct ModelParallelOptions {
  // The tp x pp ranks that share this rank's data-parallel index
  // (ProcessGrid::model_parallel()); null: no model parallelism. Step()
  // adds the exact sums of squares for the global gradient norm, and the
  // counts of inf/NaN values, over it (one int64 all-reduce per step), so
  // every shard gets the same norm bits, clips by the same factor and skips
  // the same steps. A host memory communicator (local, mpi): Create refuses
  // one whose memory_kind() is not kCpu with Unimplemented. Must outlive
  // the engine; every rank of it calls Step() together.
  Communicator* group = nullptr;
  // Whether this rank's replicated params (ParamSpec::tp_split_dim < 0)
  // count in the global norm: true on exactly one rank of each tp group
  // (tp rank 0), so that each is counted once. Their non-finite values
  // skip the step whatever this says.
  bool count_replicated = true;
};

// Where one param of a model-parallel shard lives in a checkpoint of the
// whole model (Engine::LoadSlices).
struct ParamOrigin {
  // The checkpoint model's unit and param (a tied alias there reads its
  // owner).
  std::string unit;
  std::string param;
  // The dimension of the whole param this param is a slice of; -1: the
  // whole param (the same shape). That dimension is `groups` equal groups
  // (3 for a fused q | k | v), each cut into `parts` parts of
  // ceil(group / parts) indices; this param holds part `part` of every
  // group, in group order. Indices past a group's end are padding (a
  // vocabulary padded to a multiple of tp): they load as zeros. The other
  // dimensions equal the whole param's.
  int split_dim = -1;
  int groups = 1;
  int parts = 1;
  int part = 0;
};

// One rank's engine.
//
// Thread-safety: an Engine is not thread-safe. One thread (the rank's) calls
// it; the collectives it issues run on the communicator's progress thread,
// which only touches the buffers the engine handed it.
//
// Order: Create, SetParam for every param, Start (once, on every rank), then
// per optimizer step grad_accum_steps micro-batches of Gather/Release
// (forward) and Gather/GradView/ReduceGrads/Release (backward), then Step.
// GetParam, Stats, ledger and the accessors may be called at any time after
// Create (GetParam on every rank together). A call out of order is
// FailedPrecondition naming the unit and what is missing; an out-of-range
// unit or param OutOfRange.
//
// Errors: absl::Status, never exceptions. A communicator failure (a peer
// timed out, left, died or disagreed) or a failed Start poisons the engine:
// every later call returns that error. The process should then end the job
// (AbortJob in communicator.h).
class Engine {
 public:
  // Validates the specs (InvalidArgument naming the field), lays out the
  // flat buffers for comm.size() ranks and allocates exactly the buffers
  // PlanEngineBuffers(model, train, comm.size()) lists, on `device`
  // (ResourceExhausted when the device cannot). The engine does not own
  // `device` or `comm`; both must outlive it. The device's memory must be
  // what the communicator moves (Communicator::memory_kind(): host memory
  // for local and mpi, GPU memory for nccl or a local group on a GPU), else
  // InvalidArgument naming both. On a CUDA device the views point to device
  // memory (docs/gpu.md).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const ModelSpec& model,
                                                        const TrainSpec& train, Device& device,
                                                        Communicator& comm);
  // The same for one (tp, pp) shard of a model-parallel run: `model` is the
  // shard's spec (ShardModelSpec), `comm` its data-parallel group
  // (ProcessGrid::dp()), and `parallel` says whom the step must agree with
  // (docs/parallelism.md). With parallel.group null it is the call above.
  // Allocates exactly PlanEngineBuffers(model, train, comm.size()), as
  // PlanGrid reports; Start() and the sequence check compare the dp group.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const ModelSpec& model,
                                                        const TrainSpec& train, Device& device,
                                                        Communicator& comm,
                                                        const ModelParallelOptions& parallel);
  virtual ~Engine() = default;

  // Sets the initial value of param `param` of unit `unit` (fp32, numel
  // elements; rounded to the param dtype, kept exactly in the fp32 master).
  // Every rank passes the full tensor. Only before Start(). InvalidArgument
  // for a wrong size or a value that is not finite (naming the element).
  virtual absl::Status SetParam(int unit, int param, absl::Span<const float> values) = 0;

  // Checks that every rank agrees before training: the model spec (unit
  // count, names, shapes, no_decay, tp_split_dim, trainable, tied_to,
  // lr_scale, weight_decay), the layout, every TrainSpec field, the
  // initial weights of every param and the trainer's own `settings` (names
  // and values; pass the same names in the same order on every rank). On a
  // difference: FailedPrecondition naming the ranks that differ from rank 0,
  // each field and both values (weights: the param). Must be called once, by
  // every rank, before training; it issues collectives.
  virtual absl::Status Start(absl::Span<const TrainerSetting> settings) = 0;
  absl::Status Start() { return Start({}); }

  // The unit's params in the param dtype, ready for the forward (or
  // backward) pass; a tied alias's entry shows its owner's values. Stages
  // 0-2: the resident params (waiting, after a step, for their all-gather).
  // Stage 3: all-gathered into buffers of the gather pool (or already
  // prefetched there): the unit's own params and the tied params it uses;
  // hold at most TrainSpec::max_gathered_units units at once. The order of
  // Gather calls in the first step is recorded and later steps prefetch
  // along it; with prefetch on, a later step that gathers in another order
  // fails (FailedPrecondition naming the gather).
  virtual absl::StatusOr<UnitView> Gather(int unit) = 0;
  // Done with the unit's params for now (stage 3: its buffer returns to the
  // pool and the view becomes invalid). Every Release pairs with a Gather
  // of the same unit, once, at every stage: a Release of a unit that is not
  // gathered (never gathered, or released already) is FailedPrecondition,
  // "Release(block.0): the unit is not gathered (no unit is gathered); ...",
  // with the same words at stages 0-3, although stages 0-2 have nothing to
  // free, so a trainer that pairs them wrong fails on a laptop at stage 1,
  // not first at stage 3. OutOfRange for a unit index out of range;
  // FailedPrecondition before Start().
  virtual absl::Status Release(int unit) = 0;

  // Evaluation passes (a validation loss, logits for a check): between
  // SetEvalMode(true) and SetEvalMode(false) the trainer may Gather and
  // Release units in any order, forward only, with the params of the last
  // step. Those gathers are not part of a step: stage 3 neither records nor
  // checks them against the first step's order and prefetches nothing for
  // them, and the next step prefetches as before. GradView, ReduceGrads,
  // Step, Save and Load are FailedPrecondition in eval mode. Entering or
  // leaving it with a unit gathered is FailedPrecondition; so is entering it
  // twice or leaving it when not in it. Not itself collective, but every
  // rank must make the same gathers (stage 3 all-gathers them). Its time is
  // booked into the next step's split (compute, and comm waits for gathers).
  virtual absl::Status SetEvalMode(bool eval) = 0;

  // A buffer for this micro-batch's gradient of `unit`, in the grad dtype;
  // the trainer overwrites every element of every param view. May wait for
  // an earlier reduction to free a staging buffer. A frozen param's entry
  // (ParamSpec::trainable false, or frozen by SetTrainable) has data ==
  // nullptr and numel 0: skip it. A tied alias's entry is this unit's own
  // use of the param: the engine adds the uses in ReduceGrads order, one
  // view of a tied param open at a time. FailedPrecondition for a unit whose
  // params are all frozen (it has no gradient: skip its GradView and
  // ReduceGrads).
  virtual absl::StatusOr<UnitView> GradView(int unit) = 0;
  // The unit's gradient for this micro-batch is complete: accumulate it and
  // (asynchronously) reduce it across ranks.
  virtual absl::Status ReduceGrads(int unit) = 0;

  // Ends an optimizer step: waits for outstanding reductions, computes the
  // global gradient norm (identical bits for every stage and world size),
  // clips, applies the fused Adam update to this rank's shard and brings
  // the updated params to every rank that needs them. Must follow exactly
  // grad_accum_steps micro-batches, each of which reduced every unit once.
  virtual absl::StatusOr<StepResult> Step() = 0;

  // Freezes (false) or unfreezes (true) param `param` of unit `unit`, a
  // param declared trainable in the ModelSpec, between steps. While frozen,
  // its GradView entry has data == nullptr (the engine zeroes its gradient),
  // it adds nothing to the norm and the update leaves it and its moments
  // as they are (torch's AdamW keeps the state of a param without a
  // gradient); unfrozen, it trains on from them. Collective: every rank
  // calls it with the same arguments, after Start and between steps (no
  // open view, no gathered unit); a rank that differs fails every rank
  // with FailedPrecondition naming the ranks and both calls.
  // InvalidArgument for a param declared frozen (trainable = false: it has
  // no optimizer state; declare it trainable and freeze it here instead),
  // or for a tied alias (freeze its owner).
  virtual absl::Status SetTrainable(int unit, int param, bool trainable) = 0;

  // Overwrites the values of param `param` of unit `unit`, a param declared
  // frozen (ParamSpec::trainable false), after Start and between steps: a
  // replica the trainer keeps equal to a param another engine trains (the
  // GPT grid's LM head on the last pipeline stage is the first stage's
  // embedding, docs/parallelism.md). fp32 values, rounded to the param
  // dtype as SetParam rounds them (a value of the param dtype is kept
  // exactly); every rank passes the same full tensor, and keeps the part
  // it holds (stage 3: its shard; a gathered copy kept from an earlier step
  // is dropped). Not collective, but every rank of the data-parallel group
  // must call it with the same values before the next Gather of the unit.
  // FailedPrecondition before Start, in the middle of a step or with a unit
  // gathered; InvalidArgument for a param declared trainable or tied, a
  // wrong size or a value that is not finite; OutOfRange for an index.
  virtual absl::Status SetFrozenParam(int unit, int param, absl::Span<const float> values) = 0;

  // The factor the trainer must multiply its loss (the seed of its backward
  // pass) by before writing gradients: the dynamic loss scale with fp16, 1
  // otherwise. Constant within a step.
  virtual double loss_scale() const = 0;

  // Adds to this step's input-wait time: the trainer was blocked waiting for
  // its data (not making it: that is compute, unless it is done on the
  // trainer's thread in its place). Call it right after the wait, outside
  // engine calls. The engine books at most the time outside engine calls
  // since the step's boundary that earlier reports (input or pipeline) have
  // not claimed; the rest (a wait that began before the boundary or
  // overlapped an engine call) goes to StepTimes::unplaced_wait. Before
  // Start() it is ignored.
  virtual void RecordInputWait(absl::Duration d) = 0;
  // The same for pipeline-bubble time (the trainer waited for a
  // neighbouring stage's activations or gradients).
  virtual void RecordPipelineWait(absl::Duration d) = 0;

  // Checkpoints (zeroshard/checkpoint.h, docs/checkpoint.md). Collective:
  // every rank calls them, in the same order, with the same arguments.
  //
  // Save: the state after the last Step() — each unit's fp32 master
  // weights (the params themselves with fp32), Adam moments, step count,
  // learning-rate position, loss scale and its counters, and
  // `trainer_state`, a JSON object (its sampler position, RNG states) given
  // back by Load — into `dir`/step_<steps()>/, each rank writing only its
  // own shard. Only between steps (after Start, no open views); it first
  // completes the previous Save (see WaitForCheckpoint). With
  // options.background it returns once the state is copied to host memory.
  // Before anything is written, every rank checks that it sees the
  // directory rank 0 prepared for the step and can write there (see
  // PrepareCheckpointDirectory); at the commit, rank 0 checks that every
  // rank's file is in that directory as its rank wrote it, and commits
  // nothing otherwise. Every rank returns the same status:
  // InvalidArgument for a trainer state that is not a JSON object or is
  // past 1 MiB; FailedPrecondition in the middle of a step, or naming the
  // ranks that see another directory (ranks on several machines without a
  // shared file system); the cause's code (PermissionDenied,
  // ResourceExhausted, ...) naming the rank that cannot write; the previous
  // checkpoint's error, naming the rank, when that one failed.
  virtual absl::Status Save(const std::string& dir, const std::string& trainer_state,
                            const CheckpointOptions& options) = 0;
  absl::Status Save(const std::string& dir, const std::string& trainer_state) {
    return Save(dir, trainer_state, CheckpointOptions{});
  }
  // Save for a model-parallel shard, as part of one checkpoint of the whole
  // model (docs/checkpoint.md, "Grid checkpoints"): collective over `world`
  // (every rank of the grid, each with its engine, calls it together).
  // `whole` is the whole model and origins[unit][param] where each param of
  // this engine lives in it (as LoadSlices). The ranks exchange their
  // shards' states (fp32 master, Adam moments) so that world rank w writes
  // rank file w of an ordinary checkpoint of `whole` on world.size() ranks,
  // which Load (of `whole`, any world size and stage), LoadSlices (any
  // grid), `zeroshard inspect` and `zeroshard export` read. A replicated
  // param (tp_split_dim < 0) is written from the rank whose
  // ModelParallelOptions::count_replicated is true, a param whose origin is
  // a tied alias in `whole` (a replica) not at all: its owner is. Every
  // rank returns the same status: Save's errors; InvalidArgument for
  // origins that do not fit `whole` (naming the param); Internal when the
  // ranks' params do not cover `whole` exactly once (naming a rank and
  // count). `world` must outlive the engine; WaitForCheckpoint commits it
  // (collective over `world` then).
  virtual absl::Status SaveSlices(const std::string& dir, const std::string& trainer_state,
                                  const ModelSpec& whole,
                                  const std::vector<std::vector<ParamOrigin>>& origins,
                                  Communicator& world, const CheckpointOptions& options) = 0;
  // Waits for the background write of the last Save and makes the
  // checkpoint complete (manifest, rename, `latest`, pruning): its Status is
  // that of the checkpoint, naming the rank whose write failed. OK when no
  // Save is pending. Call it before the engine is destroyed, or the last
  // background checkpoint stays incomplete (never half-visible).
  virtual absl::Status WaitForCheckpoint() = 0;
  // Creates `dir` when missing and checks that every rank sees the same
  // directory there and can write into it: rank 0 writes a probe file with
  // a fresh number, every rank reads it through its own path and creates a
  // file of its own. Call it before training, so that a run whose ranks
  // would save into different directories, or into one they cannot write,
  // fails in seconds rather than at its first save (Save repeats the check
  // each time). Collective, at any time between steps; leaves nothing in
  // `dir`. Every rank returns the same status: FailedPrecondition naming
  // the ranks that see another directory (the remedy: one path on a shared
  // file system), or the cause's code naming the rank that cannot write.
  virtual absl::Status PrepareCheckpointDirectory(const std::string& dir) = 0;
  // The same check over `world` instead of this engine's data-parallel
  // group: every rank of a grid that saves with SaveSlices calls it
  // together (each rank's own check would let the grid's positions, each
  // with its own rank 0, race in the directory, and would miss two
  // positions that see different directories).
  virtual absl::Status PrepareCheckpointDirectory(const std::string& dir, Communicator& world) = 0;
  // Loads a checkpoint (a step directory, or a checkpoint directory's
  // `latest`) written by any world size and any stage, instead of SetParam
  // and before Start. Each rank reads only the byte ranges it owns from the
  // old shard files, verifying their checksums, into fresh buffers, and the
  // engine takes them only when every rank succeeded: a refused checkpoint
  // leaves the engine as it was. Returns the checkpoint's description,
  // including the trainer's state. Errors name the file and the field or
  // byte range: NotFound / FailedPrecondition for a missing or incomplete
  // checkpoint, DataLoss for a checksum mismatch or a truncated file,
  // InvalidArgument for another model (units, names, shapes, trainable
  // flags or ties: they decide what is stored) or an incompatible
  // optimizer. Param groups (lr_scale, weight_decay, no_decay) may differ:
  // the loading model's apply from the next step, and each change is listed
  // in CheckpointInfo::changed_settings.
  virtual absl::StatusOr<CheckpointInfo> Load(const std::string& path) = 0;
  // Load for a model-parallel shard from a checkpoint of the whole model
  // (docs/checkpoint.md, "Loading onto a grid"): each param of this
  // engine's model reads the slice `origins[unit][param]` names (a tied
  // alias's entry is ignored: it is stored with its owner), master and Adam
  // moments alike, reading per param only the span of the checkpoint that
  // holds its slice. Everything else as Load: every rank of this engine's
  // group must load the same checkpoint; the step, LR schedule position and
  // loss scale carry over. InvalidArgument naming the param for an origin
  // that names no param of the checkpoint's model, or whose slice does not
  // fit its shape; or when `origins` does not have one entry per param.
  virtual absl::StatusOr<CheckpointInfo> LoadSlices(
      const std::string& path, const std::vector<std::vector<ParamOrigin>>& origins) = 0;

  // Full fp32 value of a param: the master weights (gathered across ranks
  // when sharded, so every rank must call it together, for the same unit:
  // a rank that asks for another unit fails with FailedPrecondition).
  virtual absl::StatusOr<std::vector<float>> GetParam(int unit, int param) = 0;

  // The specs the engine was created with (copies it owns).
  virtual const ModelSpec& model() const = 0;
  virtual const TrainSpec& train() const = 0;
  // This rank and the group size (the communicator's).
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Step() calls completed, skipped steps included.
  virtual int64_t steps() const = 0;
  // Counters and the time split of the last step and of all steps.
  virtual EngineStats Stats() const = 0;
  // The device's ledger: what the engine allocated, by category.
  virtual const MemoryLedger& ledger() const = 0;
  // The ledger of one memory tier (TrainSpec::offload): kDevice is ledger();
  // kHost the engine's host-tier buffers (offloaded optimizer state and its
  // streaming chunks); kNvme the bytes of this rank's swap files (the
  // tensors' sizes, before rounding to the direct-I/O alignment). Each
  // equals the plan's buffers of that tier (BufferPlan::BytesIn).
  virtual const MemoryLedger& tier_ledger(MemoryTier tier) const = 0;
};

}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_H_
