// CudaMlpMath (examples/mlp/cuda/cuda_mlp_math.h), the device side of a GPU
// trainer's micro-batch, against the CPU trainer's math on a whole network.
// Labelled `gpu`; without a device every test skips visibly.
//
// Tolerances (relative error as in mlp_cuda_test: |gpu - cpu| over
// |cpu| + mean |cpu|): network output 2e-5; gradients 5e-5, since the
// backward of the first block carries the rounding differences of every
// later block's products; the loss 1e-5 relative. A power-of-two loss scale
// must scale every gradient exactly (bitwise).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "examples/mlp/cuda/cuda_mlp_math.h"
#include "examples/mlp/internal/block_math.h"
#include "kernels/common/float16_rules.h"
#include "tests/examples/mlp_cuda_test_util.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace {

using testing::DeviceArray;
using testing::MaxRelError;

constexpr int kParams = 4;  // w1 b1 w2 b2

// A random network and micro-batch on the host (fresh per run, never zeros).
struct Network {
  CudaMlpMathConfig config;
  std::vector<std::vector<float>> params;  // [block * 4 + param]
  std::vector<float> x, target;
};

Network RandomNetwork(int blocks, int64_t batch, int64_t hidden, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t inner = internal::InnerSize(hidden);
  const int64_t sizes[kParams] = {inner * hidden, inner, hidden * inner, hidden};
  const float scales[kParams] = {1.0f / std::sqrt(static_cast<float>(hidden)), 0.3f,
                                 1.0f / std::sqrt(static_cast<float>(inner)), 0.3f};
  Network net;
  net.config = {blocks, batch, hidden, MatmulInputs::kFp32};
  for (int u = 0; u < blocks; ++u) {
    for (int p = 0; p < kParams; ++p) {
      std::vector<float> v(static_cast<size_t>(sizes[p]));
      for (float& e : v) e = scales[p] * normal(rng);
      net.params.push_back(std::move(v));
    }
  }
  for (int64_t i = 0; i < batch * hidden; ++i) {
    net.x.push_back(normal(rng));
    net.target.push_back(1.5f * normal(rng));
  }
  return net;
}

// The CPU trainer's micro-batch: forward, loss, backward; per-block grads.
struct CpuResult {
  std::vector<float> output;
  double loss = 0.0;
  std::vector<std::vector<float>> grads;  // [block * 4 + param]
};

CpuResult RunCpu(const Network& net) {
  const int64_t b = net.config.batch, h = net.config.hidden;
  internal::UseSingleThreadedBlas();
  std::vector<internal::BlockWeights> weights;
  for (int u = 0; u < net.config.blocks; ++u) {
    const auto* p = &net.params[static_cast<size_t>(u) * kParams];
    weights.push_back({p[0].data(), p[1].data(), p[2].data(), p[3].data()});
  }
  internal::ForwardState state;
  state.Resize(net.config.blocks, b, h);
  internal::NetworkForward(weights, b, h, net.x.data(), &state);
  CpuResult r;
  r.output = state.output();
  std::vector<float> dy(static_cast<size_t>(b * h)), dx(dy.size()), scratch(4 * dy.size());
  r.loss = internal::MseLoss(state.output().data(), net.target.data(), b * h, dy.data());
  for (const auto& p : net.params) r.grads.emplace_back(p.size());
  for (int u = net.config.blocks - 1; u >= 0; --u) {
    auto* g = &r.grads[static_cast<size_t>(u) * kParams];
    internal::BlockBackward(weights[u], b, h, state.inputs[u].data(), state.pre[u].data(),
                            state.act[u].data(), dy.data(), scratch.data(),
                            u > 0 ? dx.data() : nullptr,
                            {g[0].data(), g[1].data(), g[2].data(), g[3].data()});
    std::swap(dy, dx);
  }
  return r;
}

// The network's params on the device, in the dtype of the engine's views.
class DeviceParams {
 public:
  DeviceParams(const Network& net, DType dtype) : dtype_(dtype) {
    for (const auto& p : net.params) {
      if (dtype == DType::kFloat32) {
        fp32_.push_back(std::make_unique<DeviceArray<float>>(p.size()));
        error_ = error_ != cudaSuccess ? error_ : fp32_.back()->Upload(p);
      } else {
        std::vector<uint16_t> bits(p.size());
        for (size_t i = 0; i < p.size(); ++i) bits[i] = kernels::Fp32ToBf16Rne(p[i]);
        bf16_.push_back(std::make_unique<DeviceArray<uint16_t>>(p.size()));
        error_ = error_ != cudaSuccess ? error_ : bf16_.back()->Upload(bits);
      }
      numel_.push_back(static_cast<int64_t>(p.size()));
    }
  }
  cudaError_t error() const { return error_; }

