// The TrainSpec the runtime benchmarks train the MLP example with, written
// once so that step_bench and prefetch_bench time the same optimizer.
#ifndef ZEROSHARD_PERF_RUNTIME_MLP_BENCH_TRAIN_SPEC_H_
#define ZEROSHARD_PERF_RUNTIME_MLP_BENCH_TRAIN_SPEC_H_

#include "zeroshard/train_spec.h"

namespace zeroshard::perf {

// ZeRO `stage`, `precision`, stage 3 gathering `prefetch_units` ahead;
// AdamW with lr 3e-3 and weight decay 0.01, gradients clipped at norm 2.
inline TrainSpec MlpBenchTrainSpec(int stage, Precision precision, int prefetch_units) {
  TrainSpec train;
  train.zero_stage = stage;
  train.precision = precision;
  train.prefetch_units = prefetch_units;
  train.optimizer.kind = OptimizerKind::kAdamW;
  train.optimizer.lr = 3e-3;
  train.optimizer.weight_decay = 0.01;
  train.max_grad_norm = 2.0;
  return train;
}

}  // namespace zeroshard::perf

#endif  // ZEROSHARD_PERF_RUNTIME_MLP_BENCH_TRAIN_SPEC_H_
