// gpt_train: trains a GPT-2-architecture decoder (examples/gpt) on byte-level
// text with a ZeRO stage, on in-process ranks or under mpirun (docs/gpt.md).
//
//   build/examples/gpt/gpt_train --config examples/gpt/configs/gpt2-4l-128.json --ranks 2 --stage 3
//   mpirun -n 4 build/examples/gpt/gpt_train --config cfg.json --backend mpi --steps 200
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/checkpoint_dir_flag.h"
#include "cli/flags.h"
#include "cli/offload_flag.h"
#include "cli/output_file.h"
#include "examples/common/cpu_blas.h"
#include "examples/common/machine_memory.h"
#include "examples/common/median.h"
#include "examples/common/scratch_dir.h"
#include "examples/common/tier_bytes.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_trainer.h"
#include "examples/gpt/grid_trainer.h"
#include "examples/gpt/hf_weights.h"
#include "examples/gpt/text_data.h"
#include "nlohmann/json.hpp"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/process_grid.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace {

struct Options {
  std::string config;
  std::string data;
  double val_fraction = 0.05;
  int backend = 0;  // local, mpi
  int ranks = 1;
  int tp = 1;           // tensor-parallel ranks per model replica
  int pp = 1;           // pipeline stages
  int64_t mem_cap = 0;  // --mem-cap: the planner chooses tp, pp and the stage
  int stage = 0;
  int precision = 0;  // fp32, bf16
  int64_t steps = 100;
  int64_t micro_batch = 4;
  int64_t seq = 128;
  int accum = 1;
  double lr = 1e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup = -1;  // default: steps / 20, at least 1
  double weight_decay = 0.1;
  double clip = 1.0;
  int recompute = 0;  // none, full
  int64_t seed = 1234;
  int64_t val_every = 0;
  int64_t val_windows = 64;
  int prefetch = 2;
  std::string checkpoint_dir;
  int64_t save_every = 0;
  bool resume = false;
  bool overwrite_checkpoints = false;
  std::string dump_batches;
  std::string log_json;
  std::string dump_logits;
  std::string init_from;
  std::string save_init;
  bool quiet = false;
  OffloadSpec offload;  // --offload, --offload-dir, --offload-chunk
};

const char kUsage[] = R"(usage: gpt_train --config FILE [flags]

Trains a GPT-2-architecture decoder (Hugging Face config.json: n_layer, n_head,
n_embd, n_positions, vocab_size, layer_norm_epsilon) on byte-level text through
the zeroshard engine. docs/gpt.md has the details.

  --config FILE          the model's config.json (required)
  --data PATH            text file or directory (default: the Debian package's
                         fortunes, /usr/share/games/fortunes)
  --val-fraction F       the last F of the text is the validation split (0.05)
  --backend local|mpi    in-process ranks (--ranks N) or one rank per process
  --ranks N              local ranks (1)
  --tp N --pp N          a dp x tp x pp grid of the ranks: heads, MLP and vocabulary
                         split over tp, whole units on pp pipeline stages (1F1B),
                         ZeRO over dp = ranks / (tp pp); the tied head stays wte's
                         bits (docs/parallelism.md) (1, 1)
  --mem-cap SIZE         per-rank cap on the engine's buffers (e.g. 64MiB): the
                         planner chooses tp, pp and the ZeRO stage for the ranks
                         (the first that fits: sharding alone, then the fewest
                         model-parallel ranks); activations are not counted
  --stage K              ZeRO stage 0-3 (0)
  --precision fp32|bf16  bf16: bf16 params and grads, fp32 master (fp32)
  --steps S --micro-batch B --seq T --accum A   (100, 4, 128, 1); T <= n_positions
  --lr LR --min-lr-ratio R --warmup W           warm-up + cosine to R x LR (1e-3, 0.1, steps/20)
  --weight-decay WD --clip C                    AdamW decay on the matmul weights; global-norm clip (0.1, 1)
  --recompute none|full  keep every block's activations, or recompute each block in the backward
  --seed S               initial weights (1234); the data order is keyed by it too
  --val-every N --val-windows M                 a validation loss every N steps over M windows (0, 64)
  --prefetch D           stage 3 gathers issued ahead (2)
  --checkpoint-dir DIR --save-every N --resume  sharded checkpoints; resume from DIR's latest
  --overwrite-checkpoints  a new run (no --resume) may save into a --checkpoint-dir
                         that holds checkpoints: they are removed first (else refused)
  --dump-batches FILE    JSONL, per step the global batch's windows (the Hugging Face check)
  --log-json FILE        JSONL, per step: step, loss, lr, grad_norm, val_loss
  --dump-logits FILE     JSON: after training, the logits of the first micro-batch of
                         validation windows (the export check)
  --init-from DIR        initial weights from a Hugging Face GPT-2 directory (its
                         model.safetensors: save_pretrained, zeroshard export --hf)
                         instead of --seed's initialisation
  --save-init DIR        write the initial weights as a Hugging Face directory (new
                         or empty) before the first step
  --offload optimizer=device|host|nvme[,grads=device|host][,params=device|host]
                         the optimizer state (fp32 master, Adam moments) on the
                         device, in host memory (the CPU AdamW) or in swap files;
                         grads=host: a host copy of the gradient shard written in
                         the backward; params=host: stage 3's param shards on the
                         host (docs/offload.md) (device)
  --offload-dir DIR      the nvme tier's swap files (default: a fresh directory
                         under /tmp, removed at the end)
  --offload-chunk N      elements streamed per chunk, a multiple of 1024 (1048576)
  --quiet                no progress lines

