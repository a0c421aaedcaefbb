// The MLP block math on a CUDA device (examples/mlp/cuda) against the CPU
// block math (examples/mlp/internal/block_math), which mlp_model_test holds
// to a double-precision reference and to finite differences. Labelled `gpu`;
// without a device every test skips visibly.
//
// Tolerances, per element, with scale(c) = mean |c| over the array:
//   fp32 products: |gpu - cpu| <= 2e-5 * (|cpu| + scale(cpu))
//     (cuBLASLt sums each dot product, up to 4h = 512 terms, in another
//     order: ~eps * sqrt(K) ~ 1e-6 typical, a few times that at the worst
//     element and after two chained products; erff / expf may differ from
//     the host's by an ulp);
//   bf16 operands: |gpu - cpu| <= 5e-2 * (|cpu| + scale(cpu))
//     (every operand rounded to 8 significant bits, up to 2^-8 per product
//     term, compounded through up to three chained products and the GELU);
//   MSE: dL/dout bit-identical to the CPU's, the loss within 1e-12 relative;
//   finite differences (double, on the host): 1e-4 + 1e-3 |fd|, as
//   mlp_model_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "examples/mlp/cuda/block_math_cuda.h"
#include "examples/mlp/cuda/cublaslt_gemm.h"
#include "examples/mlp/cuda/view_convert_cuda.h"
#include "examples/mlp/internal/block_math.h"
#include "kernels/common/float16_rules.h"
#include "tests/examples/mlp_cuda_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/engine.h"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace {

using testing::DeviceArray;
using testing::MaxRelError;
using testing::RelError;

// Fresh random inputs of one block (seeded per run, never zeros).
struct BlockInputs {
  int64_t batch = 0;
  int64_t hidden = 0;
  std::vector<float> w1, b1, w2, b2, x, dy;
};

BlockInputs RandomBlock(int64_t batch, int64_t hidden, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t inner = internal::InnerSize(hidden);
  auto fill = [&](int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) e = scale * normal(rng);
    return v;
  };
  BlockInputs in;
  in.batch = batch;
  in.hidden = hidden;
  // Weights N(0, 1/fan_in) as the trainer initialises them; biases O(0.3)
  // so that the bias paths matter.
  in.w1 = fill(inner * hidden, 1.0f / std::sqrt(static_cast<float>(hidden)));
  in.b1 = fill(inner, 0.3f);
  in.w2 = fill(hidden * inner, 1.0f / std::sqrt(static_cast<float>(inner)));
  in.b2 = fill(hidden, 0.3f);
  in.x = fill(batch * hidden, 1.0f);
  in.dy = fill(batch * hidden, 0.1f);
  return in;
}

// Everything one block's forward and backward produce.
struct BlockOutputs {
  std::vector<float> pre, act, y, dx, dw1, db1, dw2, db2;
};

BlockOutputs RunCpu(const BlockInputs& in) {
  const int64_t b = in.batch, h = in.hidden, inner = internal::InnerSize(h);
  internal::UseSingleThreadedBlas();
  BlockOutputs out;
  out.pre.resize(static_cast<size_t>(b * inner));
  out.act.resize(out.pre.size());
  out.y.resize(static_cast<size_t>(b * h));
  out.dx.resize(out.y.size());
  out.dw1.resize(in.w1.size());
  out.db1.resize(in.b1.size());
  out.dw2.resize(in.w2.size());
  out.db2.resize(in.b2.size());
  std::vector<float> scratch(out.pre.size());
  const internal::BlockWeights w{in.w1.data(), in.b1.data(), in.w2.data(), in.b2.data()};
  internal::BlockForward(w, b, h, in.x.data(), out.pre.data(), out.act.data(), out.y.data());
  internal::BlockBackward(w, b, h, in.x.data(), out.pre.data(), out.act.data(), in.dy.data(),
                          scratch.data(), out.dx.data(),
                          {out.dw1.data(), out.db1.data(), out.dw2.data(), out.db2.data()});
  return out;
}

