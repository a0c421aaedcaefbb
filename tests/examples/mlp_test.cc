// Tests of the residual-MLP example that need no engine: the backward pass
// against double-precision finite differences, the sampler's sharding, the
// fixed teacher, the initialisation and the view dtype conversions. The
// trainer's tests are in mlp_trainer_test.cc.
#include "examples/mlp/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "examples/common/rng.h"
#include "examples/mlp/internal/block_math.h"
#include "examples/mlp/internal/view_convert.h"
#include "gtest/gtest.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

using internal::BlockGradients;
using internal::BlockWeights;
using internal::ForwardState;

// All params of a network, [unit * 4 + param], fp32 and double copies.
struct Params {
  std::vector<std::vector<float>> f;
  std::vector<std::vector<double>> d;
};

Params MakeParams(const MlpConfig& cfg, uint64_t seed) {
  Params params;
  for (int u = 0; u < cfg.blocks; ++u) {
    for (int p = 0; p < kNumBlockParams; ++p) {
      std::vector<float> v = RandomParam(cfg, seed, u, p);
      // Biases of 0.02 would leave the bias paths nearly untested: make them O(0.3).
      if (p == kB1 || p == kB2) {
        for (float& x : v) x *= 15.0f;
      }
      params.d.emplace_back(v.begin(), v.end());
      params.f.push_back(std::move(v));
    }
  }
  return params;
}

std::vector<BlockWeights> Views(const Params& params, int blocks) {
  std::vector<BlockWeights> views;
  for (int u = 0; u < blocks; ++u) {
    const auto* p = &params.f[static_cast<size_t>(u) * kNumBlockParams];
    views.push_back({p[kW1].data(), p[kB1].data(), p[kW2].data(), p[kB2].data()});
  }
  return views;
}

std::vector<float> RandomNormal(uint64_t seed, int64_t n, double scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * examples::NormalAt(seed, i));
  return v;
}

// Double-precision forward of the whole network; returns the network output.
std::vector<double> ReferenceForward(const MlpConfig& cfg,
                                     const std::vector<std::vector<double>>& p,
                                     const std::vector<float>& x) {
  const int64_t b = cfg.micro_batch, h = cfg.hidden, inner = 4 * h;
  std::vector<double> cur(x.begin(), x.end());
  for (int u = 0; u < cfg.blocks; ++u) {
    const auto* w = &p[static_cast<size_t>(u) * kNumBlockParams];
    std::vector<double> next(cur);
    for (int64_t r = 0; r < b; ++r) {
      std::vector<double> act(static_cast<size_t>(inner));
      for (int64_t i = 0; i < inner; ++i) {
        double a = w[kB1][i];
        for (int64_t j = 0; j < h; ++j) a += w[kW1][i * h + j] * cur[r * h + j];
        act[i] = 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
      }
      for (int64_t j = 0; j < h; ++j) {
        double z = w[kB2][j];
        for (int64_t i = 0; i < inner; ++i) z += w[kW2][j * inner + i] * act[i];
        next[r * h + j] += z;
      }
    }
    cur = std::move(next);
  }
  return cur;
}

double ReferenceLoss(const MlpConfig& cfg, const std::vector<std::vector<double>>& p,
                     const std::vector<float>& x, const std::vector<float>& target) {
  const std::vector<double> out = ReferenceForward(cfg, p, x);
  double sum = 0.0;
  for (size_t i = 0; i < out.size(); ++i) sum += (out[i] - target[i]) * (out[i] - target[i]);
  return sum / static_cast<double>(out.size());
}