A run whose estimate (the planner's engine buffers and the trainer's activations
and workspace, per rank, times the ranks on this machine) exceeds this machine's
memory (MemAvailable) is refused before anything is allocated (exit status 2).
)";

absl::StatusOr<Options> ParseFlags(int argc, char** argv, bool* help) {
  Options o;
  cli::FlagSet flags;
  flags.String("config", &o.config)
      .String("data", &o.data)
      .Number("val-fraction", &o.val_fraction, 0.0, 0.5, /*lo_open=*/true)
      .Choice("backend", {"local", "mpi"}, &o.backend)
      .Int("ranks", &o.ranks, 1, 64)
      .Int("tp", &o.tp, 1, 64)
      .Int("pp", &o.pp, 1, 64)
      .Size("mem-cap", &o.mem_cap)
      .Int("stage", &o.stage, 0, 3)
      .Choice("precision", {"fp32", "bf16"}, &o.precision)
      .Int("steps", &o.steps, 1, cli::kMaxCount)
      .Int("micro-batch", &o.micro_batch, 1, 4096)
      .Int("seq", &o.seq, 1, 1 << 20)
      .Int("accum", &o.accum, 1, 1024)
      .Number("lr", &o.lr, 0.0, 10.0, true)
      .Number("min-lr-ratio", &o.min_lr_ratio, 0.0, 1.0)
      .Int("warmup", &o.warmup, 0, cli::kMaxCount)
      .Number("weight-decay", &o.weight_decay, 0.0, 10.0)
      .Number("clip", &o.clip, 0.0, 1e6)
      .Choice("recompute", {"none", "full"}, &o.recompute)
      .Int("seed", &o.seed, 0, cli::kNoUpperBound)
      .Int("val-every", &o.val_every, 0, cli::kMaxCount)
      .Int("val-windows", &o.val_windows, 1, cli::kMaxCount)
      .Int("prefetch", &o.prefetch, 0, 64)
      .String("checkpoint-dir", &o.checkpoint_dir)
      .Int("save-every", &o.save_every, 0, cli::kMaxCount)
      .Switch("resume", &o.resume)
      .Switch("overwrite-checkpoints", &o.overwrite_checkpoints)
      .String("dump-batches", &o.dump_batches)
      .String("log-json", &o.log_json)
      .String("dump-logits", &o.dump_logits)
      .String("init-from", &o.init_from)
      .String("save-init", &o.save_init)
      .Switch("quiet", &o.quiet);
  cli::AddOffloadFlags(flags, &o.offload);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  if (*help) return o;
  ZS_RETURN_IF_ERROR(cli::CheckOffloadFlags(o.offload));
  if (o.config.empty()) return absl::InvalidArgumentError("give --config FILE (a config.json)");
  if (o.data.empty()) o.data = DefaultCorpusPath();
  if ((o.save_every > 0 || o.resume) && o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--save-every and --resume need --checkpoint-dir DIR");
  }
  if (o.resume && o.overwrite_checkpoints) {
    return absl::InvalidArgumentError(
        "--overwrite-checkpoints removes the checkpoints a --resume run continues from: drop one");
  }
  if (o.resume && (!o.init_from.empty() || !o.save_init.empty())) {
    return absl::InvalidArgumentError(
        "--init-from and --save-init set and write the initial weights; a --resume run has its "
        "checkpoint's: drop them or --resume");
  }
  if (o.mem_cap > 0 && o.tp * o.pp > 1) {
    return absl::InvalidArgumentError(
        "--mem-cap chooses tp and pp itself: drop --tp and --pp, or --mem-cap");
  }
  if (o.tp * o.pp > 1 || o.mem_cap > 0) {
    if (o.backend == 0 && o.ranks % (o.tp * o.pp) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--ranks %d is not a multiple of --tp %d x --pp %d; give ranks = dp x tp x pp", o.ranks,
          o.tp, o.pp));
    }
  }
  if (o.warmup < 0) o.warmup = std::max<int64_t>(1, o.steps / 20);
  if (o.warmup >= o.steps) o.warmup = o.steps - 1;
  return o;
}

TrainSpec MakeTrainSpec(const Options& o) {
  TrainSpec t;
  t.zero_stage = o.stage;
  t.precision = o.precision == 0 ? Precision::kFp32 : Precision::kBf16Mixed;
  t.optimizer.kind = OptimizerKind::kAdamW;
  t.optimizer.lr = o.lr;
  t.optimizer.weight_decay = o.weight_decay;
  t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
  t.schedule.warmup_steps = o.warmup;
  t.schedule.total_steps = o.steps;
  t.schedule.min_lr_ratio = o.min_lr_ratio;
  t.max_grad_norm = o.clip;
  t.grad_accum_steps = o.accum;
  t.prefetch_units = o.prefetch;
  t.offload = o.offload;
  return t;
}

// The trainer's part of a checkpoint: the sampler position, what the data
// order is keyed by, the model's config.json (for `zeroshard export --hf`)
// and its identity (GptModelIdentity: compared on every resume).
std::string TrainerState(const Options& o, const GptConfig& cfg, const TextCorpus& corpus,
                         int64_t consumed) {
  nlohmann::json j = {{"windows_consumed", consumed},
                      {"seq", o.seq},
                      {"data_seed", o.seed},
                      {"train_tokens", corpus.train.size()},
                      {"hf_config", nlohmann::json::parse(cfg.json)},
                      {"model", nlohmann::json::parse(GptModelIdentity(cfg))}};
  return j.dump();
}

