// Offload measurements without an engine (docs/offload.md): one rank's
// offloaded optimizer phase, part by part (perf/runtime/offload_bench), and
// the sequential rates of swap files through the engine's NVMe I/O path
// (perf/runtime/offload_bench, `zeroshard calibrate --what offload`).
#ifndef ZEROSHARD_OFFLOAD_H_
#define ZEROSHARD_OFFLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard {

// Parts of the optimizer phase to run (OffloadPhase::Run); the engine's
// Step runs all three.
struct OffloadPhaseParts {
  bool copies = true;  // gradients (and fp32 params) to the host, params back
  bool update = true;  // the host AdamW
  bool io = true;      // the NVMe tier's reads and writes
};

// One rank's offloaded optimizer state for `model` under `train` (world 1,
// train.offload.optimizer host or nvme) on a CPU device, allocated exactly
// as Engine::Create allocates it (PlanEngineBuffers, the tiers, the swap
// files under train.offload.dir), its params, gradients and state filled
// with small non-zero values.
class OffloadPhase {
 public:
  // InvalidArgument for a train spec without offload; the engine's errors
  // otherwise (plan, swap files).
  static absl::StatusOr<std::unique_ptr<OffloadPhase>> Create(const ModelSpec& model,
                                                              const TrainSpec& train);
  virtual ~OffloadPhase() = default;

  // One optimizer phase (an AdamW step at lr 1e-4) with `parts`; returns
  // when it has finished.
  virtual absl::Status Run(const OffloadPhaseParts& parts) = 0;
  virtual const BufferPlan& plan() const = 0;
  // The optimizer state's elements (the rank's flat space).
  virtual int64_t state_numel() const = 0;
  // EngineStats::offload's line.
  virtual std::string Describe() const = 0;
  // What the last Run moved.
  struct Bytes {
    int64_t to_host = 0;    // gradients (and fp32 params), device -> host
    int64_t to_device = 0;  // updated params, host -> device
    int64_t read = 0;       // from the swap files
    int64_t written = 0;    // to the swap files
  };
  virtual Bytes last_bytes() const = 0;
};

// Swap files of the given sizes under `dir` (names "<prefix><i>", rank
// `rank` in the file names), read and written sequentially in chunks of
// `chunk_bytes` (a multiple of 4096), `in_flight` chunks at a time, through
// the engine's NVMe path (direct I/O on io_uring or a thread pool). The
// files are removed when the probe is destroyed. `verify`: with the swap
// files' CRC-32C of every page, computed on write and checked on read, as
// the engine runs them; false leaves them out, the baseline of their cost.
class SwapFileProbe {
 public:
  static absl::StatusOr<std::unique_ptr<SwapFileProbe>> Create(const std::string& dir,
                                                               const std::vector<int64_t>& bytes,
                                                               int64_t chunk_bytes, int in_flight,
                                                               int rank = 0, bool verify = true);
  virtual ~SwapFileProbe() = default;
  // Seconds of one sequential pass over every file (write first: a read
  // then finds written blocks).
  virtual absl::StatusOr<double> Pass(bool write) = 0;
  // The files' bytes on disk (each rounded up to 4096).
  virtual int64_t bytes() const = 0;
  // The I/O path, and why ("io_uring (queue depth 32), O_DIRECT").
  virtual std::string Describe() const = 0;
};

}  // namespace zeroshard

#endif  // ZEROSHARD_OFFLOAD_H_
