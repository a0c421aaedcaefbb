#include "tools/estimate_command.h"

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/flags.h"
#include "cli/output_file.h"
#include "tools/machine_estimate.h"
#include "tools/machine_profile.h"
#include "zeroshard/estimate/byte_units.h"
#include "zeroshard/estimate/fine_tuning.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/estimate/report.h"
#include "zeroshard/status.h"

namespace zeroshard::tools {
namespace {

// Flags that take a value; the others are switches.
const std::set<std::string>& ValueFlags() {
  static const std::set<std::string>* flags = new std::set<std::string>{"--preset",
                                                                        "--hf-config",
                                                                        "--config",
                                                                        "--spec",
                                                                        "--params",
                                                                        "--gpus",
                                                                        "--gpus-per-node",
                                                                        "--gpu-mem",
                                                                        "--host-mem",
                                                                        "--precision",
                                                                        "--seq",
                                                                        "--micro-batch",
                                                                        "--grad-accum",
                                                                        "--recompute",
                                                                        "--activations",
                                                                        "--stage",
                                                                        "--offload",
                                                                        "--tp",
                                                                        "--pp",
                                                                        "--price",
                                                                        "--tokens",
                                                                        "--svg",
                                                                        "--intra-node-bw",
                                                                        "--inter-node-bw",
                                                                        "--pcie-bw",
                                                                        "--nvme-gbps",
                                                                        "--nvme-read-gbps",
                                                                        "--nvme-write-gbps",
                                                                        "--intra-node-latency",
                                                                        "--inter-node-latency",
                                                                        "--peak-tflops",
                                                                        "--mfu",
                                                                        "--reserve",
                                                                        "--workspace",
                                                                        "--prefetch-depth",
                                                                        "--machine",
                                                                        "--network",
                                                                        "--model",
                                                                        "--hidden",
                                                                        "--blocks",
                                                                        "--backend",
                                                                        "--cpus-per-rank",
                                                                        "--lora"};
  return *flags;
}

const std::set<std::string>& SwitchFlags() {
  static const std::set<std::string>* flags =
      new std::set<std::string>{"--json", "--all", "--help", "-h", "--no-sequence-parallel"};
  return *flags;
}

// The CLI's own limits (docs/estimator.md, "Limits and overflow").
constexpr int64_t kMaxGpus = int64_t{1} << 20;
constexpr int64_t kMaxGpusPerNode = 1024;  // also --tp and --pp
constexpr int64_t kMaxGradAccum = int64_t{1} << 20;
constexpr int64_t kMaxPrefetchDepth = 64;

absl::StatusOr<ModelDescription> LoadModel(const std::map<std::string, std::string>& flags) {
  std::vector<std::string> given;
  for (const char* f : {"--preset", "--hf-config", "--config", "--spec", "--params"}) {
    if (flags.count(f)) given.push_back(f);
  }
  if (given.size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "give exactly one of --preset, --hf-config (or --config), --spec, --params (got %s)",
        given.empty() ? "none" : absl::StrJoin(given, ", ")));
  }
  const std::string& v = flags.at(given[0]);
  if (given[0] == "--preset") return ModelFromPreset(v);
  if (given[0] == "--params") {
    ZS_ASSIGN_OR_RETURN(int64_t n, ParseCount(v, "--params"));
    absl::StatusOr<ModelDescription> model = ModelFromParamCount(n);
    if (!model.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--params: ", model.status().message()));
    }
    return model;
  }
  ZS_ASSIGN_OR_RETURN(std::string text, ReadTextFile(v, absl::StrCat("the ", given[0], " file")));
  // --config is --hf-config by the name the GPT example's docs use.
  if (given[0] == "--hf-config" || given[0] == "--config") return ModelFromHfConfig(text, v);
  return ModelFromSpecJson(text, v);
}

struct Request {
  ModelDescription model;
  ClusterSpec cluster;
  PlanOptions options;
  bool json = false;
  bool all = false;
  std::string svg_path;
  std::string network_line;  // --network: what was taken from the profile
};