// The sampler position a checkpoint's trainer state records, after checking
// that it was written for this data order (--seq, --seed, --data).
absl::StatusOr<int64_t> RestoreTrainerState(const Options& o, const TextCorpus& corpus,
                                            const CheckpointInfo& info) {
  const nlohmann::json j = nlohmann::json::parse(info.trainer_state, nullptr, false);
  if (!j.is_object() || !j.contains("windows_consumed")) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s: its trainer state has no windows_consumed; was it written by gpt_train?",
        info.path));
  }
  const auto expect = [&](const char* key, int64_t mine) -> absl::Status {
    if (j.value(key, int64_t{-1}) != mine) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %s: %s is %s there and %d here; resume with the same --seq, --seed and "
          "--data",
          info.path, key, j.contains(key) ? j[key].dump() : "absent", mine));
    }
    return absl::OkStatus();
  };
  ZS_RETURN_IF_ERROR(expect("seq", o.seq));
  ZS_RETURN_IF_ERROR(expect("data_seed", o.seed));
  ZS_RETURN_IF_ERROR(expect("train_tokens", static_cast<int64_t>(corpus.train.size())));
  return j["windows_consumed"].get<int64_t>();
}

struct SharedRun {
  GptConfig cfg;
  TextCorpus corpus;
};

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Rank 0's record of step `step`: a --log-json line (flushed, so that the
// log can be read as the run goes on) and (without --quiet) a progress line;
// `val` < 0 when no validation loss was taken.
absl::Status ReportStep(const Options& o, int64_t step, double loss, const StepResult& r, double ms,
                        double val, std::optional<cli::OutputFile>& log) {
  if (log.has_value()) {
    nlohmann::json line = {
        {"step", step}, {"loss", loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm}};
    if (val >= 0) line["val_loss"] = val;
    ZS_RETURN_IF_ERROR(log->Write(line.dump() + "\n"));
    ZS_RETURN_IF_ERROR(log->Flush());
  }
  if (!o.quiet) {
    std::fprintf(stderr, "step %5lld/%lld  loss %.5f  lr %.3e  norm %.3f  %.1f ms%s\n",
                 static_cast<long long>(step), static_cast<long long>(o.steps), loss, r.lr,
                 r.grad_norm, ms, val >= 0 ? absl::StrFormat("  val %.5f", val).c_str() : "");
  }
  return absl::OkStatus();
}

// Rank 0's --dump-batches and --log-json files: a new run starts them
// afresh, a --resume run appends to what the run before wrote.
struct RunLogs {
  std::optional<cli::OutputFile> dump;
  std::optional<cli::OutputFile> log;

  absl::Status Open(const Options& o) {
    const cli::OutputFile::Mode mode =
        o.resume ? cli::OutputFile::Mode::kAppend : cli::OutputFile::Mode::kTruncate;
    if (!o.dump_batches.empty()) {
      ZS_ASSIGN_OR_RETURN(dump, cli::OutputFile::Open("--dump-batches", o.dump_batches, mode));
    }
    if (!o.log_json.empty()) {
      ZS_ASSIGN_OR_RETURN(log, cli::OutputFile::Open("--log-json", o.log_json, mode));
    }
    return absl::OkStatus();
  }
  absl::Status Close() {
    if (dump.has_value()) ZS_RETURN_IF_ERROR(dump->Close());
    if (log.has_value()) ZS_RETURN_IF_ERROR(log->Close());
    return absl::OkStatus();
  }
};

// --dump-logits: the logits of the first micro-batch of validation windows
// (`logits_of`, collective), written by `lead`.
absl::Status DumpLogits(
    const Options& o, const SharedRun& run, bool lead,
    const std::function<absl::StatusOr<std::vector<float>>(const std::vector<int32_t>&)>&
        logits_of) {
  std::vector<int32_t> tokens(static_cast<size_t>(o.micro_batch * o.seq));
  std::vector<int32_t> targets(tokens.size());
  if (ValWindows(run.corpus.val, o.seq) < o.micro_batch) {
    return absl::FailedPreconditionError(
        "--dump-logits: the validation split has fewer windows than --micro-batch");
  }
  for (int64_t b = 0; b < o.micro_batch; ++b) {
    FillValWindow(run.corpus.val, o.seq, b, tokens.data() + b * o.seq, targets.data() + b * o.seq);
  }
  ZS_ASSIGN_OR_RETURN(std::vector<float> logits, logits_of(tokens));
  if (!lead) return absl::OkStatus();
  return cli::WriteOutputFile("--dump-logits", o.dump_logits,
                              nlohmann::json({{"batch", o.micro_batch},
                                              {"seq", o.seq},
                                              {"vocab", run.cfg.vocab},
                                              {"tokens", tokens},
                                              {"logits", logits}})
                                      .dump() +
                                  "\n");
}

