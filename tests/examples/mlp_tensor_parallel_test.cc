// Megatron's tensor-parallel block math (column-parallel W1, row-parallel
// W2, rank-order sums of the partial output and of the input gradient's
// partials) against a double-precision single-device reference, and the
// slicing / joining of params by ParamSpec::tp_split_dim.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "examples/common/rng.h"
#include "examples/mlp/grid_trainer.h"
#include "examples/mlp/internal/block_math.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace mlp {
namespace {

using internal::BlockGradients;
using internal::BlockWeights;
using testing::SeedTrace;

constexpr double kUnitRoundoff = 0x1p-24;  // fp32, round to nearest

// Higham's gamma_n = n u / (1 - n u): a sum or dot product of n terms in
// fp32, in any order, is within gamma_n * sum |terms| of the exact value.
double Gamma(int64_t n) { return n * kUnitRoundoff / (1 - n * kUnitRoundoff); }

// Bounds of GELU's derivatives, |gelu'| <= 1.13 and |gelu''| <= 0.8: how far
// an error in pre moves act and gelu'(pre).
constexpr double kGeluLipschitz = 1.13;
constexpr double kGeluGradLipschitz = 0.8;

std::vector<float> Normal(uint64_t key, int64_t n, double scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * examples::NormalAt(key, i));
  return v;
}

double Gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double GeluGrad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

// One block's results: y, then dx, dW1, db1, dW2, db2.
struct BlockResult {
  std::vector<double> y, dx, w1, b1, w2, b2;
};

// The block in double (`abs` = false), or its magnitude chain (`abs` =
// true): every input by its absolute value, every sum of absolute terms,
// and each elementwise function by its Lipschitz bound, so that
// gamma_n * magnitude bounds the fp32 error of a computation of depth n
// (Higham, Accuracy and Stability, 3.1 and 3.5).
BlockResult Reference(const std::vector<std::vector<float>>& p, const std::vector<float>& x,
                      const std::vector<float>& dy, int64_t b, int64_t h, bool abs) {
  const int64_t inner = 4 * h;
  auto v = [abs](double a) { return abs ? std::fabs(a) : a; };
  BlockResult r;
  r.y.assign(b * h, 0.0);
  r.dx.assign(b * h, 0.0);
  r.w1.assign(inner * h, 0.0);
  r.b1.assign(inner, 0.0);
  r.w2.assign(h * inner, 0.0);
  r.b2.assign(h, 0.0);
  std::vector<double> pre(inner), act(inner), dpre(inner);
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t i = 0; i < inner; ++i) {
      double a = v(p[kB1][i]);
      for (int64_t j = 0; j < h; ++j) a += v(p[kW1][i * h + j]) * v(x[s * h + j]);
      pre[i] = a;
      act[i] = abs ? kGeluLipschitz * a : Gelu(a);
    }
    for (int64_t j = 0; j < h; ++j) {
      double z = v(p[kB2][j]) + v(x[s * h + j]);
      for (int64_t i = 0; i < inner; ++i) z += v(p[kW2][j * inner + i]) * act[i];
      r.y[s * h + j] = z;
    }
    for (int64_t i = 0; i < inner; ++i) {
      double g = 0.0;
      for (int64_t j = 0; j < h; ++j) g += v(dy[s * h + j]) * v(p[kW2][j * inner + i]);
      // |d(g gelu'(pre))| <= |dg| gelu'max + |g| |gelu''|max |dpre|.
      dpre[i] = abs ? g * kGeluLipschitz + g * kGeluGradLipschitz * pre[i] : g * GeluGrad(pre[i]);
    }
    for (int64_t j = 0; j < h; ++j) {
      double d = v(dy[s * h + j]);
      for (int64_t i = 0; i < inner; ++i) d += dpre[i] * v(p[kW1][i * h + j]);
      r.dx[s * h + j] = d;
      r.b2[j] += v(dy[s * h + j]);
      for (int64_t i = 0; i < inner; ++i) r.w2[j * inner + i] += v(dy[s * h + j]) * act[i];
    }
    for (int64_t i = 0; i < inner; ++i) {
      r.b1[i] += dpre[i];
      for (int64_t j = 0; j < h; ++j) r.w1[i * h + j] += dpre[i] * v(x[s * h + j]);
    }
  }
  return r;
}

