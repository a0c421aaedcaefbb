// The clock the trainers time their waits with (input wait, pipeline
// waits). The engine's step clock is monotonic too: a wait measured with a
// wall clock that stepped could be negative or huge.
#ifndef ZEROSHARD_EXAMPLES_MLP_INTERNAL_STEADY_CLOCK_H_
#define ZEROSHARD_EXAMPLES_MLP_INTERNAL_STEADY_CLOCK_H_

#include <chrono>

#include "absl/time/time.h"

namespace zeroshard::mlp::internal {

inline absl::Duration SteadyNow() {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace zeroshard::mlp::internal

#endif  // ZEROSHARD_EXAMPLES_MLP_INTERNAL_STEADY_CLOCK_H_