// The one flag that may be given more than once.
constexpr char kFreezeFlag[] = "--freeze";

// Takes every `--freeze PATTERN` (or --freeze=PATTERN) out of `args`, in
// order, into `patterns`; the other arguments stay for ParseFlagMap. A value
// of another flag that reads "--freeze" stays that flag's value.
absl::Status ExtractFreezePatterns(std::vector<std::string>& args,
                                   std::vector<std::string>& patterns) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == kFreezeFlag) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError("--freeze needs a value (a param name pattern)");
      }
      patterns.push_back(args[++i]);
    } else if (a.rfind("--freeze=", 0) == 0) {
      patterns.push_back(a.substr(sizeof("--freeze=") - 1));
    } else {
      rest.push_back(a);
      if (ValueFlags().count(a) != 0 && i + 1 < args.size()) rest.push_back(args[++i]);
    }
  }
  for (const std::string& p : patterns) {
    if (p.empty()) return absl::InvalidArgumentError("--freeze: the pattern is empty");
  }
  args = std::move(rest);
  return absl::OkStatus();
}

// --lora R (adapters on a transformer's projections, base frozen), then
// every --freeze pattern, in the order given.
absl::Status ApplyFineTuning(const std::map<std::string, std::string>& flags,
                             const std::vector<std::string>& freeze, ModelDescription& model) {
  auto lora = flags.find("--lora");
  if (lora != flags.end()) {
    ZS_ASSIGN_OR_RETURN(int64_t rank, cli::ParseIntFlag("--lora", lora->second, 1, kMaxLoraRank));
    absl::Status added = AddLoraAdapters(model, rank);
    if (!added.ok()) return absl::InvalidArgumentError(absl::StrCat("--lora: ", added.message()));
  }
  for (const std::string& pattern : freeze) {
    absl::Status frozen = FreezeParams(model.spec, pattern);
    if (!frozen.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--freeze: ", frozen.message()));
    }
  }
  return absl::OkStatus();
}

// --network FILE: the intra- and inter-node latency and bandwidth of a
// machine profile's network section (`zeroshard calibrate --what network`).
// A link the profile measured may not also be given by flags.
absl::Status ApplyNetworkProfile(const std::string& path,
                                 const std::map<std::string, std::string>& flags, ClusterSpec* c,
                                 std::string* line) {
  ZS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "the --network profile"));
  ZS_ASSIGN_OR_RETURN(const MachineProfile profile, ParseMachineProfile(text, path));
  const MachineProfile::Network& net = profile.network;
  if (!net.measured()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--network %s: the profile has no network section; measure it under mpirun across "
        "nodes: `mpirun ... zeroshard calibrate --backend mpi --what network --out %s`",
        path, path));
  }
  struct Link {
    const char* name;
    const CollectiveFit* fit;
    double* gbps;
    double* latency_us;
    const char* bw_flag;
    const char* latency_flag;
  };
  const Link links[] = {{"intra-node", &net.intra_node, &c->intra_node_gbps,
                         &c->intra_node_latency_us, "--intra-node-bw", "--intra-node-latency"},
                        {"inter-node", &net.inter_node, &c->inter_node_gbps,
                         &c->inter_node_latency_us, "--inter-node-bw", "--inter-node-latency"}};
  std::vector<std::string> parts;
  for (const Link& link : links) {
    if (link.fit->beta_bytes_per_s <= 0) {
      parts.push_back(absl::StrFormat("%s not measured (default or flags)", link.name));
      continue;
    }
    for (const char* flag : {link.bw_flag, link.latency_flag}) {
      if (flags.count(flag) != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s and --network %s both set the %s link (the profile measured it); give one", flag,
            path, link.name));
      }
    }
    *link.gbps = link.fit->beta_bytes_per_s / 1e9;
    *link.latency_us = link.fit->alpha_s * 1e6;
    parts.push_back(
        absl::StrFormat("%s %.4g GB/s, %.4g us", link.name, *link.gbps, *link.latency_us));
  }
  *line = absl::StrFormat("network   %s (measured %s on %s: %d node%s, %d rank%s per node)\n",
                          absl::StrJoin(parts, "; "), profile.date, profile.machine, net.nodes,
                          net.nodes == 1 ? "" : "s", net.ranks_per_node,
                          net.ranks_per_node == 1 ? "" : "s");
  return absl::OkStatus();
}