// fp32 gradients of every param through the code the trainer runs.
std::vector<std::vector<float>> AnalyticGrads(const MlpConfig& cfg, const Params& params,
                                              const std::vector<float>& x,
                                              const std::vector<float>& target, double* loss) {
  const int64_t b = cfg.micro_batch, h = cfg.hidden;
  ForwardState state;
  state.Resize(cfg.blocks, b, h);
  const std::vector<BlockWeights> views = Views(params, cfg.blocks);
  internal::NetworkForward(views, b, h, x.data(), &state);
  std::vector<float> dy(static_cast<size_t>(b * h)), dx(dy.size()), scratch(4 * dy.size());
  *loss = internal::MseLoss(state.output().data(), target.data(), b * h, dy.data());
  std::vector<std::vector<float>> grads;
  for (const auto& p : params.f)
    grads.emplace_back(p.size(), -1.0f);  // poison: must be overwritten
  for (int u = cfg.blocks - 1; u >= 0; --u) {
    auto* g = &grads[static_cast<size_t>(u) * kNumBlockParams];
    internal::BlockBackward(
        views[u], b, h, state.inputs[u].data(), state.pre[u].data(), state.act[u].data(), dy.data(),
        scratch.data(), dx.data(),
        BlockGradients{g[kW1].data(), g[kB1].data(), g[kW2].data(), g[kB2].data()});
    std::swap(dy, dx);
  }
  return grads;
}

TEST(MlpBlockMath, ForwardMatchesDoubleReference) {
  MlpConfig cfg;
  cfg.hidden = 16;
  cfg.blocks = 3;
  cfg.micro_batch = 5;
  const Params params = MakeParams(cfg, 101);
  const std::vector<float> x = RandomNormal(7, cfg.micro_batch * cfg.hidden, 1.0);
  ForwardState state;
  state.Resize(cfg.blocks, cfg.micro_batch, cfg.hidden);
  internal::NetworkForward(Views(params, cfg.blocks), cfg.micro_batch, cfg.hidden, x.data(),
                           &state);
  const std::vector<double> ref = ReferenceForward(cfg, params.d, x);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(state.output()[i], ref[i], 1e-5 * (1.0 + std::fabs(ref[i]))) << "element " << i;
  }
}

TEST(MlpBlockMath, GradientsMatchDoubleFiniteDifferences) {
  MlpConfig cfg;
  cfg.hidden = 6;
  cfg.blocks = 2;
  cfg.micro_batch = 3;
  Params params = MakeParams(cfg, 202);
  const int64_t n = cfg.micro_batch * cfg.hidden;
  const std::vector<float> x = RandomNormal(11, n, 1.0);
  const std::vector<float> target = RandomNormal(13, n, 1.5);
  double loss = 0.0;
  const std::vector<std::vector<float>> grads = AnalyticGrads(cfg, params, x, target, &loss);
  ASSERT_GT(loss, 0.1);  // far from a minimum: the gradients are not tiny
  EXPECT_NEAR(loss, ReferenceLoss(cfg, params.d, x, target), 1e-5 * loss);

  const double eps = 1e-6;
  for (size_t t = 0; t < params.d.size(); ++t) {
    for (size_t i = 0; i < params.d[t].size(); ++i) {
      const double saved = params.d[t][i];
      params.d[t][i] = saved + eps;
      const double up = ReferenceLoss(cfg, params.d, x, target);
      params.d[t][i] = saved - eps;
      const double down = ReferenceLoss(cfg, params.d, x, target);
      params.d[t][i] = saved;
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grads[t][i], fd, 1e-4 + 1e-3 * std::fabs(fd))
          << "block " << t / kNumBlockParams << " param " << t % kNumBlockParams << " element "
          << i;
    }
  }
}

TEST(MlpBlockMath, GeluGradMatchesFiniteDifferences) {
  for (double x : {-4.0, -1.3, -0.2, 0.0, 0.4, 1.7, 3.5}) {
    const double eps = 1e-3;
    const double fd = (internal::Gelu(static_cast<float>(x + eps)) -
                       internal::Gelu(static_cast<float>(x - eps))) /
                      (2 * eps);
    EXPECT_NEAR(internal::GeluGrad(static_cast<float>(x)), fd, 1e-3) << "x = " << x;
  }
}

