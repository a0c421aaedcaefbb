// Planner: decides how a model is split across GPUs before anything is
// allocated, and says what every rank will hold.
//
// Pure: sizes only, no Device, no Communicator. For every configuration the
// engine runs today (ZeRO stages 0-3, fp32, bf16 or fp16 mixed, the
// states on the device, host or NVMe tiers the engine accepts, tp = pp = 1)
// a candidate's `buffers` are PlanBuffers() verbatim, so the plan equals the
// engine's ledgers, tier by tier, by construction. Tensor/pipeline splits
// are derived from the same list analytically (docs/memory_model.md gives
// every formula).
#ifndef ZEROSHARD_ESTIMATE_PLANNER_H_
#define ZEROSHARD_ESTIMATE_PLANNER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {

// How much of a layer's activations the backward recomputes instead of
// keeping (Korthikanti et al. 2022).
enum class Recompute {
  kNone,       // keep every activation the backward needs
  kSelective,  // recompute the attention scores (s^2 terms): what flash attention does
  kFull,       // keep only each layer's input; recompute the layer in the backward
};
const char* RecomputeName(Recompute r);  // "none", "selective", "full"
absl::StatusOr<Recompute> ParseRecompute(absl::string_view name);

// Which tensors the activation (and trainer workspace) terms count.
enum class ActivationModel {
  // A Megatron-style layer (Korthikanti et al. 2022): 16-bit activations
  // (fp32 with --precision fp32), dropout masks where the config has
  // dropout, flash attention for selective recomputation; any transformer.
  kKorthikanti,
  // The GPT example's own allocations (examples/gpt; the list is in
  // plan/gpt_example_tensors.h): its fp32 activations and its workspace, by
  // the names and categories its ledger records, so that the estimate is
  // held to its measured peak. A GPT2LMHeadModel with tied embeddings,
  // recompute none or full, tp = pp = 1 and no offload only. The planner
  // adds ClusterSpec::workspace_bytes and reserve_bytes as always (the CLI
  // makes both 0 in this mode unless given: the example's ranks are CPU
  // processes).
  kGptExample,
};
const char* ActivationModelName(ActivationModel m);  // "korthikanti", "gpt-example"
absl::StatusOr<ActivationModel> ParseActivationModel(absl::string_view name);

// One allocation a trainer makes through the engine's Device beside the
// engine's buffers (ActivationModel::kGptExample): the name and category
// its ledger records, and its bytes on one rank.
struct TrainerTensor {
  std::string name;
  MemoryCategory category = MemoryCategory::kActivations;
  int64_t bytes = 0;
};

// Where the model states live (docs/estimator.md, "Offload tiers";
// TrainSpec::offload, docs/offload.md). Every policy the engine accepts is
// what it runs: a tp = pp = 1 candidate's buffers are PlanBuffers verbatim
// with this OffloadSpec, so its device, host and NVMe bytes equal the
// engine's three ledgers.
struct Offload {
  // The fp32 master (mixed precision) and the Adam moments.
  MemoryTier optimizer = MemoryTier::kDevice;  // device | host | nvme
  // host: each unit's reduced gradient shard copied to a host shard during
  // the backward (the device keeps its gradient buffer). Needs the
  // optimizer off the device.
  MemoryTier grads = MemoryTier::kDevice;  // device | host
  // host: stage 3's param shards of the sharded units in host memory,
  // staged to the device per gather. Needs stage 3 and the optimizer off
  // the device.
  MemoryTier params = MemoryTier::kDevice;  // device | host

  // The spellings of the command line (ParseOffload): "none",
  // "optimizer" (= optimizer=host), "optimizer+params" (= optimizer=host,
  // grads=host, params=host).
  static const Offload kNone;
  static const Offload kOptimizer;
  static const Offload kOptimizerNvme;
  static const Offload kOptimizerAndParams;

  bool enabled() const {
    return optimizer != MemoryTier::kDevice || grads != MemoryTier::kDevice ||
           params != MemoryTier::kDevice;
  }
  friend bool operator==(const Offload& a, const Offload& b) {
    return a.optimizer == b.optimizer && a.grads == b.grads && a.params == b.params;
  }
  friend bool operator!=(const Offload& a, const Offload& b) { return !(a == b); }
};
inline const Offload Offload::kNone{};
inline const Offload Offload::kOptimizer{MemoryTier::kHost};
inline const Offload Offload::kOptimizerNvme{MemoryTier::kNvme};
inline const Offload Offload::kOptimizerAndParams{MemoryTier::kHost, MemoryTier::kHost,
                                                  MemoryTier::kHost};
// "none", or the states not on the device: "optimizer=nvme,params=host".
std::string OffloadName(const Offload& o);
// "none", "optimizer", "optimizer+params", or a comma list of state=tier
// with state optimizer (device, host, nvme), grads or params (device,
// host). InvalidArgument naming the unknown key or tier and listing the
// allowed ones, or a key given twice.
absl::StatusOr<Offload> ParseOffload(absl::string_view text);

enum class Placement { kDevice, kHost, kNvme };
const char* PlacementName(Placement p);  // "device", "host", "nvme"

// A closed range [min, max] of a number Planner::Plan accepts. The CLI
// checks its flags against the same constants, so the two cannot disagree.
struct NumberRange {
  double min;
  double max;
  bool Contains(double v) const { return v >= min && v <= max; }  // false for NaN
};

// The ranges of ClusterSpec's and PlanOptions' rates (docs/estimator.md,
// "Limits and overflow"): they keep every time and cost finite.
inline constexpr NumberRange kBandwidthGbpsRange{1e-3, 1e6};  // every *_gbps
inline constexpr NumberRange kPeakTflopsRange{1e-3, 1e6};     // peak_tflops, peak_tflops_fp32
inline constexpr NumberRange kLatencyUsRange{0, 1e6};         // every *_latency_us
inline constexpr NumberRange kMfuRange{1e-3, 1};
inline constexpr NumberRange kCpuAdamGparamsRange{1e-6, 1e6};
inline constexpr double kMaxPricePerGpuHour = 1e6;                           // USD
inline constexpr double kMaxDatasetTokens = 4611686018427387904.0;           // 2^62
inline constexpr NumberRange kPricePerGpuHourRange{0, kMaxPricePerGpuHour};  // 0: not given

// The machines. Bandwidths are per GPU, in GB/s (10^9 bytes/s), as a ring
// collective sees them (bus bandwidth); defaults describe H100 SXM nodes
// with NVLink 4 and one 400 Gb/s NIC per GPU. Planner::Plan accepts
// gpus in [1, 2^20], gpus_per_node in [1, 1024], byte sizes up to 2^62
// (reserve and workspace may be 0), and the rates in the ranges above.
struct ClusterSpec {
  int gpus = 8;
  int gpus_per_node = 8;
  int64_t gpu_mem_bytes = int64_t{80} << 30;
  int64_t host_mem_bytes = int64_t{1} << 40;  // per node
  double intra_node_gbps = 300.0;
  double inter_node_gbps = 45.0;
  double pcie_gbps = 25.0;
  double intra_node_latency_us = 5.0;
  double inter_node_latency_us = 15.0;
  double peak_tflops = 989.0;           // dense bf16/fp16 per GPU
  double peak_tflops_fp32 = 494.0;      // dense TF32 per GPU (fp32 training)
  double mfu = 0.40;                    // fraction of peak the kernels reach
  double comm_overlap = 0.8;            // fraction of data-parallel traffic hidden behind compute
  double cpu_adam_gparams_per_s = 1.0;  // host Adam throughput per GPU's share of cores
  // The NVMe tier, per GPU's share of the node's drives, GB/s: sequential
  // reads and writes of the swap files (`zeroshard calibrate --what
  // offload` measures them). Defaults: a PCIe 4 drive shared by two GPUs.
  double nvme_read_gbps = 3.0;
  double nvme_write_gbps = 1.5;
  int64_t reserve_bytes = int64_t{1} << 30;      // per process: CUDA context, allocator slack
  int64_t workspace_bytes = int64_t{256} << 20;  // cuBLASLt and kernel workspaces
};

struct PlanOptions {
  // The sizes of kBf16Mixed and kFp16Mixed are the same (2-byte params,
  // grads and activations); kFp32 also selects peak_tflops_fp32.
  Precision precision = Precision::kBf16Mixed;
  int64_t seq = 0;  // 0: the model's max positions capped at 4096; 2048 without one
  int64_t micro_batch = 1;
  // Micro-batches per data-parallel rank per step with tp = pp = 1; the
  // global batch (gpus x micro_batch x grad_accum_steps sequences) is the
  // same for every candidate, so a tp x pp candidate runs
  // grad_accum_steps x tp x pp micro-batches per step.
  int grad_accum_steps = 1;
  int num_grad_buffers = 2;  // TrainSpec::num_grad_buffers
  int prefetch_depth = 2;    // stage 3: units gathered ahead (gather buffers)
  Recompute recompute = Recompute::kSelective;
  ActivationModel activations = ActivationModel::kKorthikanti;
  bool sequence_parallel = true;  // with tp > 1
  // Forced choices; -1 / nullopt / 0 mean "automatic".
  int stage = -1;
  std::optional<Offload> offload;
  int tp = 0;
  int pp = 0;
  // Cost report (0: not given). At most kMaxPricePerGpuHour and
  // kMaxDatasetTokens, so every cost is finite.
  double price_per_gpu_hour = 0.0;
  double dataset_tokens = 0.0;
};

struct PlacedBuffer {
  PlannedBuffer buffer;
  Placement placement = Placement::kDevice;
};

// Bytes by what they hold; one GPU (or one rank's share of host memory).
struct MemoryBreakdown {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t master = 0;
  int64_t optimizer = 0;
  int64_t buffers = 0;  // communication buffers: reduce buckets, gather buffers
  int64_t activations = 0;
  int64_t workspace = 0;
  int64_t reserve = 0;

  // The planner checks CheckedTotal() for every breakdown it reports, so
  // these sums of non-negative fields cannot overflow there.
  int64_t model_states() const { return params + grads + master + optimizer; }
  int64_t total() const {
    return params + grads + master + optimizer + buffers + activations + workspace + reserve;
  }
  // total(), or nullopt when the sum does not fit in int64_t.
  std::optional<int64_t> CheckedTotal() const;
};

// Seconds per optimizer step, by cause.
struct StepTime {
  double compute = 0;  // forward + backward (+ recomputation) at mfu
  double bubble = 0;   // pipeline fill and drain: compute x (p - 1) / m
  double dp_comm = 0;  // data-parallel collectives, exposed part
  double tp_comm = 0;  // tensor-parallel all-reduces (not overlapped)
  double pp_comm = 0;  // pipeline sends
  // PCIe copies of gradients and params, the CPU Adam, and on NVMe the
  // swap files' read + write of the optimizer state.
  double offload = 0;
  double total = 0;
};

struct Candidate {
  int stage = 0;
  Offload offload = Offload::kNone;
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int micro_batches = 1;   // per data-parallel rank per step
  int worst_pp_stage = 0;  // the pipeline stage whose GPU needs the most memory
  // True when this configuration runs on today's engine (tp = pp = 1, any
  // offload the engine accepts) and `buffers` is PlanBuffers() verbatim,
  // each buffer placed on its tier.
  bool engine_supported = false;
  // One rank of the worst pipeline stage: every buffer it allocates.
  std::vector<PlacedBuffer> buffers;
  MemoryBreakdown per_gpu;
  MemoryBreakdown per_rank_host;    // this rank's host buffers (pinned)
  MemoryBreakdown per_rank_nvme;    // this rank's swap files (offload optimizer=nvme)
  int64_t per_node_host_bytes = 0;  // gpus_per_node ranks' host buffers
  bool fits = false;
  std::string verdict;  // "fits" or why not: "94.1 GiB per GPU > 80.0 GiB"
  StepTime time;
  double tokens_per_s = 0;
  // Filled when a price or a dataset size is given (else NaN / 0).
  double epoch_s = 0;
  double epoch_cost = 0;
  double scaling_efficiency = 0;  // per-GPU throughput vs the smallest GPU count that fits

  // "stage 2", "stage 3 + offload optimizer", "tp 4 x pp 2, stage 1".
  std::string Label() const;
  // 1: sharding only, 2: offload, 3: tensor/pipeline split.
  int Tier() const;
};

// The automatic choice at another GPU count (the cost report's sweep).
struct ScalePoint {
  int gpus = 0;
  bool fits = false;
  std::string label;
  double step_s = 0;
  double tokens_per_s = 0;
  double epoch_s = 0;
  double epoch_cost = 0;
  double scaling_efficiency = 0;
};

struct Plan {
  std::string model_name;
  // Elements stored (a tied param once), and their split by
  // ParamSpec::trainable: only trainable params have gradients, an fp32
  // master and Adam moments (fine_tuning.h).
  int64_t params = 0;
  int64_t trainable_params = 0;
  int64_t frozen_params = 0;
  int num_units = 0;
  // ActivationModel::kGptExample: the trainer's own allocations on every
  // rank (the same for every candidate); their bytes are in each
  // candidate's per_gpu activations and workspace. Empty otherwise.
  std::vector<TrainerTensor> trainer_tensors;
  ClusterSpec cluster;
  PlanOptions options;                // with seq resolved
  int64_t global_batch = 0;           // sequences per optimizer step
  std::vector<Candidate> candidates;  // in preference order
  int chosen = -1;                    // index into candidates; -1 when nothing fits
  std::string why;                    // one paragraph: why the chosen plan won
  std::vector<std::string> rejected;  // "stage 2: 94.1 GiB per GPU > 80.0 GiB", cheaper first
  std::vector<ScalePoint> scaling;    // filled with a price or a dataset size
  int min_fitting_gpus = 0;           // 0 when unknown or none

  const Candidate* chosen_candidate() const { return chosen >= 0 ? &candidates[chosen] : nullptr; }
};

class Planner {
 public:
  // Every candidate the options allow, each with its per-rank buffers,
  // memory and step time, and the automatic choice: the first that fits of
  // stage 0, 1, 2, 3; then stage 2 and 3 with offload; then, among tensor
  // (within a node, dividing attention and key/value heads) x pipeline
  // (dividing the layers) splits, the fastest that fits. InvalidArgument for
  // impossible inputs (sizes, a forced tp or pp that does not divide, an
  // offload without the stage it needs), for inputs outside the documented
  // ranges, and when a count passes 2^63 (global batch, tokens per step,
  // micro-batches): one line naming the flag or field. A candidate whose
  // bytes would pass 2^63 (it cannot fit: GPU memory is at most 2^62) is
  // left out and named in `rejected`; when no candidate can be sized the
  // first reason is the error. Every reported number is finite and >= 0.
  static absl::StatusOr<zeroshard::Plan> Plan(const ModelDescription& model,
                                              const ClusterSpec& cluster,
                                              const PlanOptions& options);

  // The TrainSpec the engine gets for `stage` under `options` with
  // `micro_batches` per step and the states on `offload`'s tiers
  // (TrainSpec::offload): what PlanBuffers sees.
  static TrainSpec EngineTrainSpec(const PlanOptions& options, int stage, int micro_batches,
                                   const Offload& offload = Offload::kNone);
};

// One way to run a ModelSpec on a dp x tp x pp grid (PlanGrid): ZeRO stage
// `stage` over the dp ranks of each (tp, pp) position, whose shard is
// ShardModelSpec(model, tp, tp_rank, pp, pp_rank), with the optimizer state
// (fp32 master and Adam moments) on `optimizer_tier` (TrainSpec::offload).
struct GridCandidate {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int stage = 0;
  MemoryTier optimizer_tier = MemoryTier::kDevice;
  // Per pipeline stage: the device bytes each of its ranks allocates, the
  // device total of PlanEngineBuffers(shard spec, train at `stage` with
  // grad_accum_steps base accum x tp x pp and offload.optimizer
  // optimizer_tier, dp) — exactly what Engine::Create on that shard puts in
  // the device's ledger. Every tp rank (and dp rank) of a pipeline stage
  // holds the same shapes, so one figure covers every grid position of the
  // stage.
  std::vector<int64_t> stage_bytes;
  int64_t per_rank_bytes = 0;  // max of stage_bytes: the figure compared to the cap
  int worst_pp_stage = 0;      // the first stage with per_rank_bytes
  // The largest per-rank host (pinned) and NVMe bytes over the pipeline
  // stages: the engine's host and NVMe ledgers (Engine::tier_ledger).
  int64_t host_bytes = 0;
  int64_t nvme_bytes = 0;
  bool fits = false;  // per_rank_bytes <= the cap
  // Seconds per optimizer step from GridOptions::step_time; NaN without one.
  double step_seconds = 0;
  // Why it was or was not chosen: "chosen: fastest that fits", "over the
  // cap by 1.2 MiB", "fits, 0.031 s slower than the choice".
  std::string reason;

  int model_parallel_ranks() const { return tp * pp; }
  // "tp 2 x pp 1 x dp 2, stage 1", with ", optimizer on host" (or nvme)
  // when offloaded.
  std::string Label() const;
};

struct GridPlan {
  int world = 1;
  int64_t per_rank_cap_bytes = 0;
  // Every (tp, pp, stage, optimizer tier) with tp x pp dividing world, tp
  // dividing every split dimension, pp <= units and the tier among
  // GridOptions::optimizer_tiers, in preference order: sharding alone first
  // (tp = pp = 1, stages 0-3), then the fewest model-parallel ranks (tp x
  // pp), tp before pp at the same count (a tp group stays inside a node),
  // then the optimizer on the device before the host before NVMe, then the
  // lowest stage.
  std::vector<GridCandidate> candidates;
  int chosen = -1;  // index of the chosen candidate
  // True when the choice is the fastest fit by GridOptions::step_time;
  // false when it is the first fit in preference order (no time model).
  bool by_time = false;
  // "tp 2 x pp 1 x dp 2, stage 1: 3.1 MiB per rank <= cap 4.0 MiB; stages
  // 0-3 alone need >= 5.2 MiB".
  std::string description;

  const GridCandidate& chosen_candidate() const { return candidates[chosen]; }
};

// The predicted seconds per optimizer step of one candidate (its tp, pp,
// dp, stage, optimizer_tier and bytes are filled in). A calibrated model
// lives with its trainer (tools/mlp_step_model.h for the example MLP), so
// PlanGrid takes it as a callback and stays pure. An error is returned by
// PlanGrid, prefixed with the candidate's label.
using GridStepTime = std::function<absl::StatusOr<double>(const GridCandidate&)>;

// The spec one grid position holds, for a model whose split is not
// ShardModelSpec's (a trainer that pads, unties or adds units per position:
// the GPT example's BuildGptShardModelSpec). Called with tp rank 0 (every
// tp rank of a stage holds the same shapes). InvalidArgument means the
// model cannot be split so (tp does not divide its heads, more stages than
// units): PlanGrid leaves that split out; any other error is PlanGrid's.
using GridShardSpec = std::function<absl::StatusOr<ModelSpec>(int tp, int pp, int pp_rank)>;

struct GridOptions {
  // The optimizer tiers to consider beside tp/pp and the stage; kHost and
  // kNvme size the engine's offload buffers (PlanEngineBuffers with
  // TrainSpec::offload.optimizer set; base.offload.chunk_numel applies).
  std::vector<MemoryTier> optimizer_tiers = {MemoryTier::kDevice};
  // When set: every candidate gets step_seconds, and the choice is the
  // fastest that fits (ties go to the earlier in preference order). When
  // empty: the first that fits in preference order.
  GridStepTime step_time;
  // When set: each position's spec (above) instead of ShardModelSpec(model,
  // tp, 0, pp, pp_rank), and a split it refuses is not a candidate.
  GridShardSpec shard_spec;
};

// The planner's tensor/pipeline/offload fallback for a ModelSpec on `world`
// ranks (docs/parallelism.md): sizes every candidate above exactly, by the
// engine's own PlanEngineBuffers, and chooses among those whose largest
// per-rank device need is at most `per_rank_cap_bytes` (the host and NVMe
// bytes are reported, not capped). `base` gives everything but the stage
// and the optimizer tier (precision, accumulation, buffers, prefetch,
// offload chunk; its zero_stage and offload.optimizer are ignored).
// base.grad_accum_steps is the dp-only run's: a tp x pp candidate keeps its
// global batch, so its engines accumulate base.grad_accum_steps x tp x pp
// micro-batches (create them so, or the ledger differs from the plan:
// stages 0-1 stage gradients only when accumulating). Pure: nothing is
// allocated. InvalidArgument for an invalid spec or train spec, world
// outside [1, 2^20], a cap < 1, no tier or a tier outside the enum, or a
// step time that is not finite and >= 0 (naming the candidate); the step
// time's own error, prefixed with the candidate; ResourceExhausted when no
// candidate fits, naming the smallest per-rank need, the candidate that has
// it and the cap (or world) that would fit.
absl::StatusOr<GridPlan> PlanGrid(const ModelSpec& model, const TrainSpec& base, int world,
                                  int64_t per_rank_cap_bytes, const GridOptions& options);
// The device tier alone, in preference order (no time model).
absl::StatusOr<GridPlan> PlanGrid(const ModelSpec& model, const TrainSpec& base, int world,
                                  int64_t per_rank_cap_bytes);

// `base` as the engines of `candidate` run it: its stage, its optimizer
// tier, and base.grad_accum_steps x tp x pp micro-batches per step
// (base.offload.dir is kept: the caller names the NVMe directory).
TrainSpec GridTrainSpec(const TrainSpec& base, const GridCandidate& candidate);

}  // namespace zeroshard

#endif  // ZEROSHARD_ESTIMATE_PLANNER_H_