absl::StatusOr<Request> BuildRequest(const std::map<std::string, std::string>& flags,
                                     const std::vector<std::string>& freeze) {
  Request r;
  ZS_ASSIGN_OR_RETURN(r.model, LoadModel(flags));
  ZS_RETURN_IF_ERROR(ApplyFineTuning(flags, freeze, r.model));
  auto get = [&](const char* f) -> const std::string* {
    auto it = flags.find(f);
    return it == flags.end() ? nullptr : &it->second;
  };
  ClusterSpec& c = r.cluster;
  PlanOptions& o = r.options;
  if (auto* v = get("--activations")) {
    ZS_ASSIGN_OR_RETURN(o.activations, ParseActivationModel(*v));
  }
  if (o.activations == ActivationModel::kGptExample) {
    // gpt_train's defaults, so that the same flags describe the same run
    // (the flags below still apply): its ranks are CPU processes (no CUDA
    // context or kernel workspace beside what its ledger records), fp32,
    // no recomputation, and stage 3 gathers 2 units ahead of the one in use
    // (its --prefetch 2: 3 gather buffers).
    c.reserve_bytes = 0;
    c.workspace_bytes = 0;
    o.precision = Precision::kFp32;
    o.recompute = Recompute::kNone;
    o.prefetch_depth = 3;
  }
  if (auto* v = get("--gpus")) {
    ZS_ASSIGN_OR_RETURN(int64_t n,
                        cli::ParseIntFlag("--gpus", *v, 1, kMaxGpus, " (2^20 GPUs at most)"));
    c.gpus = static_cast<int>(n);
  }
  if (auto* v = get("--gpus-per-node")) {
    ZS_ASSIGN_OR_RETURN(int64_t n, cli::ParseIntFlag("--gpus-per-node", *v, 1, kMaxGpusPerNode));
    c.gpus_per_node = static_cast<int>(n);
  } else if (c.gpus < c.gpus_per_node) {
    c.gpus_per_node = c.gpus;
  }
  if (auto* v = get("--gpu-mem")) {
    ZS_ASSIGN_OR_RETURN(c.gpu_mem_bytes, cli::ParseSizeFlag("--gpu-mem", *v));
  }
  if (auto* v = get("--host-mem")) {
    ZS_ASSIGN_OR_RETURN(c.host_mem_bytes, cli::ParseSizeFlag("--host-mem", *v));
  }
  // The planner takes a zero reserve and workspace (a CPU-only estimate).
  if (auto* v = get("--reserve")) {
    ZS_ASSIGN_OR_RETURN(c.reserve_bytes, cli::ParseSizeFlag("--reserve", *v, /*min_bytes=*/0));
  }
  if (auto* v = get("--workspace")) {
    ZS_ASSIGN_OR_RETURN(c.workspace_bytes, cli::ParseSizeFlag("--workspace", *v, /*min_bytes=*/0));
  }
  struct NumberOption {
    const char* flag;
    double* field;
    NumberRange range;
    const char* unit;
  };
  const NumberOption numbers[] = {
      {"--intra-node-bw", &c.intra_node_gbps, kBandwidthGbpsRange, "GB/s per GPU"},
      {"--inter-node-bw", &c.inter_node_gbps, kBandwidthGbpsRange, "GB/s per GPU"},
      {"--pcie-bw", &c.pcie_gbps, kBandwidthGbpsRange, "GB/s per GPU"},
      {"--nvme-read-gbps", &c.nvme_read_gbps, kBandwidthGbpsRange, "GB/s per GPU"},
      {"--nvme-write-gbps", &c.nvme_write_gbps, kBandwidthGbpsRange, "GB/s per GPU"},
      {"--intra-node-latency", &c.intra_node_latency_us, kLatencyUsRange, "us"},
      {"--inter-node-latency", &c.inter_node_latency_us, kLatencyUsRange, "us"},
      {"--peak-tflops", &c.peak_tflops, kPeakTflopsRange, "TFLOPS per GPU"},
      {"--mfu", &c.mfu, kMfuRange, "fraction of peak"},
      {"--price", &o.price_per_gpu_hour, kPricePerGpuHourRange, "USD per GPU-hour"}};
  // --nvme-gbps sets both directions; --nvme-read-gbps and
  // --nvme-write-gbps (below) override one.
  if (auto* v = get("--nvme-gbps")) {
    ZS_ASSIGN_OR_RETURN(
        c.nvme_read_gbps,
        cli::ParseNumberFlag("--nvme-gbps", *v, kBandwidthGbpsRange.min, kBandwidthGbpsRange.max,
                             /*lo_open=*/false, "GB/s per GPU"));
    c.nvme_write_gbps = c.nvme_read_gbps;
  }
  if (auto* v = get("--network")) {
    ZS_RETURN_IF_ERROR(ApplyNetworkProfile(*v, flags, &c, &r.network_line));
  }
  for (const NumberOption& n : numbers) {
    if (auto* v = get(n.flag)) {
      ZS_ASSIGN_OR_RETURN(*n.field, cli::ParseNumberFlag(n.flag, *v, n.range.min, n.range.max,
                                                         /*lo_open=*/false, n.unit));
    }
  }
  if (get("--peak-tflops")) c.peak_tflops_fp32 = c.peak_tflops;

  if (auto* v = get("--tokens")) {
    ZS_ASSIGN_OR_RETURN(int64_t tokens, ParseCount(*v, "--tokens"));
    o.dataset_tokens = static_cast<double>(tokens);
  }
  if (auto* v = get("--precision")) {
    absl::StatusOr<Precision> precision = ParsePrecision(*v);
    if (!precision.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--precision: ", precision.status().message()));
    }
    o.precision = *precision;
  }
  if (auto* v = get("--seq")) {
    ZS_ASSIGN_OR_RETURN(o.seq, cli::ParseIntFlag("--seq", *v, 1, cli::kNoUpperBound));
  }
  if (auto* v = get("--micro-batch")) {
    ZS_ASSIGN_OR_RETURN(o.micro_batch,
                        cli::ParseIntFlag("--micro-batch", *v, 1, cli::kNoUpperBound));
  }
  if (auto* v = get("--grad-accum")) {
    ZS_ASSIGN_OR_RETURN(int64_t n, cli::ParseIntFlag("--grad-accum", *v, 1, kMaxGradAccum));
    o.grad_accum_steps = static_cast<int>(n);
  }
  if (auto* v = get("--prefetch-depth")) {
    ZS_ASSIGN_OR_RETURN(int64_t n, cli::ParseIntFlag("--prefetch-depth", *v, 1, kMaxPrefetchDepth));
    o.prefetch_depth = static_cast<int>(n);
  }
  if (auto* v = get("--recompute")) {
    ZS_ASSIGN_OR_RETURN(o.recompute, ParseRecompute(*v));
  }
  if (get("--no-sequence-parallel")) o.sequence_parallel = false;
  if (auto* v = get("--stage")) {
    if (*v == "auto") {
      o.stage = -1;
    } else if (*v == "0" || *v == "1" || *v == "2" || *v == "3") {
      o.stage = (*v)[0] - '0';
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("--stage: '%s' is not one of auto, 0, 1, 2, 3", *v));
    }
  }
  if (auto* v = get("--offload")) {
    ZS_ASSIGN_OR_RETURN(Offload off, ParseOffload(*v));
    o.offload = off;
  }
  for (const char* f : {"--tp", "--pp"}) {
    if (auto* v = get(f)) {
      ZS_ASSIGN_OR_RETURN(int64_t n, cli::ParseIntFlag(f, *v, 1, kMaxGpusPerNode));
      (f[2] == 't' ? o.tp : o.pp) = static_cast<int>(n);
    }
  }
  r.json = get("--json") != nullptr;
  r.all = get("--all") != nullptr;
  if (auto* v = get("--svg")) r.svg_path = *v;
  return r;
}

}  // namespace

