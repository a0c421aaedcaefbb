// sequence_check_bench: what the collective-sequence check costs per step on
// the mlp_demo model (4 local ranks, ZeRO stage 2 by default).
//
//   build/perf/runtime/sequence_check_bench [--stage S] [--steps N] [--repeats R]
//
// The check hashes every collective a rank issues and sends the hash with the
// norm's accumulator in the all-gather Step() does anyway. This runs the same
// training with TrainSpec::check_collective_sequence on and off, alternating
// R times (so drift on a shared machine hits both alike), and prints the mean
// ms per step of each and their difference as a fraction of the step.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/flags.h"
#include "examples/mlp/mlp.h"
#include "perf/bench_main.h"
#include "zeroshard/communicator.h"
#include "zeroshard/engine.h"
#include "zeroshard/fingerprint.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

struct Options {
  int ranks = 4;
  int stage = 2;
  int steps = 40;
  int warmup = 3;
  int repeats = 3;
};

struct Timing {
  double ms_per_step = 0.0;
  double collectives_per_step = 0.0;
};

// Mean ms per step over `steps` timed steps (after `warmup`), rank 0's clock.
absl::StatusOr<Timing> TimeSteps(const Options& o, bool check) {
  const mlp::MlpConfig cfg = mlp::MlpShape(/*hidden=*/256, /*blocks=*/5, /*micro_batch=*/16);
  Timing timing;
  ZS_RETURN_IF_ERROR(RunLocalRanks(o.ranks, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    TrainSpec train;
    train.zero_stage = o.stage;
    train.optimizer.lr = 3e-3;
    train.max_grad_norm = 2.0;
    train.check_collective_sequence = check;
    ZS_ASSIGN_OR_RETURN(auto engine, mlp::CreateMlpEngine(cfg, train, *device, comm));
    ZS_RETURN_IF_ERROR(engine->Start());
    mlp::MlpTrainer trainer(cfg, *engine, comm);
    for (int s = 0; s < o.warmup; ++s) ZS_RETURN_IF_ERROR(trainer.TrainStep().status());
    const int64_t collectives_before = engine->Stats().collectives;
    const absl::Time begin = absl::Now();
    for (int s = 0; s < o.steps; ++s) ZS_RETURN_IF_ERROR(trainer.TrainStep().status());
    if (rank == 0) {
      timing.ms_per_step = absl::ToDoubleMilliseconds(absl::Now() - begin) / o.steps;
      timing.collectives_per_step =
          static_cast<double>(engine->Stats().collectives - collectives_before) / o.steps;
    }
    return absl::OkStatus();
  }));
  return timing;
}

// Nanoseconds for hashing one collective record, as the engine does for
// every collective it issues (with the same function, Fingerprint64).
double NanosPerRecord() {
  constexpr int kRecords = 1 << 22;
  uint64_t h = 1;
  const absl::Time begin = absl::Now();
  for (int i = 0; i < kRecords; ++i) {
    const int64_t record[3] = {3, i & 63, 4096 + (i & 7)};
    h = Fingerprint64(record, sizeof(record), h);
  }
  const double ns = absl::ToDoubleNanoseconds(absl::Now() - begin) / kRecords;
  if (h == 0) std::printf(" ");  // keep the loop
  return ns;
}

absl::StatusOr<Options> ParseFlags(int argc, char** argv, bool* help) {
  Options o;
  cli::FlagSet flags;
  flags.Int("ranks", &o.ranks, 1, cli::kMaxCount)
      .Int("stage", &o.stage, 0, 3)
      .Int("steps", &o.steps, 1, cli::kMaxCount)
      .Int("repeats", &o.repeats, 1, cli::kMaxCount);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  return o;
}

int Run(const Options& o) {
  double on = 0.0, off = 0.0, collectives = 0.0;
  for (int r = 0; r < o.repeats; ++r) {
    // Alternate which goes first, so drift does not favour one.
    for (bool check : {r % 2 == 0, r % 2 != 0}) {
      auto ms = TimeSteps(o, check);
      if (!ms.ok()) {
        std::fprintf(stderr, "sequence_check_bench: %s\n",
                     std::string(ms.status().message()).c_str());
        return 1;
      }
      std::printf("repeat %d  check %-3s  %7.2f ms/step\n", r + 1, check ? "on" : "off",
                  ms->ms_per_step);
      (check ? on : off) += ms->ms_per_step / o.repeats;
      collectives = ms->collectives_per_step;
    }
  }
  std::printf("\nmlp_demo model, %d local ranks, ZeRO stage %d, %d steps x %d repeats\n", o.ranks,
              o.stage, o.steps, o.repeats);
  std::printf("  check on   %7.2f ms/step\n  check off  %7.2f ms/step\n", on, off);
  std::printf(
      "  difference %+7.3f ms/step = %+.2f%% of the step (noise on a shared machine is "
      "of the same order; see the repeats above)\n",
      on - off, 100.0 * (on - off) / off);
  // The check's own work, measured directly: one hash per collective, and 16
  // more bytes per rank in the all-gather Step() makes anyway.
  const double ns = NanosPerRecord();
  const double us = collectives * ns / 1000.0;
  std::printf(
      "  direct: %.0f collectives/step x %.1f ns per hash = %.2f us/step = %.4f%% of the "
      "step, plus 16 bytes per rank in the norm's all-gather\n",
      collectives, ns, us, 100.0 * us / 1000.0 / off);
  return 0;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BenchMain<zeroshard::Options>(
      "sequence_check_bench", argc, argv, zeroshard::ParseFlags,
      [] {
        std::printf(
            "usage: sequence_check_bench [--ranks N] [--stage S] [--steps N] [--repeats R]\n");
      },
      zeroshard::Run);
}
