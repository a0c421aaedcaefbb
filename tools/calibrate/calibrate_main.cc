// zeroshard-calibrate: `zeroshard calibrate` (the `zeroshard` command runs
// this binary, which sits beside it). Measures this machine for the
// calibrated step-time model and writes a machine profile
// (tools/machine_profile.h; docs/estimator.md, "Calibrated step time").
//
//   zeroshard calibrate --out machine.json                       # compute + local collectives
//   mpirun -np 2 zeroshard calibrate --backend mpi --out machine.json   # adds mpi, 2 ranks
//
// It is a separate binary because it links BLAS, the engine and MPI, which
// `zeroshard estimate` (the planner only) must not need.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "cli/output_file.h"
#include "tools/calibrate/machine_measure.h"
#include "tools/machine_profile.h"
#include "zeroshard/communicator.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/status.h"

namespace zeroshard::tools {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;

struct Options {
  std::string out = "machine.json";
  bool mpi = false;
  std::vector<int> ranks = {2, 4};  // local backend
  bool measure_compute = true;
  bool measure_collectives = true;
  bool measure_offload = false;
  bool measure_network = false;  // mpi only
  std::string offload_dir = ".";
  int64_t offload_bytes = int64_t{256} << 20;
  std::vector<int64_t> sizes = {4096, 65536, 1 << 20, 4 << 20};
  // The network's message sizes: a small one for the latency.
  std::vector<int64_t> network_sizes = {8, 65536, 1 << 20, 4 << 20};
  MeasureShapes shapes;
};

const char kUsage[] =
    R"(usage: zeroshard calibrate [--out FILE] [--backend local|mpi] [--ranks N[,N...]] [--threads T]

Measures this machine for the calibrated step-time model and writes a machine
profile (JSON, docs/estimator.md) that `zeroshard estimate --machine FILE`
predicts with:
  sgemm          cblas_sgemm FLOP/s at the example MLP's shapes, T threads
  elementwise    exact GELU and its derivative (ns per element), a block's memcpy
  optimizer      Engine::Step() on one rank, fp32 AdamW + clipping (ns per param)
  offload        (--what offload) the device-host copy of 4 MiB chunks, and a swap
                 file's sequential write and read through SwapFiles, the engine's
                 NVMe path, in --offload-dir (GB/s; the I/O backend is recorded)
  collectives    all-reduce, reduce-scatter, all-gather on the backend:
                 t = alpha + bytes / beta, fitted over --sizes
  network        (--what network, --backend mpi) the one-way time of a message
                 between two ranks of one node and of two nodes (Send/Recv ping-pong):
                 alpha + bytes / beta per link; `zeroshard estimate --network FILE`
                 takes the planner's intra- and inter-node latency and bandwidth from it
With --backend mpi run it under mpirun (mpirun -np N zeroshard calibrate
--backend mpi --out FILE): it measures the collectives on the N processes and
adds them to FILE, keeping what FILE already holds (measure compute first,
without MPI).

  --out FILE            the profile (default machine.json); an existing valid
                        profile is updated: sections not measured are kept
  --backend B           local (threads, default) or mpi (under mpirun)
  --ranks LIST          local rank counts for the collectives (default 2,4)
  --threads T           BLAS threads while measuring sgemm (default 1, as the trainer)
  --what LIST           compute, collectives, offload, network (default
                        compute,collectives; mpi: collectives)
  --offload-dir DIR     offload: where the swap file is written and read
                        (default the current directory; give a directory on the
                        NVMe drive the run will use)
  --offload-bytes N     offload: the swap file's size (default 268435456)
  --hidden H            the model's hidden size (default 256)
  --blocks B            its residual blocks (default 5)
  --micro-batch M       samples per micro-batch (default 16)
  --sizes LIST          collective sizes in bytes (default 4096,65536,1048576,4194304)
  --min-seconds S       least time per measurement (default 0.3)
)";