absl::Status TrainRank(const Options& o, const SharedRun& run, Communicator& comm) {
  const bool lead = comm.rank() == 0;
  std::unique_ptr<Device> device = CreateCpuDevice();
  const ModelSpec spec = BuildGptModelSpec(run.cfg);
  const TrainSpec train = MakeTrainSpec(o);
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(spec, train, *device, comm));
  // The engine's bytes per tier, before the trainer adds its activations.
  ZS_ASSIGN_OR_RETURN(const examples::TierBytes tiers,
                      examples::ReadTierBytes(*engine, comm.size()));
  ZS_ASSIGN_OR_RETURN(WindowSampler sampler, WindowSampler::Create(&run.corpus.train, o.seq,
                                                                   static_cast<uint64_t>(o.seed)));
  GptRunOptions ro;
  ro.micro_batch = o.micro_batch;
  ro.seq = o.seq;
  ro.recompute = o.recompute == 1;
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<GptTrainer> trainer,
                      GptTrainer::Create(run.cfg, ro, *engine, comm, *device, &sampler));
  if (o.resume) {
    ZS_ASSIGN_OR_RETURN(CheckpointInfo info, engine->Load(o.checkpoint_dir));
    ZS_ASSIGN_OR_RETURN(const int64_t consumed, RestoreTrainerState(o, run.corpus, info));
    trainer->set_windows_consumed(consumed);
    if (lead) {
      std::fprintf(stderr,
                   "gpt_train: resumed from %s: step %lld, written by %d rank(s) at ZeRO stage "
                   "%d; %lld windows consumed\n",
                   info.path.c_str(), static_cast<long long>(info.step), info.world_size,
                   info.zero_stage, static_cast<long long>(trainer->windows_consumed()));
      if (!info.changed_settings.empty()) {
        std::fprintf(stderr, "gpt_train: note: this run differs from the one that saved: %s\n",
                     absl::StrJoin(info.changed_settings, ", ").c_str());
      }
    }
  } else if (!o.init_from.empty()) {
    // Its config.json was held to --config's model by Prepare.
    ZS_ASSIGN_OR_RETURN(ParamValues values, ReadHfGpt2Weights(o.init_from, spec));
    ZS_RETURN_IF_ERROR(SetEngineParams(*engine, values));
  } else {
    ZS_RETURN_IF_ERROR(InitGptParams(*engine, run.cfg, static_cast<uint64_t>(o.seed)));
  }
  if (o.save_every > 0) {
    if (lead && !o.resume) {
      ZS_RETURN_IF_ERROR(
          cli::ClearCheckpointDirForNewRun(o.checkpoint_dir, o.overwrite_checkpoints, "gpt_train"));
    }
    ZS_RETURN_IF_ERROR(engine->PrepareCheckpointDirectory(o.checkpoint_dir));
  }
  RunLogs logs;
  if (lead) ZS_RETURN_IF_ERROR(logs.Open(o));
  ZS_RETURN_IF_ERROR(engine->Start(
      {TrainerSetting::Int("micro_batch", o.micro_batch), TrainerSetting::Int("seq", o.seq),
       TrainerSetting::Int("seed", o.seed), TrainerSetting::Int("recompute", o.recompute)}));
  if (!o.save_init.empty()) {
    // GetParam gathers sharded weights: every rank takes part, rank 0 writes.
    ZS_ASSIGN_OR_RETURN(ParamValues values, GetEngineParams(*engine));
    if (lead) ZS_RETURN_IF_ERROR(WriteHfGpt2Dir(o.save_init, spec, values, run.cfg.json));
  }
  std::vector<double> step_ms;
  const absl::Time start = absl::Now();
  const int64_t first = engine->steps();
  double loss = 0.0;
  for (int64_t s = first; s < o.steps; ++s) {
    if (logs.dump.has_value()) {
      nlohmann::json line = {{"step", s + 1}, {"rows", trainer->NextGlobalBatch()}};
      ZS_RETURN_IF_ERROR(logs.dump->Write(line.dump() + "\n"));
    }
    ZS_ASSIGN_OR_RETURN(loss, trainer->TrainStep());
    step_ms.push_back(Ms(engine->Stats().last.total));
    double val = -1.0;
    if (o.val_every > 0 && (s + 1) % o.val_every == 0) {
      ZS_ASSIGN_OR_RETURN(val, trainer->ValLoss(run.corpus.val, o.val_windows));
    }
    if (o.save_every > 0 && engine->steps() % o.save_every == 0) {
      ZS_RETURN_IF_ERROR(engine->Save(
          o.checkpoint_dir, TrainerState(o, run.cfg, run.corpus, trainer->windows_consumed())));
    }
    if (!lead) continue;
    ZS_RETURN_IF_ERROR(
        ReportStep(o, s + 1, loss, trainer->last_step(), step_ms.back(), val, logs.log));
  }
  ZS_RETURN_IF_ERROR(logs.Close());
  ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
  if (!o.dump_logits.empty()) {
    ZS_RETURN_IF_ERROR(DumpLogits(o, run, lead, [&trainer](const std::vector<int32_t>& tokens) {
      return trainer->Logits(tokens);
    }));
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  const EngineStats stats = engine->Stats();
  if (lead) {
    const int64_t steps = std::max<int64_t>(1, stats.steps);
    const double tokens =
        static_cast<double>(stats.steps) * comm.size() * o.accum * o.micro_batch * o.seq;
    const StepTimes& t = stats.totals;
    std::printf("gpt_train: BLAS: %s\n", examples::CpuBlasDescription().c_str());
    std::printf("gpt_train: %lld steps on %d rank(s), ZeRO stage %d, %s, final loss %.5f\n",
                static_cast<long long>(stats.steps), comm.size(), o.stage,
                o.precision == 0 ? "fp32" : "bf16", loss);
    std::printf("  tokens/s %.0f (wall %.2f s); median step %.1f ms\n", tokens / wall, wall,
                examples::Median(step_ms));
    std::printf(
        "  rank 0 per step (ms): compute %.1f, exposed comm %.1f, optimizer %.1f, input wait "
        "%.1f, engine other %.1f, total %.1f\n",
        Ms(t.compute) / steps, Ms(t.exposed_comm) / steps, Ms(t.optimizer) / steps,
        Ms(t.input_wait) / steps, Ms(t.engine_other) / steps, Ms(t.total) / steps);
    const MemoryLedger& ledger = device->ledger();
    std::printf("  rank 0 memory peak (bytes): total %lld;",
                static_cast<long long>(ledger.peak_total()));
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      const auto cat = static_cast<MemoryCategory>(c);
      std::printf(" %s %lld", MemoryCategoryName(cat), static_cast<long long>(ledger.peak(cat)));
    }
    std::printf("\n");
  }
  if (o.offload.enabled()) {
    if (lead) {
      std::printf("  optimizer state on the %s tier%s\n", MemoryTierName(o.offload.optimizer),
                  o.offload.optimizer == MemoryTier::kNvme
                      ? absl::StrFormat(" (swap files in %s)", o.offload.dir).c_str()
                      : "");
      examples::PrintTierBytes(tiers, "rank 0, the engine's buffers", stdout);
    }
  }
  return absl::OkStatus();
}

