// Runs the example MLP on local ranks and collects what the engine tests compare.
#ifndef ZEROSHARD_TESTS_RUNTIME_ENGINE_TEST_UTIL_H_
#define ZEROSHARD_TESTS_RUNTIME_ENGINE_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/mlp/mlp.h"
#include "zeroshard/engine.h"

namespace zeroshard::testing {

struct RunConfig {
  int world = 1;
  int stage = 0;
  int accum = 1;
  Precision precision = Precision::kFp32;
  int steps = 24;
  double max_grad_norm = 0.0;
  double weight_decay = 0.01;
  int prefetch_units = 1;
  bool quantized_weights = false;    // TrainSpec::zeropp.quantized_weights (qwZ)
  int secondary_partition_size = 0;  // TrainSpec::zeropp.secondary_partition_size (hpZ)
  int quantized_grad_bits = 0;       // TrainSpec::zeropp.quantized_grad_bits (qgZ)
};

struct RunResult {
  std::vector<std::vector<std::vector<float>>> params;  // [unit][param] from rank 0
  std::vector<double> losses;                           // per step
  std::vector<StepResult> steps;                        // rank 0's
  std::vector<int64_t> model_state_bytes;               // per rank, from the ledger
  std::vector<int64_t> peak_bytes;                      // per rank, from the ledger
  EngineStats stats;                                    // rank 0's
};

// A small MLP whose weights, teacher and data come from the test seed
// (tests/test_seed.h: fresh each run, ZS_TEST_SEED replays).
mlp::MlpConfig SmallMlp();
TrainSpec MakeTrainSpec(const RunConfig& run);
// Trains cfg's MLP for run.steps steps on run.world local ranks; fails if any
// rank fails or any rank's padding is not zero at the end.
absl::StatusOr<RunResult> TrainMlp(const mlp::MlpConfig& cfg, const RunConfig& run);

// Largest |a - b| / max |b| over every param tensor.
double MaxRelativeDifference(const RunResult& a, const RunResult& b);
// ||a - b|| / ||b|| over all weights together (L2).
double RelativeL2Difference(const RunResult& a, const RunResult& b);
// True when every weight has the same bits.
bool BitwiseEqual(const RunResult& a, const RunResult& b);

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_RUNTIME_ENGINE_TEST_UTIL_H_