// The same on the device; `ok` false (with a test failure) on any error.
BlockOutputs RunGpu(CublasLtGemm& gemm, const BlockInputs& in, MatmulInputs inputs, bool* ok) {
  *ok = false;
  const int64_t b = in.batch, h = in.hidden, inner = internal::InnerSize(h);
  const size_t io = static_cast<size_t>(b * h), wide = static_cast<size_t>(b * inner);
  DeviceArray<float> w1(in.w1.size()), b1(in.b1.size()), w2(in.w2.size()), b2(in.b2.size());
  DeviceArray<float> x(io), dy(io), pre(wide), act(wide), y(io), dx(io);
  DeviceArray<float> dw1(in.w1.size()), db1(in.b1.size()), dw2(in.w2.size()), db2(in.b2.size());
  const size_t scratch_bytes = BlockScratchBytes(b, h, inputs);
  DeviceArray<unsigned char> scratch(scratch_bytes);
  // Outputs poisoned: the functions must overwrite every element.
  for (cudaError_t e :
       {w1.Upload(in.w1), b1.Upload(in.b1), w2.Upload(in.w2), b2.Upload(in.b2), x.Upload(in.x),
        dy.Upload(in.dy), scratch.error(), pre.Poison(), act.Poison(), y.Poison(), dx.Poison(),
        dw1.Poison(), db1.Poison(), dw2.Poison(), db2.Poison()}) {
    if (e != cudaSuccess) {
      ADD_FAILURE() << "device setup: " << cudaGetErrorString(e);
      return {};
    }
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    ADD_FAILURE() << "cudaStreamCreate failed";
    return {};
  }
  const BlockMathArgs args{b, h, inputs, scratch.get(), scratch_bytes};
  const DeviceBlockWeights w{w1.get(), b1.get(), w2.get(), b2.get()};
  absl::Status status =
      BlockForwardCuda(gemm, args, w, x.get(), pre.get(), act.get(), y.get(), stream);
  if (status.ok()) {
    status = BlockBackwardCuda(gemm, args, w, x.get(), pre.get(), act.get(), dy.get(), dx.get(),
                               {dw1.get(), db1.get(), dw2.get(), db2.get()}, stream);
  }
  const cudaError_t sync = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (!status.ok() || sync != cudaSuccess) {
    ADD_FAILURE() << status << " / " << cudaGetErrorString(sync);
    return {};
  }
  *ok = true;
  return {pre.Download(), act.Download(), y.Download(),   dx.Download(),
          dw1.Download(), db1.Download(), dw2.Download(), db2.Download()};
}

void ExpectClose(const BlockOutputs& gpu, const BlockOutputs& cpu, double tolerance,
                 const std::string& where) {
  const std::vector<
      std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>>>
      arrays = {{"pre", {&gpu.pre, &cpu.pre}}, {"act", {&gpu.act, &cpu.act}},
                {"y", {&gpu.y, &cpu.y}},       {"dx", {&gpu.dx, &cpu.dx}},
                {"dW1", {&gpu.dw1, &cpu.dw1}}, {"db1", {&gpu.db1, &cpu.db1}},
                {"dW2", {&gpu.dw2, &cpu.dw2}}, {"db2", {&gpu.db2, &cpu.db2}}};
  for (const auto& [name, pair] : arrays) {
    const RelError e = MaxRelError(*pair.first, *pair.second);
    EXPECT_LE(e.value, tolerance) << where << " " << name << " element " << e.index;
  }
}

TEST(MlpCudaBlockMath, Fp32MatchesCpuAndRepeatsBitwise) {
  ZS_SKIP_WITHOUT_DEVICE();
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed());
  absl::StatusOr<std::unique_ptr<CublasLtGemm>> gemm = CublasLtGemm::Create();
  ZS_ASSERT_OK(gemm.status());
  // Odd sizes too: leading dimensions that are not multiples of 4.
  for (const auto& [batch, hidden] :
       {std::pair<int64_t, int64_t>{1, 8}, {5, 24}, {7, 33}, {16, 128}}) {
    const std::string where =
        "batch " + std::to_string(batch) + " hidden " + std::to_string(hidden);
    const BlockInputs in = RandomBlock(batch, hidden, rng);
    const BlockOutputs cpu = RunCpu(in);
    bool ok = false;
    const BlockOutputs gpu = RunGpu(**gemm, in, MatmulInputs::kFp32, &ok);
    ASSERT_TRUE(ok) << where;
    ExpectClose(gpu, cpu, 2e-5, where + " fp32");
    // A GPU trainer's runs must repeat: same inputs, same bits.
    const BlockOutputs again = RunGpu(**gemm, in, MatmulInputs::kFp32, &ok);
    ASSERT_TRUE(ok) << where;
    EXPECT_EQ(std::memcmp(gpu.dw1.data(), again.dw1.data(), gpu.dw1.size() * sizeof(float)), 0)
        << where;
    EXPECT_EQ(std::memcmp(gpu.dx.data(), again.dx.data(), gpu.dx.size() * sizeof(float)), 0)
        << where;
  }
}

