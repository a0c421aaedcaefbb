// The language-model and LoRA math of the MLP example (internal/lm_math.h,
// internal/lora_math.h) against double-precision references on random
// inputs: the cross-entropy and its seed, the tied head + embedding gradient
// (the sum of both uses), and the LoRA block's forward, adapter gradients and
// input gradient, the latter derived another way (through W_eff).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "examples/common/rng.h"
#include "examples/mlp/internal/block_math.h"
#include "examples/mlp/internal/lm_math.h"
#include "examples/mlp/internal/lora_math.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"

namespace zeroshard {
namespace mlp {
namespace internal {
namespace {

std::vector<float> RandomNormal(uint64_t seed, int64_t n, double scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * examples::NormalAt(seed, i));
  return v;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// max |got - want| <= tol * (max |want| + 1e-3): the array's own scale.
void ExpectClose(const float* got, const std::vector<double>& want, double tol, const char* what) {
  double scale = 1e-3, worst = 0.0;
  size_t at = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    if (d > worst) worst = d, at = i;
  }
  EXPECT_LE(worst, tol * scale) << what << ": element " << at << " got " << got[at] << " want "
                                << want[at] << " (scale " << scale << ")";
}

// ---------------------------------------------------------------------------
// The LM: x = E[token] (the blocks, tested elsewhere, in between are left
// out so that both uses of E meet directly), logits = x E^T + bias, mean
// cross-entropy.

struct LmCase {
  int64_t batch = 12, hidden = 16, vocab = 24;
  std::vector<int32_t> tokens, targets;
  std::vector<float> embed, bias;
};

LmCase MakeLmCase(uint64_t seed) {
  LmCase c;
  c.embed = RandomNormal(seed, c.vocab * c.hidden, 0.5);
  c.bias = RandomNormal(seed + 1, c.vocab, 0.3);
  for (int64_t b = 0; b < c.batch; ++b) {
    c.tokens.push_back(static_cast<int32_t>(examples::DeriveKey(seed + 2, b) % c.vocab));
    c.targets.push_back(static_cast<int32_t>(examples::DeriveKey(seed + 3, b) % c.vocab));
  }
  // A repeated token: its embedding row sums two rows of dL/dx.
  c.tokens[5] = c.tokens[2];
  return c;
}

// The loss in double for embedding `e` (used for finite differences too).
double ReferenceLmLoss(const LmCase& c, const std::vector<double>& e) {
  double total = 0.0;
  for (int64_t b = 0; b < c.batch; ++b) {
    const double* x = &e[c.tokens[b] * c.hidden];
    std::vector<double> logits(c.vocab);
    for (int64_t v = 0; v < c.vocab; ++v) {
      double s = c.bias[v];
      for (int64_t j = 0; j < c.hidden; ++j) s += x[j] * e[v * c.hidden + j];
      logits[v] = s;
    }
    const double m = *std::max_element(logits.begin(), logits.end());
    double z = 0.0;
    for (double l : logits) z += std::exp(l - m);
    total += std::log(z) + m - logits[c.targets[b]];
  }
  return total / c.batch;
}

// dL/dlogits, dL/dbias and dL/dE (both uses) in double.
struct LmGrads {
  std::vector<double> dlogits, dbias, dembed_head, dembed_embed, dembed;
};

LmGrads ReferenceLmGrads(const LmCase& c) {
  const std::vector<double> e = ToDouble(c.embed);
  LmGrads g;
  g.dlogits.assign(c.batch * c.vocab, 0.0);
  g.dbias.assign(c.vocab, 0.0);
  g.dembed_head.assign(c.vocab * c.hidden, 0.0);
  g.dembed_embed.assign(c.vocab * c.hidden, 0.0);
  for (int64_t b = 0; b < c.batch; ++b) {
    const double* x = &e[c.tokens[b] * c.hidden];
    std::vector<double> logits(c.vocab);
    for (int64_t v = 0; v < c.vocab; ++v) {
      double s = c.bias[v];
      for (int64_t j = 0; j < c.hidden; ++j) s += x[j] * e[v * c.hidden + j];
      logits[v] = s;
    }
    const double m = *std::max_element(logits.begin(), logits.end());
    double z = 0.0;
    for (double l : logits) z += std::exp(l - m);
    for (int64_t v = 0; v < c.vocab; ++v) {
      const double d = (std::exp(logits[v] - m) / z - (v == c.targets[b] ? 1.0 : 0.0)) / c.batch;
      g.dlogits[b * c.vocab + v] = d;
      g.dbias[v] += d;
      for (int64_t j = 0; j < c.hidden; ++j) {
        g.dembed_head[v * c.hidden + j] += d * x[j];                            // head use
        g.dembed_embed[c.tokens[b] * c.hidden + j] += d * e[v * c.hidden + j];  // embedding use
      }
    }
  }
  g.dembed.resize(g.dembed_head.size());
  for (size_t i = 0; i < g.dembed.size(); ++i) g.dembed[i] = g.dembed_head[i] + g.dembed_embed[i];
  return g;
}

TEST(LmMath, CrossEntropyAndSeedMatchDoubleReference) {
  const LmCase c = MakeLmCase(11);
  std::vector<float> x(c.batch * c.hidden), logits(c.batch * c.vocab), dlogits(logits.size());
  EmbedForward(c.embed.data(), c.tokens.data(), c.batch, c.hidden, x.data());
  HeadForward(c.embed.data(), c.bias.data(), x.data(), c.batch, c.hidden, c.vocab, logits.data());
  const double loss =
      CrossEntropyLoss(logits.data(), c.targets.data(), c.batch, c.vocab, dlogits.data());
  const double want = ReferenceLmLoss(c, ToDouble(c.embed));
  EXPECT_NEAR(loss, want, 1e-5 * want);
  EXPECT_GT(want, 0.5);  // not a degenerate case
  ExpectClose(dlogits.data(), ReferenceLmGrads(c).dlogits, 1e-5, "dlogits");
}

// The tied weight's gradient is the head's use plus the embedding's use,
// summed in that order (the order the trainer reduces them); each use and
// the sum match the double reference, and the reference itself matches
// central differences of the double loss.
TEST(LmMath, TiedGradientIsTheSumOfBothUses) {
  const LmCase c = MakeLmCase(23);
  const LmGrads ref = ReferenceLmGrads(c);
  std::vector<float> x(c.batch * c.hidden), logits(c.batch * c.vocab), dlogits(logits.size());
  EmbedForward(c.embed.data(), c.tokens.data(), c.batch, c.hidden, x.data());
  HeadForward(c.embed.data(), c.bias.data(), x.data(), c.batch, c.hidden, c.vocab, logits.data());
  CrossEntropyLoss(logits.data(), c.targets.data(), c.batch, c.vocab, dlogits.data());
  std::vector<float> d_head(c.vocab * c.hidden), d_bias(c.vocab), dx(c.batch * c.hidden);
  HeadBackward(c.embed.data(), x.data(), dlogits.data(), c.batch, c.hidden, c.vocab, d_head.data(),
               d_bias.data(), dx.data());
  std::vector<float> d_embed(c.vocab * c.hidden, 7.0f);  // overwritten, not accumulated into
  EmbedBackward(c.tokens.data(), dx.data(), c.batch, c.hidden, c.vocab, d_embed.data());
  ExpectClose(d_bias.data(), ref.dbias, 1e-5, "d bias");
  ExpectClose(d_head.data(), ref.dembed_head, 1e-5, "dE, head use");
  ExpectClose(d_embed.data(), ref.dembed_embed, 1e-5, "dE, embedding use");
  std::vector<float> sum(d_head.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = d_head[i] + d_embed[i];
  ExpectClose(sum.data(), ref.dembed, 1e-5, "dE, both uses");

  // The reference formula against the double loss, on rows that are used
  // twice (a token's row: both uses), once (head only) and a repeated token.
  std::vector<double> e = ToDouble(c.embed);
  const int64_t rows[] = {c.tokens[2], c.tokens[0], (c.tokens[0] + 1) % c.vocab};
  for (int64_t row : rows) {
    for (int64_t j : {int64_t{0}, c.hidden - 1}) {
      const size_t i = static_cast<size_t>(row * c.hidden + j);
      const double keep = e[i], step = 1e-6;
      e[i] = keep + step;
      const double up = ReferenceLmLoss(c, e);
      e[i] = keep - step;
      const double down = ReferenceLmLoss(c, e);
      e[i] = keep;
      EXPECT_NEAR((up - down) / (2 * step), ref.dembed[i], 1e-7) << "row " << row << " col " << j;
    }
  }
}

TEST(LmMath, ArgmaxTakesTheFirstLargest) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, -3.0f, -2.0f, -2.5f, -3.0f};
  int32_t out[2];
  ArgmaxRows(logits.data(), 2, 4, out);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 1);
}

// ---------------------------------------------------------------------------
// LoRA: the reference forms W_eff = W + s B A in double and runs the plain
// block on it; the adapter gradients come from dW_eff (dA = s B^T dW_eff,
// dB = s dW_eff A^T), a route the fp32 code (through the rank-R
// bottleneck) does not take.

struct LoraCase {
  int64_t batch = 6, hidden = 8, rank = 3;
  float scale = 0.75f;
  std::vector<float> w1, b1, w2, b2, a1, bb1, a2, bb2, x, dy;
};

LoraCase MakeLoraCase(uint64_t seed) {
  LoraCase c;
  const int64_t h = c.hidden, in4 = InnerSize(h), r = c.rank;
  c.w1 = RandomNormal(seed, in4 * h, 1.0 / std::sqrt(h));
  c.b1 = RandomNormal(seed + 1, in4, 0.3);
  c.w2 = RandomNormal(seed + 2, h * in4, 1.0 / std::sqrt(in4));
  c.b2 = RandomNormal(seed + 3, h, 0.3);
  // B is not zero here (it is at init): every path of the adapters counts.
  c.a1 = RandomNormal(seed + 4, r * h, 1.0 / std::sqrt(h));
  c.bb1 = RandomNormal(seed + 5, in4 * r, 0.4);
  c.a2 = RandomNormal(seed + 6, r * in4, 1.0 / std::sqrt(in4));
  c.bb2 = RandomNormal(seed + 7, h * r, 0.4);
  c.x = RandomNormal(seed + 8, c.batch * h, 1.0);
  c.dy = RandomNormal(seed + 9, c.batch * h, 0.1);
  return c;
}

// W + s B A for W [out, in], B [out, R], A [R, in].
std::vector<double> EffectiveWeight(const std::vector<float>& w, const std::vector<float>& b,
                                    const std::vector<float>& a, int64_t out, int64_t in, int64_t r,
                                    double s) {
  std::vector<double> eff(w.begin(), w.end());
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double sum = 0.0;
      for (int64_t k = 0; k < r; ++k) sum += static_cast<double>(b[o * r + k]) * a[k * in + i];
      eff[o * in + i] += s * sum;
    }
  }
  return eff;
}

double Phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

struct LoraReference {
  std::vector<double> y, dx, da1, db1, da2, db2;
};

LoraReference ReferenceLora(const LoraCase& c) {
  const int64_t h = c.hidden, in4 = InnerSize(h), r = c.rank, n = c.batch;
  const std::vector<double> w1 = EffectiveWeight(c.w1, c.bb1, c.a1, in4, h, r, c.scale);
  const std::vector<double> w2 = EffectiveWeight(c.w2, c.bb2, c.a2, h, in4, r, c.scale);
  LoraReference ref;
  ref.y.assign(n * h, 0.0);
  ref.dx.assign(n * h, 0.0);
  std::vector<double> dw1(in4 * h, 0.0), dw2(h * in4, 0.0);
  for (int64_t b = 0; b < n; ++b) {
    std::vector<double> pre(in4), act(in4), dpre(in4, 0.0);
    for (int64_t i = 0; i < in4; ++i) {
      double s = c.b1[i];
      for (int64_t j = 0; j < h; ++j) s += w1[i * h + j] * c.x[b * h + j];
      pre[i] = s;
      act[i] = s * Phi(s);
    }
    for (int64_t o = 0; o < h; ++o) {
      double s = c.b2[o] + c.x[b * h + o];
      for (int64_t i = 0; i < in4; ++i) s += w2[o * in4 + i] * act[i];
      ref.y[b * h + o] = s;
    }
    for (int64_t o = 0; o < h; ++o) {
      const double d = c.dy[b * h + o];
      ref.dx[b * h + o] += d;  // residual
      for (int64_t i = 0; i < in4; ++i) {
        dw2[o * in4 + i] += d * act[i];
        dpre[i] += d * w2[o * in4 + i];
      }
    }
    for (int64_t i = 0; i < in4; ++i) {
      const double p = pre[i];
      dpre[i] *= Phi(p) + p * std::exp(-0.5 * p * p) / std::sqrt(2.0 * M_PI);
      for (int64_t j = 0; j < h; ++j) {
        dw1[i * h + j] += dpre[i] * c.x[b * h + j];
        ref.dx[b * h + j] += dpre[i] * w1[i * h + j];
      }
    }
  }
  // dA = s B^T dW [R, in], dB = s dW A^T [out, R].
  auto adapters = [&](const std::vector<double>& dw, const std::vector<float>& a,
                      const std::vector<float>& bm, int64_t out, int64_t in,
                      std::vector<double>* da, std::vector<double>* db) {
    da->assign(r * in, 0.0);
    db->assign(out * r, 0.0);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t k = 0; k < r; ++k) {
          (*da)[k * in + i] += c.scale * bm[o * r + k] * dw[o * in + i];
          (*db)[o * r + k] += c.scale * dw[o * in + i] * a[k * in + i];
        }
      }
    }
  };
  adapters(dw1, c.a1, c.bb1, in4, h, &ref.da1, &ref.db1);
  adapters(dw2, c.a2, c.bb2, h, in4, &ref.da2, &ref.db2);
  return ref;
}

