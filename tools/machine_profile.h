// A machine profile: what `zeroshard calibrate` measured on one machine
// (matrix-product rate, element-wise rates, the engine's optimizer rate, and
// each backend's collectives as latency + bytes / bandwidth), and the
// calibrated step-time model that predicts an engine run from it
// (PredictMlpEngineStep in tools/mlp_step_model.h). docs/estimator.md,
// "Calibrated step time", gives every field and equation.
//
// A command-line helper (zs_tools_machine), not part of the installed API:
// `zeroshard calibrate` writes a profile and `zeroshard estimate --machine`
// reads it. Pure: parsing and formatting only, no measurement (the measuring
// lives in tools/calibrate, which links the engine and BLAS; `zeroshard
// estimate` links neither).
#ifndef ZEROSHARD_TOOLS_MACHINE_PROFILE_H_
#define ZEROSHARD_TOOLS_MACHINE_PROFILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard {

inline constexpr char kMachineProfileSchema[] = "zeroshard.machine.v1";

// One collective on one backend and rank count: t(bytes) = alpha + bytes /
// beta, fitted by least squares over the measured sizes. bytes is
// nccl-tests' buffer: the all-reduce's buffer, the reduce-scatter's input,
// the all-gather's output (the full, unsharded size).
struct CollectiveFit {
  double alpha_s = 0;               // >= 0, seconds
  double beta_bytes_per_s = 0;      // > 0
  std::vector<double> sizes_bytes;  // the measured points (for the record)
  std::vector<double> seconds;      // per collective, slowest rank
  double Seconds(double bytes) const { return alpha_s + bytes / beta_bytes_per_s; }
};

// Per backend ("local", "mpi") and rank count.
struct CollectiveProfile {
  CollectiveFit all_reduce;
  CollectiveFit reduce_scatter;
  CollectiveFit all_gather;
};

struct MachineProfile {
  std::string machine;       // host name
  std::string cpu;           // /proc/cpuinfo's model name, or "unknown"
  std::string date;          // UTC, ISO 8601
  int cores = 0;             // CPUs this process may run on (sched_getaffinity)
  std::string blas;          // the BLAS library and version string
  int threads_per_rank = 1;  // BLAS threads during the measurement (the trainer uses 1)
  // The shapes the matrix products were measured at (the trainer's).
  int64_t calibrated_hidden = 0;
  int64_t calibrated_micro_batch = 0;
  // Matrix products: total FLOPs / total time over the trainer's six sgemm
  // shapes (forward 2, backward 4) at calibrated_hidden / _micro_batch.
  double sgemm_flops_per_s = 0;
  // Element-wise: exact (erf) GELU and its derivative, seconds per element;
  // memcpy of a unit's parameters (4 (8 h^2 + 5 h) bytes), bytes per second
  // (bytes counted once, as memcpy's size argument).
  double gelu_s_per_element = 0;
  double gelu_grad_s_per_element = 0;
  double copy_bytes_per_s = 0;
  // The engine's Step() on one rank, fp32 AdamW with clipping (norm, clip,
  // fused update), seconds per param of the shard it updates.
  double optimizer_s_per_param = 0;
  // collectives[backend][ranks].
  std::map<std::string, std::map<int, CollectiveProfile>> collectives;
  // The offload tier's rates (`zeroshard calibrate --what offload`); 0 when
  // not measured (a profile from before issue 21, or --what without
  // offload). The file's optional "offload" section.
  struct Offload {
    // A gradient chunk to the host and a param chunk back, through the
    // Device's copy (on this CPU build a memcpy between two ledgers), bytes
    // per second, counted once.
    double host_copy_bytes_per_s = 0;
    // Sequential reads and writes of swap files (SwapFiles, the engine's
    // own I/O path: aligned chunks, direct I/O where the filesystem takes
    // it), bytes per second.
    double nvme_read_bytes_per_s = 0;
    double nvme_write_bytes_per_s = 0;
    std::string io_backend;  // SwapFiles' backend that ran: "io_uring" or "threads"
    std::string dir;         // where the swap files were measured
  } offload;
  // The links between ranks (`zeroshard calibrate --backend mpi --what
  // network` under mpirun across nodes): the one-way time of a message
  // between two ranks of one node and between two ranks of two nodes, as
  // alpha + bytes / beta (a fit's beta 0: that pair was not measured; both
  // 0: the file has no "network" section). `zeroshard estimate --network
  // FILE` takes the planner's intra- and inter-node latency and bandwidth
  // from them.
  struct Network {
    int nodes = 0;           // in the job that measured
    int ranks_per_node = 0;  // on its fullest node
    CollectiveFit intra_node;
    CollectiveFit inter_node;
    bool measured() const {
      return intra_node.beta_bytes_per_s > 0 || inter_node.beta_bytes_per_s > 0;
    }
  } network;
};

// Every field has a closed range, in the file's units (docs/estimator.md,
// "The profile"): cores and threads_per_rank integers in [1, 2^20];
// calibrated_shapes.hidden in [1, 2^16] and .micro_batch in [1, 2^20];
// sgemm.gflops, elementwise.copy_gbps and every beta_gbps in [0.001, 10^6];
// elementwise.gelu_ns, .gelu_grad_ns and optimizer.ns_per_param in
// [0.001, 10^6] ns; every alpha_us in [0, 10^6] us; the measured points
// (sizes_bytes in [0, 2^62], seconds in [0, 10^6], paired, at most 4096);
// machine, cpu, date, blas and backend names at most 256 bytes without
// control characters; rank counts in [2, 2^20]; the optional offload
// section's host_copy_gbps, nvme_read_gbps and nvme_write_gbps in
// [0.001, 10^6] when present (absent: 0, not measured); the optional
// network section's nodes and ranks_per_node in [1, 2^20] and each fit
// (intra_node, inter_node: at least one) as a collective's. The ranges hold
// anything a machine measures and keep every predicted time finite.

// Parses a profile written by MachineProfileJson (or by hand). `source`
// names the file in errors. InvalidArgument naming the file, the field, the
// value and its range: "machine.json: field 'optimizer.ns_per_param' is
// 1.7e+308, outside its range [0.001, 1000000] (ns per param); write the
// profile with `zeroshard calibrate` or fix the field"; also for a missing
// field, a value that is not a number and a wrong schema.
absl::StatusOr<MachineProfile> ParseMachineProfile(absl::string_view json,
                                                   absl::string_view source);

// The same ranges for a profile made in code (PredictMlpEngineStep checks
// its profile with it; `zeroshard calibrate` what it measured before it
// writes). InvalidArgument naming the field (as the file spells it), the
// value and the range.
absl::Status ValidateMachineProfile(const MachineProfile& profile);

// The profile as JSON (schema kMachineProfileSchema), units in the field
// names (gflops, ns, gbps = 10^9 bytes/s, us): what `zeroshard calibrate`
// writes and ParseMachineProfile reads back.
std::string MachineProfileJson(const MachineProfile& profile);

}  // namespace zeroshard

#endif  // ZEROSHARD_TOOLS_MACHINE_PROFILE_H_