TEST(MlpCudaBlockMath, Bf16InputsMatchCpuLoosely) {
  ZS_SKIP_WITHOUT_DEVICE();
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed() + 1);
  absl::StatusOr<std::unique_ptr<CublasLtGemm>> gemm = CublasLtGemm::Create();
  ZS_ASSERT_OK(gemm.status());
  // hidden a multiple of 8: bf16 rows 16-byte aligned, as tensor cores want.
  for (const auto& [batch, hidden] : {std::pair<int64_t, int64_t>{4, 16}, {16, 128}}) {
    const std::string where =
        "batch " + std::to_string(batch) + " hidden " + std::to_string(hidden);
    const BlockInputs in = RandomBlock(batch, hidden, rng);
    const BlockOutputs cpu = RunCpu(in);
    bool ok = false;
    const BlockOutputs gpu = RunGpu(**gemm, in, MatmulInputs::kBf16, &ok);
    ASSERT_TRUE(ok) << where;
    ExpectClose(gpu, cpu, 5e-2, where + " bf16");
    // The operands really were rounded: pre differs beyond fp32 noise.
    EXPECT_GT(MaxRelError(gpu.pre, cpu.pre).value, 1e-4) << where;
  }
}

// Double-precision loss of one block on the host: MSE(block(x), target).
double HostLoss(const std::vector<double>& w1, const std::vector<double>& b1,
                const std::vector<double>& w2, const std::vector<double>& b2,
                const std::vector<double>& x, const std::vector<float>& target, int64_t batch,
                int64_t hidden) {
  const int64_t inner = internal::InnerSize(hidden);
  double sum = 0.0;
  std::vector<double> act(static_cast<size_t>(inner));
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t i = 0; i < inner; ++i) {
      double a = b1[i];
      for (int64_t j = 0; j < hidden; ++j) a += w1[i * hidden + j] * x[r * hidden + j];
      act[i] = 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
    }
    for (int64_t j = 0; j < hidden; ++j) {
      double y = x[r * hidden + j] + b2[j];
      for (int64_t i = 0; i < inner; ++i) y += w2[j * inner + i] * act[i];
      const double diff = y - target[r * hidden + j];
      sum += diff * diff;
    }
  }
  return sum / static_cast<double>(batch * hidden);
}