TEST(LoraMath, BlockForwardAndBackwardMatchDoubleReference) {
  UseSingleThreadedBlas();
  for (uint64_t seed : {101u, 202u}) {
    const LoraCase c = MakeLoraCase(seed);
    const LoraReference ref = ReferenceLora(c);
    const int64_t h = c.hidden, in4 = InnerSize(h), n = c.batch;
    const BlockWeights w{c.w1.data(), c.b1.data(), c.w2.data(), c.b2.data()};
    const LoraWeights lora{c.a1.data(), c.bb1.data(), c.a2.data(), c.bb2.data(), c.rank, c.scale};
    std::vector<float> pre(n * in4), act(n * in4), y(n * h), dx(n * h);
    std::vector<float> scratch(LoraScratchSize(n, h, c.rank));
    LoraBlockForward(w, lora, n, h, c.x.data(), pre.data(), act.data(), y.data(), scratch.data());
    ExpectClose(y.data(), ref.y, 2e-6, "y");
    // NaN-filled gradients: an element the backward does not overwrite shows.
    std::vector<float> grads(c.rank * h + in4 * c.rank + c.rank * in4 + h * c.rank, NAN);
    const LoraGradients g = LoraGradientsIn(grads.data(), h, c.rank);
    LoraBlockBackward(w, lora, n, h, c.x.data(), pre.data(), act.data(), c.dy.data(),
                      scratch.data(), dx.data(), g);
    ExpectClose(g.a1, ref.da1, 1e-5, "dA1");
    ExpectClose(g.b1, ref.db1, 1e-5, "dB1");
    ExpectClose(g.a2, ref.da2, 1e-5, "dA2");
    ExpectClose(g.b2, ref.db2, 1e-5, "dB2");
    ExpectClose(dx.data(), ref.dx, 1e-5, "dx");
  }
}