// One rank of a dp x tp x pp run (GridGptTrainer): the progress lines and
// the summary come from world rank 0, which is on the last stage's tp rank 0
// only when pp = 1; the loss is every rank's (TrainStep all-reduces it).
// --mem-cap: the planner's grid and stage for this model on `world` ranks,
// each position sized by the engine's own buffer plan of its shard
// (BuildGptShardModelSpec), written into `o`; `lead` prints the candidates.
absl::Status ChooseGptGrid(Options* o, const GptConfig& cfg, int world, bool lead) {
  GridOptions options;
  options.shard_spec = [&cfg](int tp, int pp, int pp_rank) {
    return BuildGptShardModelSpec(cfg, GridShape{1, tp, pp}, GridCoord{0, 0, pp_rank});
  };
  absl::StatusOr<GridPlan> plan =
      PlanGrid(BuildGptModelSpec(cfg), MakeTrainSpec(*o), world, o->mem_cap, options);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrFormat("--mem-cap %d bytes on %d ranks: %s", o->mem_cap, world,
                                        plan.status().message()));
  }
  const GridCandidate& chosen = plan->chosen_candidate();
  o->tp = chosen.tp;
  o->pp = chosen.pp;
  o->stage = chosen.stage;
  if (lead) {
    std::fprintf(stderr, "gpt_train: --mem-cap: %s\n", plan->description.c_str());
    for (const GridCandidate& c : plan->candidates) {
      std::fprintf(stderr, "  %-32s %12lld bytes per rank  %s\n", c.Label().c_str(),
                   static_cast<long long>(c.per_rank_bytes), c.reason.c_str());
    }
  }
  return absl::OkStatus();
}