absl::StatusOr<Options> ParseArgs(const std::vector<std::string>& args, bool* help) {
  Options o;
  bool what_given = false;
  ZS_ASSIGN_OR_RETURN(const auto flags,
                      cli::ParseFlagMap(args,
                                        {"--out", "--backend", "--ranks", "--sizes", "--threads",
                                         "--what", "--hidden", "--blocks", "--micro-batch",
                                         "--min-seconds", "--offload-dir", "--offload-bytes"},
                                        {"--help", "-h"}, "zeroshard calibrate --help"));
  if (flags.count("--help") != 0 || flags.count("-h") != 0) {
    *help = true;
    return o;
  }
  for (const auto& [name, value] : flags) {
    if (name == "--out") {
      o.out = value;
    } else if (name == "--backend") {
      ZS_ASSIGN_OR_RETURN(const int backend, cli::ParseChoiceFlag(name, value, {"local", "mpi"}));
      o.mpi = backend == 1;
    } else if (name == "--ranks" || name == "--sizes") {
      ZS_ASSIGN_OR_RETURN(const std::vector<int64_t> list,
                          name == "--ranks" ? cli::ParseIntListFlag(name, value, 2, 64)
                                            : cli::ParseIntListFlag(name, value, 16, 1 << 30));
      if (name == "--ranks") {
        o.ranks.assign(list.begin(), list.end());
      } else {
        if (list.size() < 2) return absl::InvalidArgumentError("--sizes: give at least two sizes");
        o.sizes = list;
      }
    } else if (name == "--threads") {
      ZS_ASSIGN_OR_RETURN(const int64_t n, cli::ParseIntFlag(name, value, 1, 1024));
      o.shapes.blas_threads = static_cast<int>(n);
    } else if (name == "--what") {
      what_given = true;
      o.measure_compute = o.measure_collectives = o.measure_offload = o.measure_network = false;
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        ZS_ASSIGN_OR_RETURN(
            const int what,
            cli::ParseChoiceFlag(name, part, {"compute", "collectives", "offload", "network"}));
        (what == 0   ? o.measure_compute
         : what == 1 ? o.measure_collectives
         : what == 2 ? o.measure_offload
                     : o.measure_network) = true;
      }
    } else if (name == "--offload-dir") {
      o.offload_dir = value;
    } else if (name == "--offload-bytes") {
      ZS_ASSIGN_OR_RETURN(o.offload_bytes, cli::ParseIntFlag(name, value, 4096, int64_t{1} << 40));
    } else if (name == "--hidden") {
      ZS_ASSIGN_OR_RETURN(o.shapes.hidden, cli::ParseIntFlag(name, value, 1, 1 << 14));
    } else if (name == "--blocks") {
      ZS_ASSIGN_OR_RETURN(const int64_t n, cli::ParseIntFlag(name, value, 1, 1024));
      o.shapes.blocks = static_cast<int>(n);
    } else if (name == "--micro-batch") {
      ZS_ASSIGN_OR_RETURN(o.shapes.micro_batch, cli::ParseIntFlag(name, value, 1, 1 << 16));
    } else if (name == "--min-seconds") {
      ZS_ASSIGN_OR_RETURN(o.shapes.min_seconds,
                          cli::ParseNumberFlag(name, value, 0, 60, /*lo_open=*/true));
    }
  }
  if (o.mpi && !what_given) o.measure_compute = false;
  if (!o.mpi && o.measure_network) {
    return absl::InvalidArgumentError(
        "--what network measures the links between ranks: run it with --backend mpi under "
        "mpirun, with ranks on two nodes or more for the inter-node link (mpirun --host "
        "a:2,b:2 -np 4 zeroshard calibrate --backend mpi --what network --out FILE)");
  }
  if (o.mpi && o.measure_offload) {
    return absl::InvalidArgumentError(
        "--backend mpi measures collectives and the network only; measure offload without MPI: "
        "`zeroshard calibrate --what offload --out FILE`");
  }
  if (o.mpi && o.measure_compute) {
    return absl::InvalidArgumentError(
        "--backend mpi measures collectives and the network only (the other processes would "
        "share the cores while rank 0 measures compute); run `zeroshard calibrate --what "
        "compute --out FILE` first, then add the mpi collectives");
  }
  return o;
}

void Progress(const std::string& what) {
  std::fprintf(stderr, "zeroshard calibrate: %s\n", what.c_str());
  std::fflush(stderr);
}

