// A minimal trainer for engine tests that need control over each rank's
// gradients and gather order: deterministic pseudo-random gradients that
// depend on the step, rank, unit and element, written through the engine's
// public API in the stage-3 loop shape (Gather/Release forward, then
// Gather/GradView/ReduceGrads/Release backward).
#ifndef ZEROSHARD_TESTS_RUNTIME_SYNTHETIC_TRAINER_H_
#define ZEROSHARD_TESTS_RUNTIME_SYNTHETIC_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"

namespace zeroshard::testing {

// Units of different sizes; "block.1" and "block.3" have the same shapes.
ModelSpec SyntheticSpec();
// Deterministic initial values for (unit, param).
std::vector<float> SyntheticInit(const ModelSpec& spec, int unit, int param);

struct SyntheticHooks {
  // The unit to gather in place of `unit` (forward pass), by default `unit`.
  std::function<int(int64_t step, int rank, int unit)> forward_unit;
  // Called after the gradient of `unit` was written, before ReduceGrads.
  std::function<void(int64_t step, int rank, int unit, UnitView& grads)> after_grads;
};

// One optimizer step (grad_accum_steps micro-batches) on one rank.
// `device` is the engine's device when its memory is not host memory (a
// CUDA device): the views are then read and written through copies on a
// stream of it. The hooks need host-accessible views.
absl::StatusOr<StepResult> SyntheticStep(Engine& engine, const ModelSpec& spec,
                                         const SyntheticHooks& hooks = {},
                                         Device* device = nullptr);

// SetParam for every param with SyntheticInit, then Start().
absl::Status SyntheticStart(Engine& engine, const ModelSpec& spec);

// All params (fp32, from GetParam: collective).
absl::StatusOr<std::vector<std::vector<float>>> AllParams(Engine& engine, const ModelSpec& spec);

// The tests' optimizer setting for the synthetic model: AdamW lr 1e-2, weight
// decay 0.05, clipping at 5, `accum` micro-batches per rank.
TrainSpec SyntheticTrain(int stage, Precision precision, int accum = 1);

// A whole synthetic run on `world` local ranks, each engine on the device
// `make_device(rank)` makes: `steps` steps from SyntheticInit, or from the
// checkpoint `load_dir` when given; saved into `save_dir` at the end when
// given. What rank 0 saw comes back.
struct SyntheticRunSpec {
  int world = 1;
  TrainSpec train;
  int steps = 0;
  std::string load_dir;
  std::string save_dir;
  std::function<absl::StatusOr<std::unique_ptr<Device>>(int rank)> make_device;
  CommOptions comm;      // comm.device: the group's memory (null: host)
  SyntheticHooks hooks;  // they need a host-accessible device
  // Called once per step, after it, on every rank (e.g. to damage a swap file).
  std::function<void(int64_t step, int rank, Engine& engine)> after_step;
};
struct SyntheticRunResult {
  std::vector<std::vector<float>> params;  // GetParam of every param, at the end
  std::vector<StepResult> steps;
  int64_t model_state_bytes = 0;  // rank 0's ledger
  // Every rank's ledgers against PlanEngineBuffers, per memory tier and
  // category, after the run: the host and NVMe tiers' every category, the
  // device's model states and communication buffers. Empty when they agree.
  std::vector<std::string> ledger_vs_plan;
  // Rank 0's bytes per tier (Engine::tier_ledger(t).current_total()).
  int64_t tier_bytes[kNumMemoryTiers] = {};
};
absl::StatusOr<SyntheticRunResult> RunSyntheticRanks(const SyntheticRunSpec& spec);

// "" when the two runs have the same bits (params, norms, loss scales,
// skips), else where they first differ.
std::string FirstDifference(const SyntheticRunResult& a, const SyntheticRunResult& b);

// Runs `steps` steps of `train` on `world` ranks, on the host (`other`
// false) or on the device kind under test (`other` true), loading the
// checkpoint in `load_dir` first and saving one to `save_dir` last when they
// are not empty.
using RunOnDevice = std::function<absl::StatusOr<SyntheticRunResult>(
    bool other, int world, const TrainSpec& train, int steps, const std::string& load_dir,
    const std::string& save_dir)>;

// A checkpoint written on one kind of device continues on the other bit for
// bit like the uninterrupted host run (2 ranks, 3 + 3 steps, fp32 and
// fp16-mixed, both directions); `other_name` ("GPU") names the device kind
// under test in failures. gtest assertions.
void ExpectCheckpointsMoveBitForBit(const RunOnDevice& run, const std::string& other_name);

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_RUNTIME_SYNTHETIC_TRAINER_H_