// With B = 0 (LoRA's init) the adapted block is the base block: same bits
// out of the forward, and dA = 0 exactly.
TEST(LoraMath, ZeroBIsTheBaseBlock) {
  UseSingleThreadedBlas();
  LoraCase c = MakeLoraCase(303);
  std::fill(c.bb1.begin(), c.bb1.end(), 0.0f);
  std::fill(c.bb2.begin(), c.bb2.end(), 0.0f);
  const int64_t h = c.hidden, in4 = InnerSize(h), n = c.batch;
  const BlockWeights w{c.w1.data(), c.b1.data(), c.w2.data(), c.b2.data()};
  const LoraWeights lora{c.a1.data(), c.bb1.data(), c.a2.data(), c.bb2.data(), c.rank, c.scale};
  std::vector<float> pre(n * in4), act(n * in4), y(n * h), y_base(n * h);
  std::vector<float> scratch(LoraScratchSize(n, h, c.rank));
  LoraBlockForward(w, lora, n, h, c.x.data(), pre.data(), act.data(), y.data(), scratch.data());
  BlockForward(w, n, h, c.x.data(), pre.data(), act.data(), y_base.data());
  EXPECT_EQ(y, y_base);
  const LoraReference ref = ReferenceLora(c);
  std::vector<float> grads(c.rank * h + in4 * c.rank + c.rank * in4 + h * c.rank, NAN);
  const LoraGradients g = LoraGradientsIn(grads.data(), h, c.rank);
  std::vector<float> dx(n * h);
  LoraBlockBackward(w, lora, n, h, c.x.data(), pre.data(), act.data(), c.dy.data(), scratch.data(),
                    dx.data(), g);
  for (int64_t i = 0; i < c.rank * h; ++i) EXPECT_EQ(g.a1[i], 0.0f) << i;
  ExpectClose(g.b1, ref.db1, 1e-5, "dB1 at B = 0");
}

}  // namespace
}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard

namespace zeroshard {
namespace mlp {
namespace {

// The LM's teacher: its next-token rule is a fixed function of the token,
// the same for every sampler, and not a trivial one (not the identity, not
// one token for all); the tokens cover the vocabulary.
TEST(LmTeacher, NextTokenRuleIsFixedAndNotTrivial) {
  MlpConfig cfg;
  cfg.hidden = 32;
  cfg.blocks = 3;
  cfg.micro_batch = 8;
  cfg.vocab = 300;  // more than one chunk of the teacher's table
  const DistributedSampler a(cfg, 2, 0, 1), b(cfg, 2, 1, 1);
  std::set<int32_t> targets, tokens;
  int identity = 0;
  for (int32_t t = 0; t < cfg.vocab; ++t) {
    EXPECT_EQ(a.TargetOf(t), b.TargetOf(t));
    targets.insert(a.TargetOf(t));
    identity += a.TargetOf(t) == t;
  }
  for (int64_t id = 0; id < 3000; ++id) tokens.insert(a.TokenAt(id));
  EXPECT_EQ(identity, 0);
  EXPECT_GT(targets.size(), static_cast<size_t>(cfg.vocab / 10));
  EXPECT_EQ(tokens.size(), static_cast<size_t>(cfg.vocab));
  // Ranks get disjoint samples: their first micro-batches' ids differ.
  EXPECT_NE(a.SampleIds(0, 0), b.SampleIds(0, 0));
}

}  // namespace
}  // namespace mlp
}  // namespace zeroshard