// The text of the profile at `path`, or nullopt when there is none. Read as
// `estimate --machine` reads it (ReadTextFile): a FIFO, a device or a file
// over kMaxTextFileBytes is refused at once, not read or replaced.
absl::StatusOr<std::optional<std::string>> ReadExistingText(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path, "the --out profile");
  if (text.status().code() == absl::StatusCode::kNotFound) return std::nullopt;
  if (!text.ok()) return text.status();
  return std::optional<std::string>(*std::move(text));
}

absl::Status MeasureCompute(const Options& o, MachineProfile* p) {
  const MeasureShapes& s = o.shapes;
  p->threads_per_rank = s.blas_threads;
  p->calibrated_hidden = s.hidden;
  p->calibrated_micro_batch = s.micro_batch;
  Progress(absl::StrFormat("[compute 1/4] sgemm, hidden %d, micro-batch %d, %d blocks, %d thread%s",
                           s.hidden, s.micro_batch, s.blocks, s.blas_threads,
                           s.blas_threads == 1 ? "" : "s"));
  p->sgemm_flops_per_s = MeasureSgemmFlopsPerS(s);
  Progress(absl::StrFormat("  %.1f GFLOP/s", p->sgemm_flops_per_s / 1e9));
  Progress("[compute 2/4] GELU and its derivative");
  double gelu[2];
  MeasureGelu(s, gelu);
  p->gelu_s_per_element = gelu[0];
  p->gelu_grad_s_per_element = gelu[1];
  Progress(absl::StrFormat("  %.2f ns, %.2f ns per element", gelu[0] * 1e9, gelu[1] * 1e9));
  Progress("[compute 3/4] memcpy of one block's params");
  p->copy_bytes_per_s = MeasureCopyBytesPerS(s);
  Progress(absl::StrFormat("  %.1f GB/s", p->copy_bytes_per_s / 1e9));
  Progress("[compute 4/4] optimizer: Engine::Step() on 1 rank, fp32 AdamW + clipping");
  ZS_ASSIGN_OR_RETURN(p->optimizer_s_per_param, MeasureOptimizerSPerParam(s));
  Progress(absl::StrFormat("  %.3f ns per param", p->optimizer_s_per_param * 1e9));
  return absl::OkStatus();
}

void PrintFit(const CollectiveProfile& c) {
  const std::pair<const char*, const CollectiveFit*> ops[] = {{"all-reduce", &c.all_reduce},
                                                              {"reduce-scatter", &c.reduce_scatter},
                                                              {"all-gather", &c.all_gather}};
  for (const auto& [name, fit] : ops) {
    Progress(absl::StrFormat("  %-15s alpha %8.1f us  beta %7.2f GB/s", name, fit->alpha_s * 1e6,
                             fit->beta_bytes_per_s / 1e9));
  }
}

absl::Status MeasureLocalCollectives(const Options& o, MachineProfile* p) {
  for (size_t k = 0; k < o.ranks.size(); ++k) {
    const int n = o.ranks[k];
    Progress(absl::StrFormat("[collectives %d/%d] local backend, %d ranks, sizes %s bytes", k + 1,
                             o.ranks.size(), n, absl::StrJoin(o.sizes, ",")));
    CollectiveProfile result;
    ZS_RETURN_IF_ERROR(RunLocalRanks(n, [&](int rank, Communicator& comm) -> absl::Status {
      ZS_ASSIGN_OR_RETURN(CollectiveProfile c,
                          MeasureCollectives(comm, o.sizes, o.shapes.min_seconds / 3));
      if (rank == 0) result = c;
      return absl::OkStatus();
    }));
    PrintFit(result);
    p->collectives["local"][n] = result;
  }
  return absl::OkStatus();
}

absl::Status WriteProfile(const std::string& path, const MachineProfile& p) {
  // What `estimate --machine` would refuse is not written: a measurement
  // outside a field's range means the measurement went wrong.
  if (absl::Status valid = ValidateMachineProfile(p); !valid.ok()) {
    return absl::InternalError(absl::StrFormat(
        "--out %s: not written, the measured profile is out of range: %s; measure again "
        "(with a longer --min-seconds on a busy machine)",
        path, valid.message()));
  }
  // Written whole (each write, the fsync and the close checked) under a
  // temporary name, then renamed: --out is the old profile or the new one.
  const std::string tmp = path + ".tmp";
  if (absl::Status written = cli::WriteOutputFile("--out", tmp, MachineProfileJson(p));
      !written.ok()) {
    std::remove(tmp.c_str());
    return written;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp.c_str());
    return absl::Status(
        absl::ErrnoToStatusCode(error),
        absl::StrFormat("--out %s: cannot rename %s to it: %s", path, tmp, std::strerror(error)));
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& s, int code) {
  std::fprintf(stderr, "zeroshard calibrate: %s\n", std::string(s.message()).c_str());
  return code;
}