TEST(MlpCudaBlockMath, GradientsMatchDoubleFiniteDifferences) {
  ZS_SKIP_WITHOUT_DEVICE();
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed() + 2);
  absl::StatusOr<std::unique_ptr<CublasLtGemm>> gemm = CublasLtGemm::Create();
  ZS_ASSERT_OK(gemm.status());
  const int64_t batch = 3, hidden = 6, inner = internal::InnerSize(hidden);
  const size_t io = static_cast<size_t>(batch * hidden), wide = static_cast<size_t>(batch * inner);
  const BlockInputs in = RandomBlock(batch, hidden, rng);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> target(io);
  for (float& t : target) t = normal(rng);

  // GPU: forward, loss, backward from the loss's dL/dy.
  DeviceArray<float> w1(in.w1.size()), b1(in.b1.size()), w2(in.w2.size()), b2(in.b2.size());
  DeviceArray<float> x(io), tgt(io), pre(wide), act(wide), y(io), dy(io), dx(io);
  DeviceArray<float> dw1(in.w1.size()), db1(in.b1.size()), dw2(in.w2.size()), db2(in.b2.size());
  DeviceArray<double> loss(1);
  DeviceArray<unsigned char> scratch(BlockScratchBytes(batch, hidden, MatmulInputs::kFp32));
  DeviceArray<unsigned char> loss_scratch(MseScratchBytes());
  ZS_ASSERT_CUDA(w1.Upload(in.w1));
  ZS_ASSERT_CUDA(b1.Upload(in.b1));
  ZS_ASSERT_CUDA(w2.Upload(in.w2));
  ZS_ASSERT_CUDA(b2.Upload(in.b2));
  ZS_ASSERT_CUDA(x.Upload(in.x));
  ZS_ASSERT_CUDA(tgt.Upload(target));
  ZS_ASSERT_CUDA(scratch.error());
  ZS_ASSERT_CUDA(loss_scratch.error());
  const BlockMathArgs args{batch, hidden, MatmulInputs::kFp32, scratch.get(),
                           BlockScratchBytes(batch, hidden, MatmulInputs::kFp32)};
  const DeviceBlockWeights w{w1.get(), b1.get(), w2.get(), b2.get()};
  cudaStream_t stream = nullptr;
  ZS_ASSERT_CUDA(cudaStreamCreate(&stream));
  ZS_ASSERT_OK(BlockForwardCuda(**gemm, args, w, x.get(), pre.get(), act.get(), y.get(), stream));
  ZS_ASSERT_OK(MseLossCuda(y.get(), tgt.get(), static_cast<int64_t>(io), dy.get(),
                           loss_scratch.get(), MseScratchBytes(), loss.get(), stream));
  ZS_ASSERT_OK(BlockBackwardCuda(**gemm, args, w, x.get(), pre.get(), act.get(), dy.get(), dx.get(),
                                 {dw1.get(), db1.get(), dw2.get(), db2.get()}, stream));
  const absl::StatusOr<double> gpu_loss = ReadLoss(loss.get(), stream);
  ZS_ASSERT_OK(gpu_loss.status());
  ZS_ASSERT_CUDA(cudaStreamDestroy(stream));

  std::vector<std::vector<double>> p = {{in.w1.begin(), in.w1.end()},
                                        {in.b1.begin(), in.b1.end()},
                                        {in.w2.begin(), in.w2.end()},
                                        {in.b2.begin(), in.b2.end()},
                                        {in.x.begin(), in.x.end()}};
  auto loss_of = [&] { return HostLoss(p[0], p[1], p[2], p[3], p[4], target, batch, hidden); };
  const double ref_loss = loss_of();
  ASSERT_GT(ref_loss, 0.1);  // far from a minimum: the gradients are not tiny
  EXPECT_NEAR(*gpu_loss, ref_loss, 1e-5 * ref_loss);

  const std::vector<std::vector<float>> grads = {dw1.Download(), db1.Download(), dw2.Download(),
                                                 db2.Download(), dx.Download()};
  const char* names[] = {"dW1", "db1", "dW2", "db2", "dx"};
  std::uniform_int_distribution<size_t> pick(0, std::numeric_limits<size_t>::max());
  const double eps = 1e-6;
  for (size_t t = 0; t < p.size(); ++t) {
    // A few elements of each: the first, the last and three at random.
    std::vector<size_t> elements = {0, p[t].size() - 1};
    for (int k = 0; k < 3; ++k) elements.push_back(pick(rng) % p[t].size());
    for (size_t i : elements) {
      const double saved = p[t][i];
      p[t][i] = saved + eps;
      const double up = loss_of();
      p[t][i] = saved - eps;
      const double down = loss_of();
      p[t][i] = saved;
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grads[t][i], fd, 1e-4 + 1e-3 * std::fabs(fd)) << names[t] << " element " << i;
    }
  }
}

