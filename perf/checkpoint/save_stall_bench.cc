// save_stall_bench: how long Engine::Save stops training with a background
// write, against a synchronous save of the same bytes, in the same run.
//
//   build/perf/checkpoint/save_stall_bench [--dir /tmp/zs_save_bench] [--repeats 3]
//
// Two models on 2 local ranks, ZeRO stage 1, bf16 mixed precision: the
// mlp_demo model (2.6M params) and a 256M-param spec (16 units of one
// [4096, 4096] matrix). For each, alternately: Save with background=false
// (the call returns when the files are written, fsynced and committed), and
// Save with background=true (the call returns once the shard is copied to
// host memory: the stall), then WaitForCheckpoint (the rest of the write,
// which training would overlap). Prints the median of each over the repeats,
// and the stall of the very first Save, whose host snapshot is new memory
// (later saves reuse it: CheckpointOptions::keep_snapshot).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/flags.h"
#include "examples/common/median.h"
#include "examples/mlp/demo_options.h"
#include "examples/mlp/mlp.h"
#include "perf/bench_main.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

struct BenchModel {
  std::string name;
  ModelSpec spec;
};

// mlp_demo's default model (5 residual blocks, hidden 256).
ModelSpec DemoModel() { return mlp::BuildModelSpec(mlp::DemoOptions{}.model); }

ModelSpec Spec256M() {
  ModelSpec spec;
  for (int u = 0; u < 16; ++u) {
    spec.units.push_back({absl::StrFormat("layer.%d", u), {{"w", {4096, 4096}, false}}});
  }
  return spec;
}

struct Timing {
  std::vector<double> sync_s, stall_s, rest_s;
  double first_stall_s = 0;  // the first Save: the snapshot's pages are new
  int64_t bytes_per_rank = 0;
};

absl::StatusOr<Timing> Measure(const BenchModel& model, const std::string& dir, int repeats) {
  Timing timing;
  TrainSpec train;
  train.zero_stage = 1;
  train.precision = Precision::kBf16Mixed;
  ZS_RETURN_IF_ERROR(RunLocalRanks(2, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(model.spec, train, *device, comm));
    for (size_t u = 0; u < model.spec.units.size(); ++u) {
      for (size_t p = 0; p < model.spec.units[u].params.size(); ++p) {
        std::vector<float> values(model.spec.units[u].params[p].NumElements());
        for (size_t i = 0; i < values.size(); ++i) values[i] = 1e-3f * static_cast<float>(i % 997);
        ZS_RETURN_IF_ERROR(engine->SetParam(static_cast<int>(u), static_cast<int>(p), values));
      }
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    CheckpointOptions sync;
    sync.background = false;
    sync.keep_last = 1;
    CheckpointOptions background = sync;
    background.background = true;
    absl::Time t0 = absl::Now();
    ZS_RETURN_IF_ERROR(engine->Save(dir, "{}", background));
    if (rank == 0) timing.first_stall_s = absl::ToDoubleSeconds(absl::Now() - t0);
    ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
    for (int r = 0; r < repeats; ++r) {
      ZS_RETURN_IF_ERROR(comm.BarrierSync());
      t0 = absl::Now();
      ZS_RETURN_IF_ERROR(engine->Save(dir, "{}", sync));
      const double sync_s = absl::ToDoubleSeconds(absl::Now() - t0);
      ZS_RETURN_IF_ERROR(comm.BarrierSync());
      t0 = absl::Now();
      ZS_RETURN_IF_ERROR(engine->Save(dir, "{}", background));
      const double stall_s = absl::ToDoubleSeconds(absl::Now() - t0);
      t0 = absl::Now();
      ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
      const double rest_s = absl::ToDoubleSeconds(absl::Now() - t0);
      if (rank == 0) {
        timing.sync_s.push_back(sync_s);
        timing.stall_s.push_back(stall_s);
        timing.rest_s.push_back(rest_s);
      }
    }
    if (rank == 0) {
      absl::StatusOr<std::string> step = ResolveCheckpoint(dir);
      ZS_RETURN_IF_ERROR(step.status());
      std::vector<std::string> problems;
      ZS_ASSIGN_OR_RETURN(CheckpointInfo info, InspectCheckpoint(dir, &problems));
      if (!problems.empty()) return absl::DataLossError(problems.front());
      timing.bytes_per_rank = info.file_bytes[0];
    }
    return absl::OkStatus();
  }));
  return timing;
}

struct Options {
  std::string dir = "/tmp/zs_save_bench";
  int repeats = 3;
};

absl::StatusOr<Options> ParseFlags(int argc, char** argv, bool* help) {
  Options o;
  cli::FlagSet flags;
  flags.String("dir", &o.dir).Int("repeats", &o.repeats, 1, int64_t{1} << 20);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  return o;
}

int Run(const Options& o) {
  const std::string& dir = o.dir;
  const int repeats = o.repeats;
  const BenchModel models[] = {{"mlp_demo model (2.6M params)", DemoModel()},
                               {"256M-param spec", Spec256M()}};
  std::printf("2 local ranks, ZeRO stage 1, bf16 mixed; median of %d; checkpoints in %s\n", repeats,
              dir.c_str());
  std::printf("  %-30s %12s %12s %12s %12s %8s %14s\n", "model", "MiB per rank", "sync save s",
              "stall s", "rest s", "stall/sync", "first stall s");
  for (const BenchModel& m : models) {
    absl::StatusOr<Timing> t = Measure(m, dir + "/" + std::to_string(m.spec.NumParams()), repeats);
    if (!t.ok()) {
      std::fprintf(stderr, "save_stall_bench: %s\n", std::string(t.status().message()).c_str());
      return 1;
    }
    const double sync = examples::Median(t->sync_s);
    const double stall = examples::Median(t->stall_s);
    std::printf("  %-30s %12.1f %12.4f %12.4f %12.4f %8.3f %14.4f\n", m.name.c_str(),
                static_cast<double>(t->bytes_per_rank) / (1 << 20), sync, stall,
                examples::Median(t->rest_s), stall / sync, t->first_stall_s);
  }
  return 0;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BenchMain<zeroshard::Options>(
      "save_stall_bench", argc, argv, zeroshard::ParseFlags,
      [] { std::printf("usage: save_stall_bench [--dir DIR] [--repeats N]\n"); }, zeroshard::Run);
}