absl::Status GridTrainRank(Options o, const SharedRun& run, Communicator& world) {
  const bool lead = world.rank() == 0;
  if (o.mem_cap > 0) ZS_RETURN_IF_ERROR(ChooseGptGrid(&o, run.cfg, world.size(), lead));
  if (world.size() % (o.tp * o.pp) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d ranks are not a multiple of --tp %d x --pp %d; give ranks = dp x tp x pp", world.size(),
        o.tp, o.pp));
  }
  const GridShape shape{world.size() / (o.tp * o.pp), o.tp, o.pp};
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGrid> grid, ProcessGrid::Create(world, shape));
  std::unique_ptr<Device> device = CreateCpuDevice();
  ZS_ASSIGN_OR_RETURN(const ModelSpec shard, BuildGptShardModelSpec(run.cfg, shape, grid->coord()));
  TrainSpec train = MakeTrainSpec(o);
  train.grad_accum_steps = o.accum * o.tp * o.pp;
  if (train.offload.optimizer == MemoryTier::kNvme && shape.tp * shape.pp > 1) {
    // The swap files are named by dp rank: each (tp, pp) position's engines
    // get a directory of their own under --offload-dir.
    ZS_ASSIGN_OR_RETURN(
        train.offload.dir,
        examples::GridSwapDir(train.offload.dir, grid->coord().tp, grid->coord().pp));
  }
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(shard, train, *device, grid->dp(),
                     ModelParallelOptions{&grid->model_parallel(), grid->coord().tp == 0}));
  int64_t consumed = 0;
  if (o.resume) {
    // Any checkpoint of the whole model: a grid's (any other grid, stage or
    // world size) or a dp-only run's.
    ZS_ASSIGN_OR_RETURN(
        const CheckpointInfo info,
        engine->LoadSlices(o.checkpoint_dir, GptParamOrigins(shard, shape, grid->coord())));
    ZS_ASSIGN_OR_RETURN(consumed, RestoreTrainerState(o, run.corpus, info));
    if (lead) {
      std::fprintf(stderr,
                   "gpt_train: resumed from %s: step %lld, written by %d rank(s) at ZeRO stage "
                   "%d, onto %s; %lld windows consumed\n",
                   info.path.c_str(), static_cast<long long>(info.step), info.world_size,
                   info.zero_stage, shape.ToString().c_str(), static_cast<long long>(consumed));
    }
  } else if (!o.init_from.empty()) {
    // A Hugging Face GPT-2's weights, whole on every rank; each keeps its
    // share (its config.json was held to --config's model by Prepare).
    ZS_ASSIGN_OR_RETURN(const ParamValues values,
                        ReadHfGpt2Weights(o.init_from, BuildGptModelSpec(run.cfg)));
    ZS_RETURN_IF_ERROR(SetGptShardParams(*engine, run.cfg, *grid,
                                         [&values](int u, int p) { return values[u][p]; }));
  } else {
    ZS_RETURN_IF_ERROR(InitGptShardParams(*engine, run.cfg, *grid, static_cast<uint64_t>(o.seed)));
  }
  // Every rank of the grid sees the directory and can write there, checked
  // now rather than at the first save.
  if (o.save_every > 0) {
    if (lead && !o.resume) {
      ZS_RETURN_IF_ERROR(
          cli::ClearCheckpointDirForNewRun(o.checkpoint_dir, o.overwrite_checkpoints, "gpt_train"));
    }
    ZS_RETURN_IF_ERROR(engine->PrepareCheckpointDirectory(o.checkpoint_dir, grid->world()));
  }
  ZS_RETURN_IF_ERROR(
      engine->Start({TrainerSetting::Int("micro_batch", o.micro_batch),
                     TrainerSetting::Int("seq", o.seq), TrainerSetting::Int("seed", o.seed),
                     TrainerSetting::Int("tp", o.tp), TrainerSetting::Int("pp", o.pp)}));
  ZS_ASSIGN_OR_RETURN(WindowSampler sampler, WindowSampler::Create(&run.corpus.train, o.seq,
                                                                   static_cast<uint64_t>(o.seed)));
  GptRunOptions ro;
  ro.micro_batch = o.micro_batch;
  ro.seq = o.seq;
  ro.recompute = o.recompute == 1;
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<GridGptTrainer> trainer,
                      GridGptTrainer::Create(run.cfg, ro, *engine, *grid, &sampler));
  trainer->set_windows_consumed(consumed);
  if (!o.save_init.empty()) {
    // The whole model's weights gathered on every rank (collective), rank 0
    // writes them: BuildGptModelSpec's params in order, the tied head empty.
    ZS_ASSIGN_OR_RETURN(const std::vector<std::vector<float>> flat,
                        GatherGptGridParams(*engine, run.cfg, *grid));
    const ModelSpec whole = BuildGptModelSpec(run.cfg);
    ParamValues values;
    size_t next = 0;
    for (const UnitSpec& unit : whole.units) {
      values.emplace_back();
      for (const ParamSpec& p : unit.params) {
        values.back().push_back(p.tied_to.has_value() ? std::vector<float>() : flat[next++]);
      }
    }
    if (lead) ZS_RETURN_IF_ERROR(WriteHfGpt2Dir(o.save_init, whole, values, run.cfg.json));
  }
  RunLogs logs;
  if (lead) ZS_RETURN_IF_ERROR(logs.Open(o));
  std::vector<double> step_ms;
  const absl::Time start = absl::Now();
  double loss = 0.0;
  const int64_t first = engine->steps();
  for (int64_t s = first; s < o.steps; ++s) {
    if (logs.dump.has_value()) {
      // The global batch: the dp-only run's of the same world and --accum.
      const nlohmann::json line = {
          {"step", s + 1},
          {"rows", WindowRows(sampler, trainer->windows_consumed(),
                              WindowsPerStep(world.size(), o.accum, o.micro_batch))}};
      ZS_RETURN_IF_ERROR(logs.dump->Write(line.dump() + "\n"));
    }
    const absl::Time step_start = absl::Now();
    ZS_ASSIGN_OR_RETURN(loss, trainer->TrainStep());
    step_ms.push_back(Ms(absl::Now() - step_start));
    if (o.save_every > 0 && engine->steps() % o.save_every == 0) {
      // One checkpoint of the whole model, every rank its part.
      ZS_RETURN_IF_ERROR(trainer->Save(
          o.checkpoint_dir, TrainerState(o, run.cfg, run.corpus, trainer->windows_consumed())));
    }
    double val = -1.0;
    if (o.val_every > 0 && (s + 1) % o.val_every == 0) {
      ZS_ASSIGN_OR_RETURN(val, trainer->ValLoss(run.corpus.val, o.val_windows));
    }
    if (!lead) continue;
    ZS_RETURN_IF_ERROR(
        ReportStep(o, s + 1, loss, trainer->last_step(), step_ms.back(), val, logs.log));
  }
  ZS_RETURN_IF_ERROR(logs.Close());
  ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
  if (!o.dump_logits.empty()) {
    ZS_RETURN_IF_ERROR(DumpLogits(o, run, lead, [&trainer](const std::vector<int32_t>& tokens) {
      return trainer->Logits(tokens);
    }));
  }
  if (lead) {
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    const double tokens =
        static_cast<double>(o.steps - first) * world.size() * o.accum * o.micro_batch * o.seq;
    const StepTimes& t = engine->Stats().totals;
    const int64_t steps = std::max<int64_t>(1, o.steps - first);
    std::printf("gpt_train: BLAS: %s\n", examples::CpuBlasDescription().c_str());
    std::printf(
        "gpt_train: %lld steps on %d rank(s) as %s, ZeRO stage %d over dp, %s, final loss %.5f\n",
        static_cast<long long>(o.steps - first), world.size(), shape.ToString().c_str(), o.stage,
        o.precision == 0 ? "fp32" : "bf16", loss);
    std::printf("  tokens/s %.0f (wall %.2f s); median step %.1f ms\n", tokens / wall, wall,
                examples::Median(step_ms));
    std::printf(
        "  rank 0 (stage 0) per step (ms): compute %.1f, exposed comm %.1f, pipeline wait %.1f, "
        "optimizer %.1f, total %.1f\n",
        Ms(t.compute) / steps, Ms(t.exposed_comm) / steps, Ms(t.pipeline_bubble) / steps,
        Ms(t.optimizer) / steps, Ms(t.total) / steps);
  }
  if (lead && o.offload.enabled()) {
    std::printf("  optimizer state on the %s tier%s\n", MemoryTierName(o.offload.optimizer),
                o.offload.optimizer == MemoryTier::kNvme
                    ? absl::StrFormat(" (swap files under %s, a directory per tp x pp position)",
                                      o.offload.dir)
                          .c_str()
                    : "");
  }
  // Every rank's engine buffers (the grid trainer allocates nothing on the
  // device): what the planner sized for --mem-cap.
  const int64_t mine = device->ledger().peak_total();
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  ZS_RETURN_IF_ERROR(world.AllGatherSync(&mine, all.data(), 1, DType::kInt64));
  if (lead) {
    std::printf(
        "  engine buffers, largest over the ranks: %lld bytes%s\n",
        static_cast<long long>(*std::max_element(all.begin(), all.end())),
        o.mem_cap > 0
            ? absl::StrFormat(" (--mem-cap %lld)", static_cast<long long>(o.mem_cap)).c_str()
            : "");
  }
  return absl::OkStatus();
}