TEST(MlpCudaBlockMath, MseLossMatchesCpu) {
  ZS_SKIP_WITHOUT_DEVICE();
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed() + 3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Below one block, one full grid of 256 x 256, and several grid strides.
  for (size_t n : {size_t{1}, size_t{255}, size_t{65536 + 17}, size_t{(1 << 20) + 3}}) {
    std::vector<float> out(n), target(n), cpu_dout(n);
    for (size_t i = 0; i < n; ++i) {
      out[i] = normal(rng);
      target[i] = normal(rng);
    }
    const double cpu_loss =
        internal::MseLoss(out.data(), target.data(), static_cast<int64_t>(n), cpu_dout.data());
    DeviceArray<float> d_out(n), d_target(n), d_dout(n);
    DeviceArray<double> d_loss(1);
    DeviceArray<unsigned char> scratch(MseScratchBytes());
    ZS_ASSERT_CUDA(d_out.Upload(out));
    ZS_ASSERT_CUDA(d_target.Upload(target));
    ZS_ASSERT_CUDA(scratch.error());
    ZS_ASSERT_OK(MseLossCuda(d_out.get(), d_target.get(), static_cast<int64_t>(n), d_dout.get(),
                             scratch.get(), MseScratchBytes(), d_loss.get(), nullptr));
    const absl::StatusOr<double> gpu_loss = ReadLoss(d_loss.get(), nullptr);
    ZS_ASSERT_OK(gpu_loss.status());
    EXPECT_NEAR(*gpu_loss, cpu_loss, 1e-12 * cpu_loss) << "n " << n;
    const std::vector<float> gpu_dout = d_dout.Download();
    EXPECT_EQ(std::memcmp(gpu_dout.data(), cpu_dout.data(), n * sizeof(float)), 0) << "n " << n;
  }
  EXPECT_EQ(MseLossCuda(nullptr, nullptr, 0, nullptr, nullptr, 0, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// Values that exercise every rounding rule: normals of many scales, ties,
// fp16 overflow and subnormals, infinities and NaNs.
std::vector<float> ConversionInputs(std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-30.0f, 20.0f);
  std::vector<float> v;
  for (int i = 0; i < 100000; ++i) v.push_back(std::pow(2.0f, decade(rng)) * normal(rng));
  for (float s : {1.0f, -1.0f}) {
    for (float x :
         {0.0f, 65504.0f, 65519.0f, 65520.0f, 1e5f, 5.9604645e-8f, 2.9802322e-8f, 1.0f + 0x1p-8f,
          1.0f + 0x1p-11f, 1e-40f, std::numeric_limits<float>::max(),
          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      v.push_back(s * x);
    }
  }
  return v;
}

TEST(MlpCudaViewConvert, MatchesFloat16RulesBitwise) {
  ZS_SKIP_WITHOUT_DEVICE();
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed() + 4);
  const std::vector<float> values = ConversionInputs(rng);
  const size_t n = values.size();
  DeviceArray<float> d_values(n), d_wide(n);
  DeviceArray<uint16_t> d_narrow(n);
  ZS_ASSERT_CUDA(d_values.Upload(values));
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const bool bf16 = dtype == DType::kBFloat16;
    TensorView view;
    view.data = d_narrow.get();
    view.dtype = dtype;
    view.numel = static_cast<int64_t>(n);
    ZS_ASSERT_OK(WriteFromFp32Cuda(d_values.get(), view, nullptr));
    ZS_ASSERT_OK(ReadAsFp32Cuda(view, d_wide.get(), nullptr));
    ZS_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<uint16_t> narrow = d_narrow.Download();
    const std::vector<float> wide = d_wide.Download();
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want =
          bf16 ? kernels::Fp32ToBf16Rne(values[i]) : kernels::Fp32ToFp16Rne(values[i]);
      ASSERT_EQ(narrow[i], want) << DTypeName(dtype) << " narrowing of " << values[i];
      const float widened = bf16 ? kernels::Bf16ToFp32(want) : kernels::Fp16ToFp32(want);
      ASSERT_EQ(kernels::Fp32AsBits(wide[i]), kernels::Fp32AsBits(widened))
          << DTypeName(dtype) << " widening of 0x" << std::hex << want;
    }
  }
  // fp32 views are copies; other dtypes are refused by name.
  TensorView fp32_view{d_wide.get(), DType::kFloat32, static_cast<int64_t>(n), nullptr};
  ZS_ASSERT_OK(WriteFromFp32Cuda(d_values.get(), fp32_view, nullptr));
  ZS_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> copy = d_wide.Download();
  EXPECT_EQ(std::memcmp(copy.data(), values.data(), n * sizeof(float)), 0);
  TensorView f64_view{d_wide.get(), DType::kFloat64, 1, nullptr};
  const absl::Status refused = ReadAsFp32Cuda(f64_view, d_values.get(), nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("fp32, bf16 and fp16"), absl::string_view::npos) << refused;
}

TEST(MlpCudaBlockMath, RejectsBadArgumentsByName) {
  ZS_SKIP_WITHOUT_DEVICE();
  absl::StatusOr<std::unique_ptr<CublasLtGemm>> gemm = CublasLtGemm::Create();
  ZS_ASSERT_OK(gemm.status());
  DeviceArray<float> a(64);
  ZS_ASSERT_CUDA(a.error());
  RowMajorGemmArgs bad;
  bad.m = 2;
  bad.n = 2;
  bad.k = 4;
  bad.a = a.get();
  bad.lda = 3;  // below k
  bad.b = a.get();
  bad.ldb = 2;
  bad.c = a.get() + 32;
  bad.ldc = 2;
  const absl::Status lda = (*gemm)->RowMajor(bad, nullptr, "test product");
  EXPECT_EQ(lda.code(), absl::StatusCode::kInvalidArgument) << lda;
  EXPECT_NE(lda.message().find("test product"), absl::string_view::npos) << lda;

  const BlockMathArgs too_little{4, 8, MatmulInputs::kFp32, a.get(), 16};
  const DeviceBlockWeights w{a.get(), a.get(), a.get(), a.get()};
  const absl::Status scratch =
      BlockForwardCuda(**gemm, too_little, w, a.get(), a.get(), a.get(), a.get(), nullptr);
  EXPECT_EQ(scratch.code(), absl::StatusCode::kInvalidArgument) << scratch;
  EXPECT_NE(scratch.message().find("BlockScratchBytes"), absl::string_view::npos) << scratch;
}

}  // namespace
}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