std::string EstimateUsage() {
  return R"(usage: zeroshard estimate MODEL [CLUSTER] [TRAINING] [CHOICE] [OUTPUT]

Plans per-GPU and per-host memory for training MODEL on CLUSTER and picks the
configuration that fits with the least communication: ZeRO stage 0, 1, 2, 3,
then offload, then tensor x pipeline splits.

MODEL (exactly one):
  --preset NAME          built-in model: )" +
         absl::StrJoin(PresetNames(), ", ") + R"(
  --hf-config FILE       Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2, GPT-2)
  --config FILE          the same as --hf-config (e.g. the GPT example's config.json)
  --spec FILE            JSON spec of units and params (docs/estimator.md)
  --params N             a bare parameter count (one unit), e.g. 7.5e9 or 7.5B
FINE-TUNING (frozen params have no gradients, fp32 master or Adam moments):
  --lora R               LoRA adapters of rank R on the attention and MLP projections of a
                         --preset or --hf-config model; every base weight is frozen
  --freeze PATTERN       freeze the params PATTERN names (repeatable): a glob over
                         unit.param names (* any run, dots too; ? one character) that
                         also matches everything below it, e.g. embed, 'layers.*.mlp.*';
                         a pattern that matches nothing is an error
CLUSTER:
  --gpus N               GPUs in total (default 8)
  --gpus-per-node G      GPUs per node (default 8, or --gpus when fewer)
  --gpu-mem SIZE         memory per GPU, e.g. 80GiB (default 80GiB; GB = 10^9 bytes)
  --host-mem SIZE        host memory per node (default 1TiB)
  --intra-node-bw GBPS   NVLink bus bandwidth per GPU, GB/s (default 300)
  --inter-node-bw GBPS   network bandwidth per GPU, GB/s (default 45)
  --pcie-bw GBPS         host<->GPU bandwidth, GB/s (default 25)
  --nvme-read-gbps R, --nvme-write-gbps W   the NVMe tier's sequential rates per
                         GPU's share of the drives, GB/s (default 3, 1.5; range
                         0.001-10^6); --nvme-gbps B sets both
  --intra-node-latency US, --inter-node-latency US   per ring step (default 5, 15)
  --network FILE         the four above for the links a machine profile measured
                         (`zeroshard calibrate --backend mpi --what network` under
                         mpirun across nodes): bandwidth = the link's beta, latency
                         = its alpha
  --peak-tflops T        dense peak per GPU (default 989 bf16/fp16, 494 fp32)
  --mfu F                fraction of peak the kernels reach (default 0.4)
  --reserve SIZE         per-process reserve on the GPU (default 1GiB)
  --workspace SIZE       kernel workspace on the GPU (default 256MiB)
