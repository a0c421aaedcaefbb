// The optimizer phase of the host and NVMe tiers, timed part by part next
// to each part's own limit (perf/runtime/offload_bench.cc says what each
// figure is). It drives the engine's offloaded optimizer (zeroshard::
// OffloadPhase, zeroshard/offload.h) over a synthetic model
// of `params` elements on one rank (stage 1, world 1: the rank owns the
// whole state) with the CPU device.
#ifndef ZEROSHARD_PERF_RUNTIME_OFFLOAD_PHASE_H_
#define ZEROSHARD_PERF_RUNTIME_OFFLOAD_PHASE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::perf {

struct PhaseOptions {
  int64_t params = int64_t{64} << 20;
  int units = 8;
  int64_t chunk = int64_t{1} << 20;  // OffloadSpec::chunk_numel
  int repeats = 3;
  bool host = true;
  bool nvme = true;
  int in_flight = 2;  // the disk measurement's transfers in flight per tensor
  double limit = 1.25;
};

// Median, min and max of seconds.
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread SpreadOf(std::vector<double> v);

struct HostResult {
  Spread phase, adamw, copies, streams;
  int64_t copy_bytes = 0;    // device <-> host, per phase
  int64_t update_bytes = 0;  // what the host AdamW reads + writes, per phase
  Spread ratio, hidden;      // per repeat (paired), then median, min, max
  double adamw_vs_streams = 0;
  std::string describe;
};

struct NvmeResult {
  Spread phase, adamw, io, disk_read, disk_write;
  // The same passes over files without the CRC-32C checks (SwapOptions::
  // verify false), and the checks' cost per repeat (paired):
  // 100 x (verified / unverified - 1).
  Spread disk_read_unverified, disk_write_unverified;
  Spread crc_read_overhead_pct, crc_write_overhead_pct;
  std::string crc_implementation;  // "sse4.2" or "portable"
  int64_t io_bytes = 0;            // read + written per phase
  Spread disk, ratio;              // per repeat: read + write; phase / max(adamw, disk)
  bool pass = false;               // ratio.median <= limit
  std::string describe, io_backend;
};

struct PrecisionResult {
  Precision precision;
  int64_t state_numel = 0;
  int64_t chunk = 0;
  std::optional<HostResult> host;
  std::optional<NvmeResult> nvme;
};

// Builds both tiers' optimizers (as selected) with the swap files in `dir`,
// warms each part once, then times the parts interleaved, `repeats` times.
// Errors: the engine's (plan, swap files, I/O), with the tier named.
absl::StatusOr<PrecisionResult> MeasureOptimizerPhase(const PhaseOptions& opts, Precision precision,
                                                      const std::string& dir);

// `dd` over `bytes` in `dir` (bs = chunk_bytes, direct I/O, the write
// synced): the write, then the read; seconds each, or why it did not run.
struct DdResult {
  bool ran = false;
  double write_s = 0, read_s = 0;
  std::string note;
};
DdResult MeasureDd(const std::string& dir, int64_t bytes, int64_t chunk_bytes);

}  // namespace zeroshard::perf

#endif  // ZEROSHARD_PERF_RUNTIME_OFFLOAD_PHASE_H_