absl::Status RunRank(const Options& o, const SharedRun& run, Communicator& comm) {
  if (comm.rank() == 0 && !run.cfg.dropout_ignored.empty()) {
    std::fprintf(stderr,
                 "gpt_train: note: %s asks for dropout (%s); this trainer computes none and "
                 "trains as with 0 (set them to 0.0 to silence this)\n",
                 o.config.c_str(), absl::StrJoin(run.cfg.dropout_ignored, ", ").c_str());
  }
  if (o.tp * o.pp > 1 || o.mem_cap > 0) return GridTrainRank(o, run, comm);
  return TrainRank(o, run, comm);
}

[[noreturn]] void Fail(const absl::Status& status) {
  std::fprintf(stderr, "gpt_train: run failed: %s\n", status.ToString().c_str());
  AbortJob(1);
}

// Before anything is allocated: the run's sizes against the model
// (--seq <= n_positions) and its estimated bytes against the machine. Per
// rank: the engine's planned buffers (PlanEngineBuffers, device and host
// tiers; on a grid the largest pipeline stage's shard, BuildGptShardModelSpec;
// with --mem-cap, not chosen yet, the whole model at stage 3 over every rank:
// the least any choice holds) and the trainer's arrays (GptTrainer::
// PlanBytes; on a grid about 1 / tp of them), times the ranks on this
// machine (`ranks_here`).
absl::Status CheckRunFitsMemory(const Options& o, const GptConfig& cfg, int world, int ranks_here) {
  if (o.seq > cfg.positions) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--seq %d is longer than the model's n_positions %d (%s); give --seq at most %d", o.seq,
        cfg.positions, o.config, cfg.positions));
  }
  GptRunOptions ro;
  ro.micro_batch = o.micro_batch;
  ro.seq = o.seq;
  ro.recompute = o.recompute == 1;
  const ModelSpec whole = BuildGptModelSpec(cfg);
  TrainSpec train = MakeTrainSpec(o);
  absl::StatusOr<GptTrainerBytes> trainer = GptTrainer::PlanBytes(cfg, ro, whole, train.precision);
  if (!trainer.ok()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s; lower --micro-batch, --seq or the config's sizes (or --recompute full)",
        trainer.status().message()));
  }
  double trainer_bytes = static_cast<double>(trainer->total());
  auto memory_bytes = [](const BufferPlan& plan) {
    return static_cast<double>(plan.total_bytes(MemoryTier::kDevice)) +
           static_cast<double>(plan.total_bytes(MemoryTier::kHost));
  };
  double engine_bytes = 0;
  const int positions = o.tp * o.pp;
  if (o.mem_cap > 0) {
    train.zero_stage = 3;
    ZS_ASSIGN_OR_RETURN(const BufferPlan plan, PlanEngineBuffers(whole, train, world));
    engine_bytes = memory_bytes(plan);
  } else if (positions > 1) {
    const GridShape shape{std::max(1, world / positions), o.tp, o.pp};
    train.grad_accum_steps = o.accum * o.tp * o.pp;
    for (int pp_rank = 0; pp_rank < o.pp; ++pp_rank) {
      ZS_ASSIGN_OR_RETURN(const ModelSpec shard,
                          BuildGptShardModelSpec(cfg, shape, GridCoord{0, 0, pp_rank}));
      ZS_ASSIGN_OR_RETURN(const BufferPlan plan, PlanEngineBuffers(shard, train, shape.dp));
      engine_bytes = std::max(engine_bytes, memory_bytes(plan));
    }
    trainer_bytes /= o.tp;
  } else {
    ZS_ASSIGN_OR_RETURN(const BufferPlan plan, PlanEngineBuffers(whole, train, world));
    engine_bytes = memory_bytes(plan);
  }
  return examples::CheckFitsMachine(
      ranks_here * (engine_bytes + trainer_bytes),
      absl::StrFormat("%d rank(s) x (engine buffers %s + activations and workspace %s, micro-batch "
                      "%d x seq %d)",
                      ranks_here, examples::FormatBytes(engine_bytes),
                      examples::FormatBytes(trainer_bytes), o.micro_batch, o.seq),
      examples::ReadMachineMemory(),
      "--micro-batch, --seq, --ranks or the config's n_layer / n_embd / vocab_size (or use "
      "--recompute full, --stage 3, --offload)");
}