TRAINING:
  --precision P          fp32 | bf16 | fp16 (default bf16; 16-bit ones keep fp32 master weights)
  --seq S                sequence length (default: the model's max positions up to 4096, else 2048)
  --micro-batch B        sequences per micro-batch (default 1)
  --grad-accum M         micro-batches per GPU per step (default 1)
  --recompute R          none | selective | full (default selective)
  --activations A        which tensors the activations count: korthikanti (default; a
                         Megatron-style layer, Korthikanti et al. 2022) or gpt-example (the
                         GPT example's own fp32 tensors and workspace, as its ledger records
                         them; tp = pp = 1, no offload; defaults are gpt_train's: fp32,
                         recompute none, prefetch depth 3, --reserve and --workspace 0)
  --no-sequence-parallel with tensor parallelism, keep activations replicated
  --prefetch-depth D     stage 3 gather buffers (default 2; never more than the sharded units)
CHOICE:
  --stage S              auto | 0 | 1 | 2 | 3 (default auto)
  --offload O            none, or state=tier pairs: optimizer=device|host|nvme,
                         grads=device|host, params=device|host, e.g.
                         optimizer=nvme,params=host; aliases: optimizer
                         (=optimizer=host), optimizer+params (=optimizer, grads
                         and params on the host) (default: automatic). The
                         engine runs the optimizer tiers; grads and params on
                         the host are estimates only
  --tp T --pp P          force a tensor x pipeline split
COST:
  --price USD            price per GPU-hour
  --tokens N             dataset size in tokens (one epoch), e.g. 2e12 or 300B
OUTPUT:
  --json                 JSON instead of the table (schema in docs/estimator.md)
  --svg FILE             also write a stacked bar chart of the per-GPU bytes
  --all                  list every candidate, not only the relevant ones
CALIBRATED STEP TIME (an engine run on this machine; `zeroshard calibrate` writes PROFILE):
  --machine PROFILE --model mlp [--hidden H] [--blocks B] [--micro-batch M] [--gpus RANKS]
                         [--stage S] [--backend local|mpi] [--cpus-per-rank K] [--json]
                         predicted ms per step of the example residual MLP (default 256 x 5,
                         micro-batch 16), by part, for each stage (or --stage S)
  --cpus-per-rank K      CPUs each rank's threads may run on: 0 (default) not bound, all cores
                         shared; mpirun binds a rank to 1 core at np <= 2 (--bind-to none: 0)

Exit codes: 0 a configuration fits, 1 none fits, 2 bad input.
)";
}