int RunLocal(const Options& o, MachineProfile p) {
  DescribeMachine(&p);
  Progress(absl::StrFormat("%s, %s, %d cores, %s", p.machine, p.cpu, p.cores, p.blas));
  if (o.measure_compute) {
    const absl::Status s = MeasureCompute(o, &p);
    if (!s.ok()) return Fail(s, kExitFailed);
  }
  if (o.measure_collectives) {
    const absl::Status s = MeasureLocalCollectives(o, &p);
    if (!s.ok()) return Fail(s, kExitFailed);
  }
  if (o.measure_offload) {
    Progress(absl::StrFormat(
        "[offload] device-host copy of 4 MiB chunks; a %d-byte swap file in %s (write, read)",
        o.offload_bytes, o.offload_dir));
    const absl::Status s =
        MeasureOffloadRates(o.offload_dir, o.offload_bytes, o.shapes.min_seconds, &p.offload);
    if (!s.ok()) return Fail(s, kExitFailed);
    Progress(absl::StrFormat("  host copy %.2f GB/s; NVMe write %.2f GB/s, read %.2f GB/s (%s)",
                             p.offload.host_copy_bytes_per_s / 1e9,
                             p.offload.nvme_write_bytes_per_s / 1e9,
                             p.offload.nvme_read_bytes_per_s / 1e9, p.offload.io_backend));
  }
  const absl::Status s = WriteProfile(o.out, p);
  if (!s.ok()) return Fail(s, kExitBadInput);
  Progress(absl::StrCat("wrote ", o.out));
  return kExitOk;
}

// The two links of a job over nodes: between the first two ranks of the
// first node with two or more, and between the first ranks of nodes 0 and 1.
// A link the job cannot show (one node; one rank per node) keeps what the
// profile held, and says so.
absl::Status MeasureNetwork(const Options& o, Communicator& comm, MachineProfile::Network* net) {
  const NodeLayout layout = comm.node_layout();
  const bool root = comm.rank() == 0;
  if (root) Progress(absl::StrCat("[network] ", layout.Describe()));
  net->nodes = layout.num_nodes();
  net->ranks_per_node = layout.max_ranks_per_node();
  int intra_node = -1;
  for (int node = 0; node < layout.num_nodes() && intra_node < 0; ++node) {
    if (layout.RanksOn(node).size() >= 2) intra_node = node;
  }
  const std::pair<const char*, CollectiveFit*> links[] = {{"intra-node", &net->intra_node},
                                                          {"inter-node", &net->inter_node}};
  for (int k = 0; k < 2; ++k) {
    int a = -1, b = -1;
    if (k == 0 && intra_node >= 0) {
      a = layout.RanksOn(intra_node)[0];
      b = layout.RanksOn(intra_node)[1];
    } else if (k == 1 && layout.num_nodes() >= 2) {
      a = layout.RanksOn(0)[0];
      b = layout.RanksOn(1)[0];
    }
    if (a < 0) {
      if (root) {
        Progress(absl::StrFormat("  %s: not measured (%s); the profile keeps what it had",
                                 links[k].first,
                                 k == 0 ? "no node has two ranks" : "the job runs on one node"));
      }
      continue;
    }
    if (root) {
      Progress(absl::StrFormat("  %s: ranks %d (%s) and %d (%s), sizes %s bytes", links[k].first, a,
                               layout.node_names[layout.node_of_rank[a]], b,
                               layout.node_names[layout.node_of_rank[b]],
                               absl::StrJoin(o.network_sizes, ",")));
    }
    ZS_ASSIGN_OR_RETURN(*links[k].second,
                        MeasurePingPong(comm, a, b, o.network_sizes, o.shapes.min_seconds / 2));
    if (root) {
      Progress(absl::StrFormat("  %s: alpha %.1f us, beta %.3f GB/s", links[k].first,
                               links[k].second->alpha_s * 1e6,
                               links[k].second->beta_bytes_per_s / 1e9));
    }
  }
  if (root && net->measured()) {
    Progress(absl::StrFormat(
        "  the planner takes them with `zeroshard estimate --network %s` (--intra-node-bw, "
        "--intra-node-latency, --inter-node-bw and --inter-node-latency from the profile)",
        o.out));
  }
  return absl::OkStatus();
}

