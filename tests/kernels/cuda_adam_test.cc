// The CUDA fused AdamW against the double reference and against the CPU
// kernels' bits. Labelled `gpu`; without a device it skips visibly.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "kernels/cuda/adam.cuh"
#include "kernels/reference/adam_reference.h"
#include "kernels/reference/bf16_reference.h"
#include "tests/kernels/adam_reference_params.h"
#include "tests/test_seed.h"

namespace zeroshard::kernels {
namespace {

#define ZS_ASSERT_CUDA(call)                                                       \
  do {                                                                             \
    const cudaError_t zs_err = (call);                                             \
    ASSERT_EQ(zs_err, cudaSuccess) << #call << ": " << cudaGetErrorString(zs_err); \
  } while (0)

bool HaveDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return false;
  return count > 0;
}

template <class T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : n(n) {
    error = cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T) + 1);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  T* ptr = nullptr;
  size_t n;
  cudaError_t error;
};

TEST(CudaAdamTest, MatchesReferenceAndCpuBits) {
  if (!HaveDevice()) {
    std::printf("[  SKIPPED ] no CUDA device: CUDA AdamW not run\n");
    GTEST_SKIP() << "no CUDA device: CUDA AdamW not run";
  }
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-4.0f, 0.0f);

  for (bool bf16 : {false, true}) {
    for (AdamMode mode : {AdamMode::kAdamW, AdamMode::kAdamL2}) {
      for (size_t n : {size_t{1}, size_t{129}, size_t{4099}, size_t{300007}}) {
        std::vector<float> p(n), g(n), m(n), v(n);
        for (size_t i = 0; i < n; ++i) {
          p[i] = 0.05f * normal(rng);
          g[i] = std::pow(10.0f, decade(rng)) * normal(rng);
          m[i] = 1e-3f * normal(rng);
          v[i] = 1e-6f * std::fabs(normal(rng)) + 1e-12f;
        }
        AdamStepParams params;
        params.mode = mode;
        params.weight_decay = 0.1;
        params.grad_scale = 0.5;
        params.step = 3;
        const AdamConstants c = MakeAdamConstants(params);

        DeviceBuffer<float> dp(n), dg(n), dm(n), dv(n);
        DeviceBuffer<uint16_t> dout(n);
        ZS_ASSERT_CUDA(dp.error);
        ZS_ASSERT_CUDA(dg.error);
        ZS_ASSERT_CUDA(dm.error);
        ZS_ASSERT_CUDA(dv.error);
        ZS_ASSERT_CUDA(dout.error);
        ZS_ASSERT_CUDA(cudaMemcpy(dp.ptr, p.data(), n * 4, cudaMemcpyHostToDevice));
        ZS_ASSERT_CUDA(cudaMemcpy(dg.ptr, g.data(), n * 4, cudaMemcpyHostToDevice));
        ZS_ASSERT_CUDA(cudaMemcpy(dm.ptr, m.data(), n * 4, cudaMemcpyHostToDevice));
        ZS_ASSERT_CUDA(cudaMemcpy(dv.ptr, v.data(), n * 4, cudaMemcpyHostToDevice));
        ZS_ASSERT_CUDA(cuda::LaunchAdam(dp.ptr, bf16 ? dout.ptr : nullptr, dg.ptr, nullptr, dm.ptr,
                                        dv.ptr, n, c, nullptr));
        ZS_ASSERT_CUDA(cudaDeviceSynchronize());
        std::vector<float> gp(n), gm(n), gv(n);
        std::vector<uint16_t> gout(n);
        ZS_ASSERT_CUDA(cudaMemcpy(gp.data(), dp.ptr, n * 4, cudaMemcpyDeviceToHost));
        ZS_ASSERT_CUDA(cudaMemcpy(gm.data(), dm.ptr, n * 4, cudaMemcpyDeviceToHost));
        ZS_ASSERT_CUDA(cudaMemcpy(gv.data(), dv.ptr, n * 4, cudaMemcpyDeviceToHost));
        if (bf16) {
          ZS_ASSERT_CUDA(cudaMemcpy(gout.data(), dout.ptr, n * 2, cudaMemcpyDeviceToHost));
        }

        // Double reference, with the per-element error bound explained in
        // adam_test.cc (at most 16 fp32 roundings on the magnitudes of the
        // terms, followed through m and v into p).
        std::vector<double> rp(p.begin(), p.end()), rg(g.begin(), g.end()), rm(m.begin(), m.end()),
            rv(v.begin(), v.end());
        reference::AdamStepReference(testing::ToReferenceParams(params), rp.data(), rg.data(),
                                     rm.data(), rv.data(), n);
        const double k16u = 16.0 / (1 << 24);
        const bool adamw = mode == AdamMode::kAdamW;
        const double bc1 = 1.0 - std::pow(params.beta1, 3.0);
        const double bc2 = 1.0 - std::pow(params.beta2, 3.0);
        const double step_size = params.lr / bc1;
        const double decay = adamw ? 1.0 - params.lr * params.weight_decay : 1.0;
        for (size_t i = 0; i < n; ++i) {
          double ge = std::fabs(g[i] * params.grad_scale);
          if (!adamw) ge += std::fabs(params.weight_decay * p[i]);
          const double m_err = k16u * (params.beta1 * std::fabs(m[i]) + (1 - params.beta1) * ge);
          const double v_err = k16u * (params.beta2 * v[i] + (1 - params.beta2) * ge * ge);
          const double denom = std::sqrt(rv[i]) / std::sqrt(bc2) + params.eps;
          const double update = step_size * std::fabs(rm[i]) / denom;
          const double denom_err = v_err / (2.0 * std::sqrt(rv[i]) * std::sqrt(bc2));
          const double p_err = k16u * (std::fabs(p[i] * decay) + update) +
                               step_size * m_err / denom + update * denom_err / denom;
          ASSERT_LE(std::fabs(gp[i] - rp[i]), p_err) << "n=" << n << " element " << i;
          ASSERT_LE(std::fabs(gm[i] - rm[i]), m_err) << "n=" << n << " element " << i;
          ASSERT_LE(std::fabs(gv[i] - rv[i]), v_err) << "n=" << n << " element " << i;
          if (bf16) {
            ASSERT_EQ(gout[i], reference::RoundToBf16Reference(gp[i])) << "element " << i;
          }
        }
        // Same contract, same bits as the CPU scalar path.
        std::vector<float> cp = p, cm = m, cv = v;
        AdamFp32On(Isa::kScalar, cp.data(), g.data(), cm.data(), cv.data(), n, c);
        EXPECT_EQ(0, std::memcmp(cp.data(), gp.data(), n * 4)) << "params differ from CPU bits";
        EXPECT_EQ(0, std::memcmp(cm.data(), gm.data(), n * 4)) << "m differs from CPU bits";
        EXPECT_EQ(0, std::memcmp(cv.data(), gv.data(), n * 4)) << "v differs from CPU bits";
      }
    }
  }
}

}  // namespace
}  // namespace zeroshard::kernels