// The block on `tp` simulated ranks: each runs the partial halves on its
// slices, the partials are summed in rank order in fp32 (what the tp
// all-reduce does), then the finishing halves; gradients joined back.
// `sum_partials` false leaves each rank with its own partial (the bug the
// all-reduce prevents): the result is rank 0's.
BlockResult TensorParallel(const std::vector<std::vector<float>>& full, const std::vector<float>& x,
                           const std::vector<float>& dy, const MlpConfig& cfg, int tp,
                           bool sum_partials) {
  const int64_t b = cfg.micro_batch, h = cfg.hidden, inner = 4 * h / tp;
  const ModelSpec spec = BuildModelSpec(cfg);
  std::vector<std::vector<std::vector<float>>> shard(tp), grad(tp);
  std::vector<std::vector<float>> y_part(tp), dx_part(tp), pre(tp), act(tp);
  for (int r = 0; r < tp; ++r) {
    for (int p = 0; p < kNumBlockParams; ++p) {
      shard[r].push_back(SliceForTensorParallel(spec.units[0].params[p], full[p], tp, r));
      grad[r].emplace_back(shard[r].back().size(), std::numeric_limits<float>::quiet_NaN());
    }
    const BlockWeights w{shard[r][kW1].data(), shard[r][kB1].data(), shard[r][kW2].data(),
                         shard[r][kB2].data()};
    pre[r].resize(b * inner);
    act[r].resize(b * inner);
    y_part[r].resize(b * h);
    dx_part[r].resize(b * h);
    std::vector<float> scratch(b * inner);
    internal::BlockForwardPartial(w, b, h, inner, x.data(), pre[r].data(), act[r].data(),
                                  y_part[r].data());
    internal::BlockBackwardPartial(w, b, h, inner, x.data(), pre[r].data(), act[r].data(),
                                   dy.data(), scratch.data(), dx_part[r].data(),
                                   BlockGradients{grad[r][kW1].data(), grad[r][kB1].data(),
                                                  grad[r][kW2].data(), grad[r][kB2].data()});
  }
  std::vector<float> y = y_part[0], dx = dx_part[0];
  for (int r = 1; sum_partials && r < tp; ++r) {
    for (int64_t i = 0; i < b * h; ++i) {
      y[i] += y_part[r][i];
      dx[i] += dx_part[r][i];
    }
  }
  internal::BlockForwardFinish(full[kB2].data(), b, h, x.data(), y.data());
  internal::BlockBackwardFinish(dy.data(), b, h, dx.data());
  BlockResult out;
  out.y.assign(y.begin(), y.end());
  out.dx.assign(dx.begin(), dx.end());
  std::vector<double>* dst[kNumBlockParams] = {&out.w1, &out.b1, &out.w2, &out.b2};
  for (int p = 0; p < kNumBlockParams; ++p) {
    std::vector<float> slices;
    for (int r = 0; r < tp; ++r) slices.insert(slices.end(), grad[r][p].begin(), grad[r][p].end());
    if (p == kB2) {
      // Replicated: every rank computed the same bits.
      for (int r = 1; r < tp; ++r) EXPECT_EQ(grad[r][p], grad[0][p]) << "db2 on tp rank " << r;
    }
    const std::vector<float> joined = JoinTensorParallel(spec.units[0].params[p], slices, tp);
    dst[p]->assign(joined.begin(), joined.end());
  }
  return out;
}

struct Case {
  MlpConfig cfg;
  std::vector<std::vector<float>> params;
  std::vector<float> x, dy;
};

Case MakeCase(uint64_t seed) {
  Case c;
  c.cfg.hidden = 32;
  c.cfg.blocks = 1;
  c.cfg.micro_batch = 8;
  c.cfg.init_seed = seed;
  for (int p = 0; p < kNumBlockParams; ++p) {
    c.params.push_back(RandomParam(c.cfg, seed, 0, p));
    if (p == kB1 || p == kB2) {
      for (float& v : c.params.back()) v *= 15.0f;  // biases O(0.3), not 0.02
    }
  }
  const int64_t n = c.cfg.micro_batch * c.cfg.hidden;
  c.x = Normal(examples::DeriveKey(seed, 11), n, 1.0);
  c.dy = Normal(examples::DeriveKey(seed, 12), n, 0.1);
  return c;
}

// Largest |got - ref| / (gamma_n * magnitude) over one output: <= 1 is
// within the rounding bound.
double WorstRatio(const std::vector<double>& got, const std::vector<double>& ref,
                  const std::vector<double>& magnitude, int64_t depth) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / (Gamma(depth) * magnitude[i] + 1e-300));
  }
  return worst;
}

TEST(MlpTensorParallel, EveryTpMatchesTheDoubleReferenceWithinTheRoundingBound) {
  const Case c = MakeCase(testing::Seed());
  const int64_t b = c.cfg.micro_batch, h = c.cfg.hidden;
  const BlockResult ref = Reference(c.params, c.x, c.dy, b, h, /*abs=*/false);
  const BlockResult mag = Reference(c.params, c.x, c.dy, b, h, /*abs=*/true);
  // Depth of the longest chain of roundings behind each output: the two
  // dot products (h and 4h terms) plus bias, residual, gelu and the tp sum;
  // the gradients' batch sums add b.
  const int64_t depth = h + 4 * h + b + 8;
  for (int tp : {1, 2, 4}) {
    const BlockResult got = TensorParallel(c.params, c.x, c.dy, c.cfg, tp, true);
    EXPECT_LE(WorstRatio(got.y, ref.y, mag.y, depth), 1.0) << "y, tp " << tp << "; " << SeedTrace();
    EXPECT_LE(WorstRatio(got.dx, ref.dx, mag.dx, depth), 1.0)
        << "dx, tp " << tp << "; " << SeedTrace();
    EXPECT_LE(WorstRatio(got.w1, ref.w1, mag.w1, depth), 1.0)
        << "dW1, tp " << tp << "; " << SeedTrace();
    EXPECT_LE(WorstRatio(got.b1, ref.b1, mag.b1, depth), 1.0)
        << "db1, tp " << tp << "; " << SeedTrace();
    EXPECT_LE(WorstRatio(got.w2, ref.w2, mag.w2, depth), 1.0)
        << "dW2, tp " << tp << "; " << SeedTrace();
    EXPECT_LE(WorstRatio(got.b2, ref.b2, mag.b2, depth), 1.0)
        << "db2, tp " << tp << "; " << SeedTrace();
  }
}