int RunMpi(const Options& o, MachineProfile p) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateMpiCommunicator();
  if (!comm.ok()) return Fail(comm.status(), kExitFailed);
  const int n = (*comm)->size();
  if (n < 2) {
    FinalizeMpi();
    return Fail(absl::InvalidArgumentError(
                    "--backend mpi needs at least 2 processes; run it under mpirun -np N"),
                kExitBadInput);
  }
  const bool root = (*comm)->rank() == 0;
  std::optional<CollectiveProfile> c;
  if (o.measure_collectives) {
    if (root) {
      Progress(absl::StrFormat("[collectives] mpi backend, %d processes, sizes %s bytes", n,
                               absl::StrJoin(o.sizes, ",")));
    }
    absl::StatusOr<CollectiveProfile> measured =
        MeasureCollectives(**comm, o.sizes, o.shapes.min_seconds / 3);
    if (!measured.ok()) {
      Fail(measured.status(), kExitFailed);
      AbortJob(kExitFailed);
    }
    c = *measured;
    if (root) PrintFit(*c);
  }
  if (o.measure_network) {
    const absl::Status s = MeasureNetwork(o, **comm, &p.network);
    if (!s.ok()) {
      Fail(s, kExitFailed);
      AbortJob(kExitFailed);
    }
  }
  int code = kExitOk;
  if (root) {
    // The date becomes this measurement's; the cores stay the compute
    // calibration's: under mpirun this rank's affinity is mpirun's binding
    // (one core at np <= 2), not the machine's.
    const int cores = p.cores;
    DescribeMachine(&p);
    p.cores = cores;
    if (c.has_value()) p.collectives["mpi"][n] = *c;
    const absl::Status s = WriteProfile(o.out, p);
    code = s.ok() ? kExitOk : Fail(s, kExitBadInput);
    if (s.ok() && c.has_value()) {
      Progress(absl::StrCat("added mpi collectives for ", n, " ranks to ", o.out));
    }
    if (s.ok() && o.measure_network) Progress(absl::StrCat("added the network to ", o.out));
  }
  comm->reset();
  FinalizeMpi();
  return code;
}

int Main(const std::vector<std::string>& args) {
  bool help = false;
  absl::StatusOr<Options> o = ParseArgs(args, &help);
  if (help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (!o.ok()) return Fail(o.status(), kExitBadInput);
  absl::StatusOr<std::optional<std::string>> text = ReadExistingText(o->out);
  if (!text.ok()) return Fail(text.status(), kExitBadInput);
  const bool exists = text->has_value();
  const absl::StatusOr<MachineProfile> existing =
      exists ? ParseMachineProfile(**text, o->out)
             : absl::StatusOr<MachineProfile>(MachineProfile{});
  if (!o->measure_compute) {
    // Collectives or offload rates alone are added to a profile that holds
    // the rest.
    if (!exists) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
                      "--out %s does not exist; measuring collectives or offload alone adds them "
                      "to an "
                      "existing profile: run `zeroshard calibrate --out %s` first",
                      o->out, o->out)),
                  kExitBadInput);
    }
    if (!existing.ok()) return Fail(existing.status(), kExitBadInput);
  }
  // A profile that does not parse is replaced when everything is measured.
  MachineProfile base = existing.ok() ? *existing : MachineProfile{};
  return o->mpi ? RunMpi(*o, base) : RunLocal(*o, base);
}

}  // namespace
}  // namespace zeroshard::tools

int main(int argc, char** argv) {
  return zeroshard::tools::Main(std::vector<std::string>(argv + 1, argv + argc));
}
