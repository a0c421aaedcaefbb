#include "examples/mlp/demo_options.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/flags.h"
#include "cli/offload_flag.h"
#include "examples/mlp/model_flags.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {

void PrintUsage(std::FILE* out) {
  const DemoOptions d;
  std::fprintf(
      out,
      "usage: mlp_demo [flags]\n"
      "Trains a residual MLP on N ranks with a ZeRO stage and the one-rank baseline\n"
      "(stage 0, accumulating the same micro-batches), then compares them.\n\n"
      "  --ranks N          local ranks (threads) (default %d; ignored with --backend mpi)\n"
      "  --stage S          ZeRO stage 0, 1, 2 or 3 (default %d)\n"
      "  --steps N          optimizer steps (default %lld)\n"
      "  --precision P      fp32, bf16 or fp16 (fp16: dynamic loss scaling) (default %s)\n"
      "  --accum A          micro-batches per rank per step (default %d)\n"
      "  --prefetch N       stage 3: units all-gathered ahead of use, 0 = on demand\n"
      "                     (default %d)\n"
      "  --zeropp LIST      ZeRO++ options of the distributed run: qwz (stage 3, int8\n"
      "                     param all-gathers), hpz (stage 3, a secondary param copy\n"
      "                     per node; bitwise), qgz8 / qgz4 (stages 2-3, int8 / int4\n"
      "                     gradient reduce-scatters); with qwz or qgz the run is\n"
      "                     compared with the baseline by loss, not bit for bit\n"
      "                     (docs/multinode.md)\n"
      "  --hidden H         hidden size (default %lld)\n"
      "  --blocks B         residual blocks (default %d)\n"
      "  --micro-batch M    samples per micro-batch (default %d)\n"
      "  --lr LR            peak learning rate (default %g)\n"
      "  --weight-decay WD  AdamW weight decay, not on biases (default %g)\n"
      "  --clip C           max global gradient norm, 0 = off (default %g)\n"
      "  --backend B        local (threads) or mpi (one process per rank under mpirun;\n"
      "                     rank 0 prints) (default local)\n"
      "  --device D         cpu, or cuda: the distributed run on GPUs (local: ranks\n"
      "                     as threads on GPU 0; mpi: a GPU per process, nccl), the\n"
      "                     baseline on the CPU (default cpu)\n"
      "  --checkpoint-dir D save checkpoints of the distributed run into D (with\n"
      "                     --save-every) and resume from D/latest (with --resume)\n"
      "  --save-every N     a checkpoint every N steps (background write)\n"
      "  --keep-last K      complete checkpoints kept in D (default 2)\n"
      "  --resume           start from the checkpoint D/latest and train up to --steps\n"
      "  --overwrite-checkpoints  a new run (no --resume) may save into a D that holds\n"
      "                     checkpoints: they are removed first (else refused)\n"
      "  --tp T             tensor-parallel ranks per block (Megatron split of W1/W2)\n"
      "                     (default 1)\n"
      "  --pp P             pipeline stages of whole blocks, 1F1B schedule (default 1);\n"
      "                     with --tp: dp = ranks / (tp * pp), each dp rank runs\n"
      "                     accum x tp x pp micro-batches, the global batch unchanged\n"
      "  --mem-cap SIZE     per-rank byte cap (e.g. 16MiB): the planner chooses tp, pp,\n"
      "                     dp and the ZeRO stage (instead of --tp, --pp, --stage),\n"
      "                     prints them, then trains that grid\n"
      "  --machine PROFILE  with --mem-cap: a `zeroshard calibrate` profile; the planner\n"
      "                     also considers the optimizer on the host and NVMe tiers and\n"
      "                     picks the fastest candidate that fits by its step model\n"
      "                     (--offload-dir: the NVMe tier's directory, if it picks it)\n"
      "  --sync-data        make each micro-batch on the trainer's thread when it is\n"
      "                     needed (all of it input wait: an input-bound run) instead\n"
      "                     of on the data loader's thread, %d micro-batches ahead\n"
      "  --vocab V          a tiny language model over V tokens: embedding, the blocks,\n"
      "                     a head tied to the embedding; cross-entropy against a\n"
      "                     fixed random teacher LM's next token (default: off, the\n"
      "                     regression model)\n"
      "  --lora R           LoRA: blocks' weights and biases frozen (and the embedding\n"
      "                     and head with --vocab), rank-R adapters trained; R at most\n"
      "                     --hidden (the adapted matrices' rank)\n"
      "  --lora-alpha A     LoRA scale alpha / R (default alpha = R: a scale of 1)\n"
      "  --adapter-lr-scale S  the adapters' learning rate is S x the schedule's\n"
      "                     (default 1)\n"
      "  --adapter-weight-decay WD  the adapters' own decoupled weight decay\n"
      "                     (default: --weight-decay)\n"
      "  --recompute        activation checkpointing: the forward keeps each block's\n"
      "                     input only, the backward recomputes the block (same bits)\n"
      "  --comm-timeout S   seconds (or a duration: 90s, 2m) a collective waits for a\n"
      "                     missing rank before the run fails naming it, in [%g, %.0f]\n"
      "                     (default: $%s, else %.0f)\n"
      "%s"
      "  --result-json FILE the distributed run's losses, a fingerprint of its final\n"
      "                     weights and its bytes per memory tier, as JSON\n"
      "  --print-spec       print the model (with --vocab, --lora and the adapter flags)\n"
      "                     as a `zeroshard estimate --spec` JSON file and exit\n"
      "  --help             this text\n"
      "A failed rank prints its error and ends the whole job (exit status 1).\n"
      "A run whose estimated memory (the planner's engine buffers per rank, the\n"
      "trainers' activations and data, the baseline) exceeds this machine's\n"
      "(MemAvailable) is refused before anything is allocated (exit status 2).\n",
      d.ranks, d.stage, static_cast<long long>(d.steps), PrecisionName(d.precision), d.accum,
      d.prefetch, static_cast<long long>(d.model.hidden), d.model.blocks, d.model.micro_batch, d.lr,
      d.weight_decay, d.clip, DataLoaderOptions{}.depth, absl::ToDoubleSeconds(kMinCommTimeout),
      absl::ToDoubleSeconds(kMaxCommTimeout), kCommTimeoutEnvVar,
      absl::ToDoubleSeconds(kDefaultCommTimeout), cli::kOffloadFlagsUsage);
}

DataLoaderOptions MakeDataLoaderOptions(const DemoOptions& opts) {
  DataLoaderOptions data;
  if (opts.sync_data) data.depth = 0;
  return data;
}

CommOptions MakeCommOptions(const DemoOptions& opts) {
  CommOptions options;
  options.timeout = opts.comm_timeout;  // 0: the environment or the default
  return options;
}

TrainSpec MakeTrainSpec(const DemoOptions& opts, int stage, int accum) {
  TrainSpec train;
  train.zero_stage = stage;
  train.precision = opts.precision;
  train.optimizer.kind = OptimizerKind::kAdamW;
  train.optimizer.lr = opts.lr;
  train.optimizer.weight_decay = opts.weight_decay;
  train.schedule.kind = LrSchedule::Kind::kWarmupCosine;
  // 5% of the steps, at least 1, and fewer than the total (the schedule's
  // rule): a one-step run has no warm-up and takes its step at the cosine's
  // end value; from two steps on this is max(1, steps / 20), as it was.
  train.schedule.warmup_steps =
      std::min<int64_t>(std::max<int64_t>(1, opts.steps / 20), opts.steps - 1);
  train.schedule.total_steps = opts.steps;
  train.schedule.min_lr_ratio = 0.1;
  train.max_grad_norm = opts.clip;
  train.grad_accum_steps = accum;
  train.prefetch_units = opts.prefetch;
  // The tier's chunk applies only where the state is offloaded; the chunk
  // is kept for Validate's range check of --offload-chunk.
  train.offload.chunk_numel = opts.offload.chunk_numel;
  return train;
}

// The LM, LoRA and recompute variants run on the CPU data-parallel trainer
// (MlpTrainer) only; the adapter flags need --lora.
absl::Status CheckModelVariantFlags(const DemoOptions& opts) {
  const MlpConfig& m = opts.model;
  if (!m.lora() &&
      (m.lora_alpha != 0.0 || m.adapter_lr_scale != 1.0 || m.adapter_weight_decay.has_value())) {
    return absl::InvalidArgumentError(
        "--lora-alpha, --adapter-lr-scale and --adapter-weight-decay set the LoRA adapters; "
        "give --lora R too");
  }
  const char* variant = m.lm()        ? "--vocab"
                        : m.lora()    ? "--lora"
                        : m.recompute ? "--recompute"
                                      : nullptr;
  if (variant == nullptr) return absl::OkStatus();
  if (UsesGrid(opts)) {
    return absl::InvalidArgumentError(
        absl::StrCat(variant,
                     " runs on the data-parallel trainer only; drop --tp, --pp and --mem-cap (the "
                     "model-parallel grid trains the regression model; issue 23 brings the GPT to "
                     "the grid)"));
  }
  if (opts.device_cuda) {
    return absl::InvalidArgumentError(
        absl::StrCat(variant, " runs on the CPU trainer only; drop --device cuda"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DemoOptions> ParseDemoFlags(int argc, char** argv, bool* help) {
  constexpr double kMaxNumber = 1e30;
  DemoOptions opts;
  int backend = 0, device = 0;
  cli::FlagSet flags;
  AddModelFlags(flags, &opts.model);
  cli::AddOffloadFlags(flags, &opts.offload);
  flags.Int("ranks", &opts.ranks, 1, cli::kMaxCount)
      .Int("stage", &opts.stage, 0, 3)
      .Int("prefetch", &opts.prefetch, 0, cli::kMaxCount)
      .Int("steps", &opts.steps, 1, cli::kMaxCount)
      .Int("accum", &opts.accum, 1, cli::kMaxCount)
      .Number("lr", &opts.lr, 0, kMaxNumber)
      .Number("weight-decay", &opts.weight_decay, 0, kMaxNumber)
      .Number("clip", &opts.clip, 0, kMaxNumber)
      .Int("tp", &opts.tp, 1, cli::kMaxCount)
      .Int("pp", &opts.pp, 1, cli::kMaxCount)
      .Size("mem-cap", &opts.mem_cap)
      .String("machine", &opts.machine)
      .String("checkpoint-dir", &opts.checkpoint_dir)
      .Int("save-every", &opts.save_every, 1, cli::kMaxCount)
      .Int("keep-last", &opts.keep_last, 1, cli::kMaxCount)
      .Switch("resume", &opts.resume)
      .Switch("overwrite-checkpoints", &opts.overwrite_checkpoints)
      .Switch("sync-data", &opts.sync_data)
      .Switch("print-spec", &opts.print_spec)
      .String("result-json", &opts.result_json)
      .Custom("zeropp",
              [&opts](const std::string& v) -> absl::Status {
                opts.zeropp = ZeroPlusPlusSpec{};
                opts.hpz = false;
                for (absl::string_view part : absl::StrSplit(v, ',')) {
                  ZS_ASSIGN_OR_RETURN(
                      const int option,
                      cli::ParseChoiceFlag("--zeropp", part, {"qwz", "hpz", "qgz8", "qgz4"}));
                  if (option == 0) opts.zeropp.quantized_weights = true;
                  if (option == 1) opts.hpz = true;
                  if (option == 2) opts.zeropp.quantized_grad_bits = 8;
                  if (option == 3) opts.zeropp.quantized_grad_bits = 4;
                }
                return absl::OkStatus();
              })
      .Int("vocab", &opts.model.vocab, 2, cli::kMaxCount)
      .Int("lora", &opts.model.lora_rank, 1, cli::kMaxCount)
      .Number("lora-alpha", &opts.model.lora_alpha, 0, kMaxNumber, /*lo_open=*/true)
      .Number("adapter-lr-scale", &opts.model.adapter_lr_scale, 0, kMaxNumber)
      .Custom("adapter-weight-decay",
              [&](const std::string& v) -> absl::Status {
                ZS_ASSIGN_OR_RETURN(
                    opts.model.adapter_weight_decay,
                    cli::ParseNumberFlag("--adapter-weight-decay", v, 0, kMaxNumber));
                return absl::OkStatus();
              })
      .Switch("recompute", &opts.model.recompute)
      .Custom("comm-timeout",
              [&](const std::string& v) -> absl::Status {
                // The rule of ZS_COMM_TIMEOUT, range and units included.
                ZS_ASSIGN_OR_RETURN(opts.comm_timeout, ParseCommTimeout(v, "flag --comm-timeout"));
                return absl::OkStatus();
              })
      .Custom("precision",
              [&](const std::string& v) -> absl::Status {
                absl::StatusOr<Precision> p = ParsePrecision(v);
                if (!p.ok())
                  return cli::ParseChoiceFlag("--precision", v, {"fp32", "bf16", "fp16"}).status();
                opts.precision = *p;
                return absl::OkStatus();
              })
      .Choice("device", {"cpu", "cuda"}, &device)
      .Choice("backend", {"local", "mpi"}, &backend);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  opts.device_cuda = device == 1;
  opts.backend_mpi = backend == 1;
  if (*help) return DemoOptions{};
  if ((opts.save_every > 0 || opts.resume) && opts.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--save-every and --resume need --checkpoint-dir DIR (where checkpoints go)");
  }
  if (opts.resume && opts.overwrite_checkpoints) {
    return absl::InvalidArgumentError(
        "--overwrite-checkpoints removes the checkpoints a --resume run continues from: drop one");
  }
  ZS_RETURN_IF_ERROR(opts.model.Validate());
  ZS_RETURN_IF_ERROR(CheckModelVariantFlags(opts));
  if (!opts.machine.empty() && opts.mem_cap == 0) {
    return absl::InvalidArgumentError(
        "--machine PROFILE times the planner's candidates; give it with --mem-cap SIZE");
  }
  if (UsesGrid(opts) && (opts.zeropp.any() || opts.hpz)) {
    return absl::InvalidArgumentError(
        "--zeropp runs on the data-parallel trainer for now; drop --tp, --pp and --mem-cap (or "
        "--zeropp)");
  }
  if (UsesGrid(opts) && opts.offload.enabled()) {
    return absl::InvalidArgumentError(
        "--offload runs on the data-parallel trainer for now; drop --tp, --pp and --mem-cap (or "
        "--offload); --mem-cap with --machine chooses the optimizer's tier itself");
  }
  if (ChoosesOffload(opts)) {
    // The planner may choose the nvme tier: --offload-dir is its directory.
    OffloadSpec may_swap = opts.offload;
    may_swap.optimizer = MemoryTier::kNvme;
    ZS_RETURN_IF_ERROR(cli::CheckOffloadFlags(may_swap));
  } else {
    ZS_RETURN_IF_ERROR(cli::CheckOffloadFlags(opts.offload));
  }
  if (UsesGrid(opts)) {
    if (opts.mem_cap > 0 && opts.tp * opts.pp > 1) {
      return absl::InvalidArgumentError(
          "--mem-cap lets the planner choose tp and pp; give it without --tp / --pp");
    }
    if (!opts.checkpoint_dir.empty() || opts.device_cuda) {
      return absl::InvalidArgumentError(
          "--tp, --pp and --mem-cap run on the CPU without checkpoints for now; drop "
          "--checkpoint-dir and --device cuda");
    }
    if (opts.model.blocks < opts.pp) {
      return absl::InvalidArgumentError(absl::StrCat("--pp ", opts.pp, " needs at least ", opts.pp,
                                                     " blocks, got --blocks ", opts.model.blocks));
    }
    if (internal::InnerSize(opts.model.hidden) % opts.tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tp ", opts.tp, " must divide the inner width 4 x --hidden = ",
                       internal::InnerSize(opts.model.hidden), " (W1's rows, W2's columns)"));
    }
    if (!opts.backend_mpi && opts.ranks % (opts.tp * opts.pp) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ranks ", opts.ranks, " is not a multiple of --tp x --pp = ", opts.tp * opts.pp));
    }
  }
  // Range checks of the engine's own spec (e.g. the supported stages), so a
  // bad flag is refused before anything runs.
  TrainSpec distributed = MakeTrainSpec(opts, opts.stage, opts.accum);
  distributed.offload = opts.offload;
  distributed.zeropp = opts.zeropp;
  if (opts.hpz) distributed.zeropp.secondary_partition_size = 1;  // its stage rule
  ZS_RETURN_IF_ERROR(distributed.Validate());
  return opts;
}

}  // namespace mlp
}  // namespace zeroshard