TEST(MlpTensorParallel, WithoutTheTpSumTheResultIsWrong) {
  const Case c = MakeCase(testing::Seed() ^ 1);
  const int64_t b = c.cfg.micro_batch, h = c.cfg.hidden;
  const BlockResult ref = Reference(c.params, c.x, c.dy, b, h, false);
  const BlockResult mag = Reference(c.params, c.x, c.dy, b, h, true);
  const BlockResult got = TensorParallel(c.params, c.x, c.dy, c.cfg, 2, /*sum_partials=*/false);
  EXPECT_GT(WorstRatio(got.y, ref.y, mag.y, h + 4 * h + b + 8), 1.0) << SeedTrace();
  EXPECT_GT(WorstRatio(got.dx, ref.dx, mag.dx, h + 4 * h + b + 8), 1.0) << SeedTrace();
}

// tp = 1 through the split halves is BlockForward / BlockBackward bit for
// bit (the one-rank trainer's arithmetic is unchanged).
TEST(MlpTensorParallel, OneRankHalvesAreTheWholeBlockBitForBit) {
  const Case c = MakeCase(testing::Seed() ^ 2);
  const int64_t b = c.cfg.micro_batch, h = c.cfg.hidden;
  const BlockWeights w{c.params[kW1].data(), c.params[kB1].data(), c.params[kW2].data(),
                       c.params[kB2].data()};
  std::vector<float> pre(b * 4 * h), act(pre.size()), y(b * h), dx(b * h), scratch(pre.size());
  std::vector<std::vector<float>> g;
  for (const auto& p : c.params) g.emplace_back(p.size());
  internal::BlockForward(w, b, h, c.x.data(), pre.data(), act.data(), y.data());
  internal::BlockBackward(w, b, h, c.x.data(), pre.data(), act.data(), c.dy.data(), scratch.data(),
                          dx.data(),
                          BlockGradients{g[0].data(), g[1].data(), g[2].data(), g[3].data()});
  const BlockResult got = TensorParallel(c.params, c.x, c.dy, c.cfg, 1, true);
  EXPECT_EQ(std::vector<double>(y.begin(), y.end()), got.y);
  EXPECT_EQ(std::vector<double>(dx.begin(), dx.end()), got.dx);
  EXPECT_EQ(std::vector<double>(g[kW1].begin(), g[kW1].end()), got.w1);
  EXPECT_EQ(std::vector<double>(g[kW2].begin(), g[kW2].end()), got.w2);
}

TEST(MlpTensorParallel, SliceAndJoinFollowTheSplitDimension) {
  MlpConfig cfg;
  cfg.hidden = 4;
  const ModelSpec spec = BuildModelSpec(cfg);
  EXPECT_EQ(spec.units[0].params[kW1].tp_split_dim, 0);
  EXPECT_EQ(spec.units[0].params[kB1].tp_split_dim, 0);
  EXPECT_EQ(spec.units[0].params[kW2].tp_split_dim, 1);
  EXPECT_EQ(spec.units[0].params[kB2].tp_split_dim, -1);
  // W2 [4, 16] split by columns over 2: rank 1 holds columns 8..15 of each row.
  std::vector<float> w2(64);
  for (int i = 0; i < 64; ++i) w2[i] = static_cast<float>(i);
  const std::vector<float> s1 = SliceForTensorParallel(spec.units[0].params[kW2], w2, 2, 1);
  ASSERT_EQ(s1.size(), 32u);
  EXPECT_EQ(s1[0], 8.0f);
  EXPECT_EQ(s1[8], 24.0f);
  // W1 [16, 4] split by rows: rank 1 holds rows 8..15.
  const std::vector<float> r1 = SliceForTensorParallel(spec.units[0].params[kW1], w2, 2, 1);
  EXPECT_EQ(r1[0], 32.0f);
  for (int p = 0; p < kNumBlockParams; ++p) {
    const ParamSpec& ps = spec.units[0].params[p];
    std::vector<float> full(static_cast<size_t>(ps.NumElements()));
    for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
    for (int tp : {1, 2, 4}) {
      std::vector<float> slices;
      for (int r = 0; r < tp; ++r) {
        const std::vector<float> s = SliceForTensorParallel(ps, full, tp, r);
        slices.insert(slices.end(), s.begin(), s.end());
      }
      EXPECT_EQ(JoinTensorParallel(ps, slices, tp), full) << "param " << p << " tp " << tp;
    }
  }
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard
