// The measurements of `zeroshard calibrate` (tools/calibrate/calibrate_main.cc):
// each returns one field group of a MachineProfile (tools/machine_profile.h).
// They link BLAS and the engine; the planner, which reads the profile, links
// neither.
#ifndef ZEROSHARD_TOOLS_CALIBRATE_MACHINE_MEASURE_H_
#define ZEROSHARD_TOOLS_CALIBRATE_MACHINE_MEASURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/machine_profile.h"
#include "zeroshard/communicator.h"

namespace zeroshard::tools {

// The shapes measured: the example MLP's (examples/mlp), and how long each
// measurement runs at least.
struct MeasureShapes {
  int64_t hidden = 256;
  int blocks = 5;
  int64_t micro_batch = 16;
  int blas_threads = 1;
  double min_seconds = 0.3;  // per measurement; more repetitions when faster
};

// Host name, CPU model, cores this process may use, UTC date, BLAS build.
void DescribeMachine(MachineProfile* profile);

// cblas_sgemm over the trainer's six shapes (forward 2, backward 4), cycling
// over `blocks` weight sets as a step does: FLOP/s (total FLOPs / time).
double MeasureSgemmFlopsPerS(const MeasureShapes& s);

// Exact (erf) GELU and its derivative over the trainer's pre-activations
// (blocks x micro_batch x 4 hidden floats): seconds per element, in
// gelu[0] and gelu[1].
void MeasureGelu(const MeasureShapes& s, double gelu[2]);

// memcpy of one block's params (4 (8 h^2 + 5 h) bytes), cycling over
// `blocks` buffers: bytes per second (counted once).
double MeasureCopyBytesPerS(const MeasureShapes& s);

// Engine::Step() of a one-rank engine over the MLP's ModelSpec (fp32,
// AdamW, clipping at 2.0): the optimizer time of Engine::Stats() per step
// and param. Errors: the engine's.
absl::StatusOr<double> MeasureOptimizerSPerParam(const MeasureShapes& s);

// The three collectives on `comm` (every rank calls it), each size of
// `sizes` (nccl-tests bytes, fp32), issued and waited one at a time as the
// engine does per unit, repeated for min_seconds; the slowest rank's mean
// time, fitted to alpha + bytes / beta. Errors: the communicator's.
absl::StatusOr<CollectiveProfile> MeasureCollectives(Communicator& comm,
                                                     const std::vector<int64_t>& sizes,
                                                     double min_seconds);

// The offload tier's rates (MachineProfile::Offload), into `rates`:
//   host copy  a gradient chunk to the host and a param chunk back as the
//              engine streams them (OffloadSpec::chunk_numel fp32 elements,
//              4 MiB), through the CPU Device's CopyAsync (this build's
//              device-host copy), bytes per second;
//   NVMe       one swap file of `nvme_bytes` in `dir` through SwapFiles,
//              the engine's I/O path (io_uring or its thread pool, O_DIRECT
//              where the file system takes it), written then read once,
//              sequentially in 4 MiB chunks, two in flight
//              (MeasureSequentialSeconds), bytes per second. The file is
//              removed at the end. `rates.io_backend` is SwapFiles'
//              describe(): which backend ran and why.
// Errors: SwapFiles' (the directory missing or full, named), the device's.
// The one-way time of a message between ranks `a` and `b` of `comm` (a
// ping-pong of Send and Recv, halved), at each of `sizes` bytes, repeated
// for min_seconds; every rank of `comm` calls it (the others wait in its
// barriers). beta: the least-squares slope over the sizes; alpha: the
// smallest message's time less its bytes at beta (a least-squares
// intercept is lost in the large messages' noise). Every rank returns a's
// result.
absl::StatusOr<CollectiveFit> MeasurePingPong(Communicator& comm, int a, int b,
                                              const std::vector<int64_t>& sizes,
                                              double min_seconds);

absl::Status MeasureOffloadRates(const std::string& dir, int64_t nvme_bytes, double min_seconds,
                                 MachineProfile::Offload* rates);

// Least-squares fit of t = alpha + bytes / beta (alpha >= 0; a slope <= 0,
// from noise, falls back to the largest size's bytes / time).
CollectiveFit FitAlphaBeta(const std::vector<double>& bytes, const std::vector<double>& seconds);

}  // namespace zeroshard::tools

#endif  // ZEROSHARD_TOOLS_CALIBRATE_MACHINE_MEASURE_H_
