// For the GPU tests (label `gpu`): whether a CUDA device exists, and the
// visible skip when it does not. The ctest entry of such a test sets
// SKIP_REGULAR_EXPRESSION "\[  SKIPPED \]" so that a run without a GPU is
// reported as skipped, never as passed.
#ifndef ZEROSHARD_TESTS_CUDA_TEST_UTIL_H_
#define ZEROSHARD_TESTS_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdio>

namespace zeroshard::testing {

inline bool HaveCudaDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace zeroshard::testing

// In a TEST body: prints "[  SKIPPED ] no CUDA device: <what> not run" and
// skips when there is no device.
#define ZS_SKIP_WITHOUT_CUDA_DEVICE(what)                             \
  do {                                                                \
    if (!::zeroshard::testing::HaveCudaDevice()) {                    \
      std::printf("[  SKIPPED ] no CUDA device: %s not run\n", what); \
      GTEST_SKIP() << "no CUDA device: " << (what) << " not run";     \
    }                                                                 \
  } while (0)

#endif  // ZEROSHARD_TESTS_CUDA_TEST_UTIL_H_