int RunEstimate(const std::vector<std::string>& all_args, std::ostream& out, std::ostream& err) {
  std::vector<std::string> args = all_args;
  std::vector<std::string> freeze;
  if (absl::Status s = ExtractFreezePatterns(args, freeze); !s.ok()) {
    err << "zeroshard estimate: " << s.message() << "\n";
    return kExitBadInput;
  }
  auto flags = cli::ParseFlagMap(args, ValueFlags(), SwitchFlags(), "zeroshard estimate --help");
  if (!flags.ok()) {
    err << "zeroshard estimate: " << flags.status().message() << "\n";
    return kExitBadInput;
  }
  if (flags->count("--help") || flags->count("-h")) {
    out << EstimateUsage();
    return kExitOk;
  }
  if (flags->count("--machine")) {
    if (flags->count("--lora") || !freeze.empty()) {
      err << "zeroshard estimate: --lora and --freeze apply to the memory plan, not to --machine "
             "(the calibrated step time of the example MLP)\n";
      return kExitBadInput;
    }
    return RunMachineEstimate(*flags, out, err);
  }
  for (const char* f : kMachineFlags) {
    if (flags->count(f)) {
      err << "zeroshard estimate: " << f << " needs --machine PROFILE (the calibrated step time)\n";
      return kExitBadInput;
    }
  }
  auto request = BuildRequest(*flags, freeze);
  if (!request.ok()) {
    err << "zeroshard estimate: " << request.status().message() << "\n";
    return kExitBadInput;
  }
  auto plan = Planner::Plan(request->model, request->cluster, request->options);
  if (!plan.ok()) {
    err << "zeroshard estimate: " << plan.status().message() << "\n";
    return kExitBadInput;
  }
  if (!request->svg_path.empty()) {
    const absl::Status written =
        cli::WriteOutputFile("--svg", request->svg_path, FormatSvg(*plan, request->all));
    if (!written.ok()) {
      err << "zeroshard estimate: " << written.message() << "\n";
      return kExitBadInput;
    }
  }
  if (!request->json) out << request->network_line;
  out << (request->json ? FormatJson(*plan, request->all) : FormatTable(*plan, request->all));
  return plan->chosen >= 0 ? kExitOk : kExitNoFit;
}

}  // namespace zeroshard::tools