// The summary went to stdout: a full disk or a closed pipe there is an
// error too (exit status 1, naming it), not a run that seems to have said
// nothing.
int ReportStandardOutput() {
  const absl::Status out = cli::FlushStandardOutput();
  if (out.ok()) return 0;
  std::fprintf(stderr, "gpt_train: %s\n", std::string(out.message()).c_str());
  return 1;
}

absl::StatusOr<SharedRun> Prepare(const Options& o) {
  SharedRun run;
  ZS_ASSIGN_OR_RETURN(run.cfg, ReadGptConfig(o.config));
  absl::StatusOr<TextCorpus> corpus = LoadTextCorpus(o.data, o.val_fraction);
  if (!corpus.ok()) {
    return absl::Status(
        corpus.status().code(),
        absl::StrFormat("%s (the default corpus is the Debian package %s: "
                        "apt-get install %s, or give --data PATH)",
                        corpus.status().message(), CorpusPackage(), CorpusPackage()));
  }
  run.corpus = std::move(*corpus);
  if (run.cfg.vocab < 256) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: vocab_size %d; byte-level tokens need at least 256", o.config, run.cfg.vocab));
  }
  // Weights from elsewhere belong to this model, or nothing starts: one
  // comparison of identities (GptModelIdentity) for a resume on one rank or
  // on any grid, and for --init-from, before any engine exists.
  if (o.resume) {
    ZS_ASSIGN_OR_RETURN(const CheckpointInfo info, ReadCheckpointInfo(o.checkpoint_dir));
    ZS_ASSIGN_OR_RETURN(const std::string recorded,
                        RecordedGptModelIdentity(info.trainer_state, "checkpoint " + info.path));
    ZS_RETURN_IF_ERROR(CheckSameModel(
        recorded, GptModelIdentity(run.cfg), "checkpoint " + info.path,
        absl::StrFormat("--config %s", o.config),
        "resume with the config.json the run was saved with (zeroshard export --hf writes it "
        "out), or start a new run in another --checkpoint-dir"));
  } else if (!o.init_from.empty()) {
    // The weights file is opened here too, so that a FIFO, a device or a
    // missing file is refused now rather than once every rank has started
    // (the ranks open it again to read it).
    ZS_RETURN_IF_ERROR(OpenHfGpt2Weights(o.init_from).status());
    ZS_RETURN_IF_ERROR(CheckHfGpt2Config(o.init_from, run.cfg, o.config));
  }
  // A new run does not save over another run's checkpoints.
  if (!o.resume && o.save_every > 0) {
    ZS_RETURN_IF_ERROR(cli::CheckNewRunCheckpointDir(o.checkpoint_dir, o.overwrite_checkpoints));
  }
  return run;
}

}  // namespace
}  // namespace gpt
}  // namespace zeroshard

int main(int argc, char** argv) {
  using namespace zeroshard;
  using namespace zeroshard::gpt;
  bool help = false;
  absl::StatusOr<Options> opts = ParseFlags(argc, argv, &help);
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!opts.ok()) {
    std::fprintf(stderr, "gpt_train: %s (see --help)\n",
                 std::string(opts.status().message()).c_str());
    return 2;
  }
  // The BLAS's kernel path was chosen as the program loaded (before any
  // rank's thread runs a product); a path slower than the CPU allows is
  // said at once.
  if (!examples::SetUpCpuBlas().warning.empty()) {
    std::fprintf(stderr, "gpt_train: BLAS: %s\n", examples::CpuBlasDescription().c_str());
  }
  // The nvme tier's swap files: --offload-dir, else a fresh directory
  // removed at the end (one per process: the files are named by rank).
  absl::StatusOr<examples::ScratchDir> swap_dir;
  if (opts->offload.optimizer == MemoryTier::kNvme) {
    swap_dir = examples::ScratchDir::Create(opts->offload.dir, "zs_gpt_train_swap_");
    if (!swap_dir.ok()) {
      std::fprintf(stderr, "gpt_train: %s\n", std::string(swap_dir.status().message()).c_str());
      return 1;
    }
    opts->offload.dir = swap_dir->path();
  }
  absl::StatusOr<SharedRun> run = Prepare(*opts);
  if (!run.ok()) {
    std::fprintf(stderr, "gpt_train: %s\n", std::string(run.status().message()).c_str());
    return 2;
  }
  if (opts->backend == 0) {
    if (absl::Status s = CheckRunFitsMemory(*opts, run->cfg, opts->ranks, opts->ranks); !s.ok()) {
      std::fprintf(stderr, "gpt_train: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    std::fprintf(stderr, "gpt_train: %s; corpus %s (%zu train, %zu validation tokens)\n",
                 opts->config.c_str(), run->corpus.source.c_str(), run->corpus.train.size(),
                 run->corpus.val.size());
    absl::Status s = RunLocalRanks(
        opts->ranks, [&](int, Communicator& comm) { return RunRank(*opts, *run, comm); });
    if (!s.ok()) Fail(s);
    return ReportStandardOutput();
  }
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateMpiCommunicator();
  if (!comm.ok()) Fail(comm.status());
  absl::Status s = CheckRunFitsMemory(*opts, run->cfg, (*comm)->size(),
                                      (*comm)->node_layout().max_ranks_per_node());
  if (s.ok()) s = RunRank(*opts, *run, **comm);
  if (!s.ok())
    Fail(absl::Status(s.code(), absl::StrFormat("rank %d: %s", (*comm)->rank(), s.message())));
  comm->reset();
  FinalizeMpi();
  return ReportStandardOutput();
}