// Gelu and GeluGrad are fp32 approximations (block_math.h): against the
// double-precision definitions on a dense grid, within 4e-7 (1 + |value|),
// and Gelu keeps its relative accuracy in the negative tail (where
// 1 + erf(x / sqrt(2)) would cancel).
TEST(MlpBlockMath, GeluMatchesDoubleReference) {
  double worst = 0.0, worst_grad = 0.0, worst_tail = 0.0;
  for (double xd = -12.0; xd <= 12.0; xd += 1e-4) {
    const float x = static_cast<float>(xd);
    const double ref = 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    const double ref_grad =
        0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    worst = std::max(worst, std::fabs(internal::Gelu(x) - ref) / (1.0 + std::fabs(ref)));
    worst_grad = std::max(
        worst_grad, std::fabs(internal::GeluGrad(x) - ref_grad) / (1.0 + std::fabs(ref_grad)));
    if (x < 0.0f && x > -8.0f) {
      worst_tail = std::max(worst_tail, std::fabs(internal::Gelu(x) - ref) / std::fabs(ref));
    }
  }
  EXPECT_LE(worst, 4e-7);
  EXPECT_LE(worst_grad, 4e-7);
  EXPECT_LE(worst_tail, 1e-5);
}

// The vectorized loops compute the scalar functions' bits exactly.
TEST(MlpBlockMath, FusedGeluLoopsMatchTheScalarFunctionsBitwise) {
  const int64_t rows = 3, cols = 37;  // not a multiple of any vector width
  const std::vector<float> bias = RandomNormal(23, cols, 0.5);
  const std::vector<float> pre0 = RandomNormal(29, rows * cols, 3.0);
  const std::vector<float> dact = RandomNormal(31, rows * cols, 1.0);
  std::vector<float> pre = pre0, act(pre.size()), dpre = dact, db1(cols);
  internal::BiasGelu(bias.data(), rows, cols, pre.data(), act.data());
  internal::GeluBackwardBiasGrad(pre.data(), rows, cols, dpre.data(), db1.data());
  for (int64_t c = 0; c < cols; ++c) {
    float sum = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r * cols + c;
      const float p = pre0[i] + bias[c];
      const float raw = dact[i] * internal::GeluGrad(p);
      const float d = std::fabs(raw) < std::numeric_limits<float>::min() ? 0.0f : raw;
      EXPECT_EQ(std::memcmp(&pre[i], &p, sizeof(float)), 0) << i;
      const float a = internal::Gelu(p);
      EXPECT_EQ(std::memcmp(&act[i], &a, sizeof(float)), 0) << i;
      EXPECT_EQ(std::memcmp(&dpre[i], &d, sizeof(float)), 0) << i;
      sum += d;
    }
    EXPECT_EQ(std::memcmp(&db1[c], &sum, sizeof(float)), 0) << c;
  }
}

// A GELU gradient below FLT_MIN is written as 0 (and summed as 0 into
// db1): subnormal sgemm operands stall SSE kernels. Normal ones are kept.
TEST(MlpBlockMath, SubnormalGeluGradientsAreFlushed) {
  const int64_t rows = 2, cols = 19;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  std::vector<float> pre(rows * cols), dpre(rows * cols), raw(rows * cols), db1(cols);
  int subnormal = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    // Every third far in the negative tail (GeluGrad ~1e-37) times a small
    // upstream gradient: a subnormal product; the others ordinary.
    pre[i] = i % 3 == 0 ? -12.9f : unit(rng) - 1.25f;
    dpre[i] = (i % 3 == 0 ? 1e-4f : 1.0f) * unit(rng);
    raw[i] = dpre[i] * internal::GeluGrad(pre[i]);
    subnormal += std::fpclassify(raw[i]) == FP_SUBNORMAL;
  }
  ASSERT_GT(subnormal, 0) << "the inputs must make subnormal products";
  const std::vector<float> zero_bias(cols, 0.0f);
  std::vector<float> act(rows * cols), pre_in = pre;
  internal::BiasGelu(zero_bias.data(), rows, cols, pre_in.data(), act.data());
  internal::GeluBackwardBiasGrad(pre_in.data(), rows, cols, dpre.data(), db1.data());
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (std::fpclassify(raw[i]) == FP_SUBNORMAL) {
      EXPECT_EQ(dpre[i], 0.0f) << i;
      EXPECT_FALSE(std::signbit(dpre[i])) << i;
    } else {
      EXPECT_EQ(dpre[i], raw[i]) << i;
    }
  }
}

