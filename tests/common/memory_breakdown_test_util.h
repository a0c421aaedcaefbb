// The planner's bytes of one ledger category, so that a test sets a plan
// (MemoryBreakdown) against a Device's MemoryLedger category by category.
// Shared by plan_vs_ledger_test and gpt_estimate_vs_ledger_test.
#ifndef ZEROSHARD_TESTS_COMMON_MEMORY_BREAKDOWN_TEST_UTIL_H_
#define ZEROSHARD_TESTS_COMMON_MEMORY_BREAKDOWN_TEST_UTIL_H_

#include <cstdint>

#include "zeroshard/estimate/planner.h"
#include "zeroshard/memory_category.h"

namespace zeroshard::testing {

// -1 for kCount (not a category).
inline int64_t PlannedBytes(const MemoryBreakdown& m, MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParams:
      return m.params;
    case MemoryCategory::kGradients:
      return m.grads;
    case MemoryCategory::kMasterParams:
      return m.master;
    case MemoryCategory::kOptimizerState:
      return m.optimizer;
    case MemoryCategory::kCommBuffers:
      return m.buffers;
    case MemoryCategory::kActivations:
      return m.activations;
    case MemoryCategory::kWorkspace:
      return m.workspace;
    case MemoryCategory::kCount:
      break;
  }
  return -1;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_COMMON_MEMORY_BREAKDOWN_TEST_UTIL_H_