  // What Gather(block) would return on a CUDA engine.
  UnitView View(int block) const {
    UnitView view;
    for (int p = 0; p < kParams; ++p) {
      const size_t t = static_cast<size_t>(block) * kParams + p;
      TensorView v;
      v.data = dtype_ == DType::kFloat32 ? static_cast<void*>(fp32_[t]->get())
                                         : static_cast<void*>(bf16_[t]->get());
      v.dtype = dtype_;
      v.numel = numel_[t];
      view.params.push_back(v);
    }
    return view;
  }

 private:
  DType dtype_;
  std::vector<std::unique_ptr<DeviceArray<float>>> fp32_;
  std::vector<std::unique_ptr<DeviceArray<uint16_t>>> bf16_;
  std::vector<int64_t> numel_;
  cudaError_t error_ = cudaSuccess;
};

std::vector<float> Download(const float* device, size_t n) {
  std::vector<float> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// One micro-batch on CudaMlpMath; per-block grads downloaded after each
// Backward (the trainer would WriteGrads them into the engine's view).
struct GpuResult {
  std::vector<float> output;
  double loss = 0.0;
  std::vector<std::vector<float>> grads;
};

GpuResult RunGpu(CudaMlpMath& math, const Network& net, const DeviceParams& params,
                 float loss_scale) {
  GpuResult r;
  const size_t io = net.x.size();
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(math.input(0), net.x.data(), io * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(
      cudaMemcpy(math.target(), net.target.data(), io * sizeof(float), cudaMemcpyHostToDevice),
      cudaSuccess);
  for (int u = 0; u < net.config.blocks; ++u) {
    const absl::StatusOr<DeviceBlockWeights> w = math.WeightsFromView(params.View(u), stream);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return r;
    const absl::Status forward = math.Forward(u, *w, stream);
    EXPECT_TRUE(forward.ok()) << forward;
    // docs/gpu.md rule 3: done reading the view before the engine's Release.
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  const absl::Status loss = math.Loss(loss_scale, stream);
  EXPECT_TRUE(loss.ok()) << loss;
  r.grads.resize(net.params.size());
  for (int u = net.config.blocks - 1; u >= 0; --u) {
    const absl::StatusOr<DeviceBlockWeights> w = math.WeightsFromView(params.View(u), stream);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return r;
    const absl::Status backward = math.Backward(u, *w, stream);
    EXPECT_TRUE(backward.ok()) << backward;
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const DeviceBlockGradients g = math.grads();
    float* const ptrs[kParams] = {g.w1, g.b1, g.w2, g.b2};
    for (int p = 0; p < kParams; ++p) {
      const size_t t = static_cast<size_t>(u) * kParams + p;
      r.grads[t] = Download(ptrs[p], net.params[t].size());
    }
  }
  const absl::StatusOr<double> value = math.ReadLoss(stream);
  EXPECT_TRUE(value.ok()) << value.status();
  r.loss = value.ok() ? *value : 0.0;
  r.output = Download(math.input(net.config.blocks), io);
  cudaStreamDestroy(stream);
  return r;
}

TEST(CudaMlpMath, NetworkMatchesCpuTrainerMath) {
  ZS_SKIP_WITHOUT_DEVICE();
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed());
  const Network net = RandomNetwork(3, 8, 32, rng);
  absl::StatusOr<std::unique_ptr<CudaMlpMath>> math = CudaMlpMath::Create(net.config);
  ZS_ASSERT_OK(math.status());
  const DeviceParams params(net, DType::kFloat32);
  ZS_ASSERT_CUDA(params.error());
  const CpuResult cpu = RunCpu(net);
  const GpuResult gpu = RunGpu(**math, net, params, 1.0f);
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  EXPECT_LE(MaxRelError(gpu.output, cpu.output).value, 2e-5);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * cpu.loss);
  for (size_t t = 0; t < cpu.grads.size(); ++t) {
    const auto e = MaxRelError(gpu.grads[t], cpu.grads[t]);
    EXPECT_LE(e.value, 5e-5) << "block " << t / kParams << " param " << t % kParams << " element "
                             << e.index;
  }
}

TEST(CudaMlpMath, Bf16ViewsAndPowerOfTwoLossScale) {
  ZS_SKIP_WITHOUT_DEVICE();
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed() + 1);
  const Network net = RandomNetwork(2, 4, 16, rng);
  absl::StatusOr<std::unique_ptr<CudaMlpMath>> math = CudaMlpMath::Create(net.config);
  ZS_ASSERT_OK(math.status());
  const DeviceParams params(net, DType::kBFloat16);
  ZS_ASSERT_CUDA(params.error());

  // The widened weights are the bf16 values exactly.
  const absl::StatusOr<DeviceBlockWeights> w = (*math)->WeightsFromView(params.View(1), nullptr);
  ZS_ASSERT_OK(w.status());
  ZS_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> w2 = Download(w->w2, net.params[kParams + 2].size());
  for (size_t i = 0; i < w2.size(); ++i) {
    const float want = kernels::Bf16ToFp32(kernels::Fp32ToBf16Rne(net.params[kParams + 2][i]));
    ASSERT_EQ(kernels::Fp32AsBits(w2[i]), kernels::Fp32AsBits(want)) << "W2 element " << i;
  }

  // Scaling the seed by 2^10 scales every gradient by exactly 2^10: every
  // later value is linear in the seed and a power of two commutes with each
  // rounding. The loss stays unscaled.
  const GpuResult plain = RunGpu(**math, net, params, 1.0f);
  const GpuResult scaled = RunGpu(**math, net, params, 1024.0f);
  EXPECT_EQ(std::memcmp(&plain.loss, &scaled.loss, sizeof(double)), 0);
  ASSERT_EQ(plain.grads.size(), scaled.grads.size());
  for (size_t t = 0; t < plain.grads.size(); ++t) {
    ASSERT_EQ(plain.grads[t].size(), scaled.grads[t].size());
    for (size_t i = 0; i < plain.grads[t].size(); ++i) {
      ASSERT_EQ(kernels::Fp32AsBits(1024.0f * plain.grads[t][i]),
                kernels::Fp32AsBits(scaled.grads[t][i]))
          << "param " << t << " element " << i;
    }
  }

  // WriteGrads narrows the last Backward's (block 0's) gradients into a bf16
  // grad view with the project's rounding.
  std::vector<std::unique_ptr<DeviceArray<uint16_t>>> grad_storage;
  UnitView grad_view;
  for (int p = 0; p < kParams; ++p) {
    grad_storage.push_back(std::make_unique<DeviceArray<uint16_t>>(net.params[p].size()));
    ZS_ASSERT_CUDA(grad_storage.back()->error());
    grad_view.params.push_back({grad_storage.back()->get(), DType::kBFloat16,
                                static_cast<int64_t>(net.params[p].size()), nullptr});
  }
  ZS_ASSERT_OK((*math)->WriteGrads(grad_view, nullptr));
  ZS_ASSERT_CUDA(cudaDeviceSynchronize());
  for (int p = 0; p < kParams; ++p) {
    const std::vector<uint16_t> bits = grad_storage[p]->Download();
    for (size_t i = 0; i < bits.size(); ++i) {
      ASSERT_EQ(bits[i], kernels::Fp32ToBf16Rne(scaled.grads[p][i]))
          << "param " << p << " element " << i;
    }
  }
}

TEST(CudaMlpMath, RejectsBadConfigBlocksAndViews) {
  ZS_SKIP_WITHOUT_DEVICE();
  EXPECT_EQ(LayOutCudaMlpMath({0, 4, 8, MatmulInputs::kFp32}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaMlpMath::Create({2, 4, 0, MatmulInputs::kFp32}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<CudaMlpMath>> math =
      CudaMlpMath::Create({2, 4, 8, MatmulInputs::kFp32});
  ZS_ASSERT_OK(math.status());
  const DeviceBlockWeights none;
  EXPECT_EQ((*math)->Forward(2, none, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*math)->Backward(-1, none, nullptr).code(), absl::StatusCode::kInvalidArgument);
  UnitView short_view;
  short_view.params.resize(3);
  const absl::Status refused = (*math)->WeightsFromView(short_view, nullptr).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("expected 4"), absl::string_view::npos) << refused;
}

}  // namespace
}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