TEST(MlpBlockMath, MicroBatchGradientsAreBitwiseRepeatable) {
  MlpConfig cfg;
  cfg.hidden = 32;
  cfg.blocks = 2;
  cfg.micro_batch = 8;
  const Params params = MakeParams(cfg, 303);
  const std::vector<float> x = RandomNormal(17, cfg.micro_batch * cfg.hidden, 1.0);
  const std::vector<float> target = RandomNormal(19, cfg.micro_batch * cfg.hidden, 1.0);
  double loss_a = 0.0, loss_b = 0.0;
  const auto a = AnalyticGrads(cfg, params, x, target, &loss_a);
  const auto b = AnalyticGrads(cfg, params, x, target, &loss_b);
  EXPECT_EQ(std::memcmp(&loss_a, &loss_b, sizeof(double)), 0);
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)), 0) << t;
  }
}

TEST(MlpModelSpec, UnitsParamsAndNoDecay) {
  MlpConfig cfg;
  cfg.hidden = 8;
  cfg.blocks = 3;
  const ModelSpec spec = BuildModelSpec(cfg);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  ASSERT_EQ(spec.units.size(), 3u);
  EXPECT_EQ(spec.units[2].name, "block.2");
  ASSERT_EQ(spec.units[0].params.size(), 4u);
  const auto& p = spec.units[0].params;
  EXPECT_EQ(p[kW1].name, "w1");
  EXPECT_EQ(p[kW1].shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(p[kB1].shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(p[kW2].shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(p[kB2].name, "b2");
  EXPECT_FALSE(p[kW1].no_decay);
  EXPECT_TRUE(p[kB1].no_decay);
  EXPECT_FALSE(p[kW2].no_decay);
  EXPECT_TRUE(p[kB2].no_decay);
  EXPECT_EQ(spec.NumParams(), 3 * (8 * 8 * 8 + 5 * 8));
}

TEST(MlpInit, DeterministicScaledAndNonZero) {
  MlpConfig cfg;
  cfg.hidden = 64;
  cfg.blocks = 2;
  for (int p = 0; p < kNumBlockParams; ++p) {
    const std::vector<float> v = InitialParam(cfg, 1, p);
    ASSERT_EQ(v, InitialParam(cfg, 1, p));
    ASSERT_NE(v, InitialParam(cfg, 0, p));
    ASSERT_NE(v, RandomParam(cfg, cfg.teacher_seed, 1, p));
    double sum_sq = 0.0;
    for (float x : v) sum_sq += static_cast<double>(x) * x;
    const double std_dev = std::sqrt(sum_sq / v.size());
    const double expected = p == kW1 ? 1.0 / 8 : p == kW2 ? 1.0 / 16 : 0.02;
    EXPECT_NEAR(std_dev, expected, 0.15 * expected) << "param " << p;
  }
  EXPECT_TRUE(InitialParam(cfg, 2, 0).empty());
  EXPECT_TRUE(InitialParam(cfg, 0, 4).empty());
}

TEST(MlpSampler, InputsAreStandardNormal) {
  MlpConfig cfg;
  cfg.hidden = 64;
  const DistributedSampler sampler(cfg, 1, 0, 1);
  double sum = 0.0, sum_sq = 0.0;
  const int64_t n = 200000;
  for (int64_t i = 0; i < n; ++i) {
    const double v = sampler.InputAt(i / 64, i % 64);
    sum += v;
    sum_sq += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);
}

TEST(MlpSampler, RanksAreDisjointCoverTheGlobalBatchAndMatchOneRank) {
  MlpConfig cfg;
  cfg.hidden = 4;
  cfg.blocks = 1;
  cfg.micro_batch = 3;
  const std::vector<std::pair<int, int>> cases = {{1, 1}, {2, 1}, {4, 1}, {3, 2}, {2, 4}, {4, 3}};
  for (const auto& [world, accum] : cases) {
    const DistributedSampler single(cfg, 1, 0, world * accum);
    const int64_t global = static_cast<int64_t>(world) * accum * cfg.micro_batch;
    for (int64_t step = 0; step < 3; ++step) {
      std::set<int64_t> seen;
      int64_t count = 0;
      for (int r = 0; r < world; ++r) {
        const DistributedSampler sampler(cfg, world, r, accum);
        for (int m = 0; m < accum; ++m) {
          const std::vector<int64_t> ids = sampler.SampleIds(step, m);
          ASSERT_EQ(ids.size(), static_cast<size_t>(cfg.micro_batch));
          EXPECT_EQ(ids, single.SampleIds(step, r * accum + m))
              << "world " << world << " accum " << accum << " rank " << r << " micro " << m;
          for (int64_t id : ids) {
            EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " given twice";
            ++count;
          }
        }
      }
      EXPECT_EQ(count, global);
      ASSERT_FALSE(seen.empty());
      EXPECT_EQ(*seen.begin(), step * global) << "world " << world << " accum " << accum;
      EXPECT_EQ(*seen.rbegin(), (step + 1) * global - 1);
    }
  }
}

TEST(MlpSampler, SameMicroBatchSameBitsOnEveryRank) {
  MlpConfig cfg;
  cfg.hidden = 16;
  cfg.blocks = 2;
  cfg.micro_batch = 4;
  const int world = 3, accum = 2;
  const DistributedSampler single(cfg, 1, 0, world * accum);
  const size_t n = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  std::vector<float> x(n), y(n), x1(n), y1(n);
  for (int r = 0; r < world; ++r) {
    const DistributedSampler sampler(cfg, world, r, accum);
    for (int m = 0; m < accum; ++m) {
      sampler.Fill(5, m, x.data(), y.data());
      single.Fill(5, r * accum + m, x1.data(), y1.data());
      EXPECT_EQ(std::memcmp(x.data(), x1.data(), n * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(y.data(), y1.data(), n * sizeof(float)), 0);
    }
  }
}

TEST(MlpTeacher, FixedByTeacherSeedOnly) {
  MlpConfig cfg;
  cfg.hidden = 16;
  cfg.blocks = 2;
  cfg.micro_batch = 4;
  const size_t n = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  std::vector<float> x(n), y(n), x2(n), y2(n);
  const DistributedSampler sampler(cfg, 1, 0, 1);
  sampler.Fill(0, 0, x.data(), y.data());

  // The teacher does not drift between calls (it is never trained).
  sampler.Fill(1, 0, x2.data(), y2.data());
  sampler.Fill(0, 0, x2.data(), y2.data());
  EXPECT_EQ(y, y2);

  // The trained model's seed does not change the teacher.
  MlpConfig other_init = cfg;
  other_init.init_seed = 99;
  DistributedSampler(other_init, 1, 0, 1).Fill(0, 0, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);

  // Its own seed does; and it computes a residual MLP of the inputs.
  MlpConfig other_teacher = cfg;
  other_teacher.teacher_seed = 98;
  DistributedSampler(other_teacher, 1, 0, 1).Fill(0, 0, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
  EXPECT_NE(y, y2);

  std::vector<std::vector<double>> teacher;
  for (int u = 0; u < cfg.blocks; ++u) {
    for (int p = 0; p < kNumBlockParams; ++p) {
      const std::vector<float> v = RandomParam(cfg, cfg.teacher_seed, u, p);
      teacher.emplace_back(v.begin(), v.end());
    }
  }
  const std::vector<double> ref = ReferenceForward(cfg, teacher, x);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], ref[i], 1e-5 * (1.0 + std::fabs(ref[i])));
}

TEST(MlpConfig, ValidateNamesTheField) {
  MlpConfig cfg;
  EXPECT_TRUE(cfg.Validate().ok());
  cfg.micro_batch = 0;
  EXPECT_EQ(cfg.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cfg.Validate().message().find("micro_batch"), std::string::npos);
}

// Values that stress the 16-bit conversions: ordinary magnitudes, ties,
// fp16 subnormals and values past fp16's range (65504).
std::vector<float> ConversionInputs() {
  std::vector<float> v = RandomNormal(23, 512, 3.0);
  // 1e6 and -1e6, 6th and 5th from the end, overflow fp16 (checked below).
  const float special[] = {0.0f,
                           -0.0f,
                           1.0f,
                           -2.5f,
                           65504.0f,
                           65520.0f,
                           1e6f,
                           -1e6f,
                           6.0e-8f,
                           3.0e-5f,
                           1.0f + 1.0f / 2048.0f,
                           1.0f + 3.0f / 2048.0f};
  v.insert(v.end(), std::begin(special), std::end(special));
  return v;
}

TEST(MlpViewConvert, Fp16WriteThenReadRoundsOnceAndIsStable) {
  const std::vector<float> src = ConversionInputs();
  std::vector<uint16_t> storage(src.size(), 0xdeadu);
  TensorView view;
  view.data = storage.data();
  view.dtype = DType::kFloat16;
  view.numel = static_cast<int64_t>(src.size());
  ASSERT_TRUE(internal::WriteFromFp32(src.data(), view).ok());
  std::vector<float> back(src.size());
  ASSERT_TRUE(internal::ReadAsFp32(view, back.data()).ok());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(storage[i], Fp32ToFp16(src[i])) << "element " << i << " = " << src[i];
    EXPECT_EQ(back[i], Fp16ToFp32(storage[i])) << "element " << i;
    // Once rounded, a value is representable: a second trip changes nothing.
    EXPECT_EQ(Fp32ToFp16(back[i]), storage[i]) << "element " << i;
    if (std::fabs(src[i]) <= 65504.0f && std::fabs(src[i]) >= 6.2e-5f) {
      // Normal range: relative error at most 2^-11 (half an fp16 ulp).
      EXPECT_LE(std::fabs(back[i] - src[i]), std::ldexp(std::fabs(src[i]), -11)) << src[i];
    }
  }
  // Past the range: infinity (what loss scaling detects), sign kept.
  EXPECT_TRUE(std::isinf(back[src.size() - 6]) && back[src.size() - 6] > 0);
  EXPECT_TRUE(std::isinf(back[src.size() - 5]) && back[src.size() - 5] < 0);
}

TEST(MlpViewConvert, EveryDTypeRoundTripsItsOwnValues) {
  const std::vector<float> src = RandomNormal(29, 300, 2.0);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint8_t> storage(src.size() * DTypeSize(dtype), 0xff);
    TensorView view;
    view.data = storage.data();
    view.dtype = dtype;
    view.numel = static_cast<int64_t>(src.size());
    std::vector<float> first(src.size()), second(src.size());
    ASSERT_TRUE(internal::WriteFromFp32(src.data(), view).ok()) << DTypeName(dtype);
    ASSERT_TRUE(internal::ReadAsFp32(view, first.data()).ok());
    ASSERT_TRUE(internal::WriteFromFp32(first.data(), view).ok());
    ASSERT_TRUE(internal::ReadAsFp32(view, second.data()).ok());
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0)
        << DTypeName(dtype);
    if (dtype == DType::kFloat32) {
      EXPECT_EQ(first, src);
    }
  }
}

TEST(MlpViewConvert, RejectsOtherDTypesAndMissingData) {
  std::vector<double> storage(4, 1.0);
  std::vector<float> values(4, 0.5f);
  TensorView view;
  view.data = storage.data();
  view.dtype = DType::kFloat64;
  view.numel = 4;
  EXPECT_EQ(internal::ReadAsFp32(view, values.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(internal::WriteFromFp32(values.data(), view).code(),
            absl::StatusCode::kInvalidArgument);
  view.dtype = DType::kFloat16;
  view.data = nullptr;
  EXPECT_EQ(internal::WriteFromFp32(values.data(), view).code(),
            absl::StatusCode::kInvalidArgument);
}
}  // namespace
}  // namespace mlp
}  // namespace zeroshard
