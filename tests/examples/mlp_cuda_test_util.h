// Helpers of the MLP's GPU tests (mlp_cuda_test, mlp_cuda_math_test): the
// device check and visible skip, a device array, the relative error the
// tolerances are stated in.
#ifndef ZEROSHARD_TESTS_EXAMPLES_MLP_CUDA_TEST_UTIL_H_
#define ZEROSHARD_TESTS_EXAMPLES_MLP_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "absl/status/status.h"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace testing {

#define ZS_ASSERT_CUDA(call)                                                       \
  do {                                                                             \
    const cudaError_t zs_err = (call);                                             \
    ASSERT_EQ(zs_err, cudaSuccess) << #call << ": " << cudaGetErrorString(zs_err); \
  } while (0)

#define ZS_ASSERT_OK(expr)                    \
  do {                                        \
    const absl::Status zs_status = (expr);    \
    ASSERT_TRUE(zs_status.ok()) << zs_status; \
  } while (0)

inline bool HaveDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return false;
  return count > 0;
}

// Prints the line ctest's SKIP_REGULAR_EXPRESSION looks for, then skips.
#define ZS_SKIP_WITHOUT_DEVICE()                                          \
  do {                                                                    \
    if (!::zeroshard::mlp::gpu::testing::HaveDevice()) {                  \
      std::printf("[  SKIPPED ] no CUDA device: MLP GPU math not run\n"); \
      GTEST_SKIP() << "no CUDA device: MLP GPU math not run";             \
    }                                                                     \
  } while (0)

// A device array of n elements of T, freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    error_ = cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n, 1) * sizeof(T));
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  cudaError_t error() const { return error_; }
  cudaError_t Upload(const std::vector<T>& host) const {
    return cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  // All bytes 0xff: NaN for floats, so an element left unwritten shows.
  cudaError_t Poison() const { return cudaMemset(ptr_, 0xff, n_ * sizeof(T)); }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) {
      ADD_FAILURE() << "cudaMemcpy device to host failed";
    }
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
  cudaError_t error_;
};

// max over i of |got - want| / (|want| + mean |want|), and where.
struct RelError {
  double value = 0.0;
  size_t index = 0;
};

inline RelError MaxRelError(const std::vector<float>& got, const std::vector<float>& want) {
  RelError worst;
  if (got.size() != want.size() || want.empty()) return {std::numeric_limits<double>::infinity()};
  double scale = 0.0;
  for (float w : want) scale += std::fabs(w);
  scale /= static_cast<double>(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double err =
        std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(want[i]) + scale);
    if (!(err <= worst.value)) worst = {err, i};  // NaN counts as worst
  }
  return worst;
}

}  // namespace testing
}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_TESTS_EXAMPLES_MLP_CUDA_TEST_UTIL_H_
