// The GPT example's math (examples/gpt/internal/gpt_math.h) against a
// double-precision reference written here in plain loops, on fresh random
// inputs every run (tests/test_seed.h):
//   - the whole model (embeddings, blocks, ln_f, tied head, mean
//     cross-entropy): the fp32 loss against the double loss, and every
//     param's fp32 gradient (wte as the sum of its embedding and head uses)
//     against central differences of the double loss;
//   - attention, LayerNorm, GELU and the cross-entropy one by one;
//   - causality: a later token changes no earlier row, bit for bit;
//   - no call reads scratch, activations or outputs it did not write (they
//     start as NaN), none writes past its documented size, and two runs give
//     the same bits.
//
// Tolerances. The double reference's central differences (step 1e-5 on
// values of order 1) are exact to ~1e-9 relative (truncation ~h^2, rounding
// ~1e-16 / h), so the gap measured is the fp32 code's own rounding. Over 40
// seeds the worst gradient gap was 7e-6 of the param's largest gradient and
// the loss's 2e-7 relative; the bounds (1e-4, 1e-5) are 15-50x that, and far
// below what a real mistake costs (a dropped 1/sqrt(D), a wrong mask, a
// transposed weight, a wrong LayerNorm term or a missing use of the tied
// weight move some gradient by 1e-2 of its scale or more at these shapes).
// The pieces' bounds are set the same way; each says why where it differs.
#include "examples/gpt/internal/gpt_math.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace gpt {
namespace internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Floats past the documented end of a buffer that must stay untouched.
constexpr int64_t kGuard = 64;
constexpr float kGuardValue = 12345.5f;

std::vector<float> Normal(std::mt19937_64& rng, int64_t n, double scale, double mean = 0.0) {
  std::normal_distribution<double> dist(mean, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// max |got - want| <= tol * max |want| (+ a floor for arrays of zeros).
void ExpectClose(const float* got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  double scale = 0.0, worst = 0.0;
  size_t at = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    if (!(d <= worst)) worst = d, at = i;  // NaN counts as the worst
  }
  EXPECT_LE(worst, tol * scale + 1e-9)
      << what << ": element " << at << " got " << got[at] << " want " << want[at] << " (max |want| "
      << scale << ", " << SeedTrace() << ")";
}

// A buffer of `n` floats filled with NaN, followed by guard floats.
struct Guarded {
  explicit Guarded(int64_t n) : size(n), data(static_cast<size_t>(n + kGuard), kNaN) {
    std::fill(data.begin() + n, data.end(), kGuardValue);
  }
  float* get() { return data.data(); }
  void ExpectGuardIntact(const std::string& what) const {
    for (int64_t i = size; i < size + kGuard; ++i) {
      ASSERT_EQ(data[i], kGuardValue) << what << " written past its " << size << " floats";
    }
  }
  int64_t size;
  std::vector<float> data;
};

// ---------------------------------------------------------------------------
// The double reference, straight from the definitions.

void RefLayerNorm(const double* x, const double* w, const double* b, int64_t rows, int64_t width,
                  double eps, double* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x + r * width;
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < width; ++i) mean += xr[i];
    mean /= width;
    for (int64_t i = 0; i < width; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= width;  // biased, as torch.nn.LayerNorm
    for (int64_t i = 0; i < width; ++i) {
      out[r * width + i] = (xr[i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
    }
  }
}

// y [rows, out] = x [rows, in] w [in, out] + b (HF's Conv1D).
void RefConv1D(const double* x, const double* w, const double* b, int64_t rows, int64_t in,
               int64_t out, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    double* yr = y + r * out;
    for (int64_t o = 0; o < out; ++o) yr[o] = b[o];
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t o = 0; o < out; ++o) yr[o] += x[r * in + i] * w[i * out + o];
    }
  }
}

double RefGelu(double u) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * u * (1.0 + std::tanh(k * (u + 0.044715 * u * u * u)));
}

// Causal attention per (b, h) from qkv [N, 3C]; att [B, H, T, T] (0 above
// the diagonal) may be null.
void RefAttention(const double* qkv, const GptDims& d, double* att, double* out) {
  const int64_t T = d.seq, C = d.width, D = d.head_dim();
  std::vector<double> p(T);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const double* q = qkv + (b * T + i) * 3 * C + h * D;
        double max = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          const double* k = qkv + (b * T + j) * 3 * C + C + h * D;
          double s = 0.0;
          for (int64_t e = 0; e < D; ++e) s += q[e] * k[e];
          p[j] = s / std::sqrt(static_cast<double>(D));
          max = std::max(max, p[j]);
        }
        double z = 0.0;
        for (int64_t j = 0; j <= i; ++j) z += std::exp(p[j] - max);
        for (int64_t j = 0; j <= i; ++j) p[j] = std::exp(p[j] - max) / z;
        if (att != nullptr) {
          for (int64_t j = 0; j < T; ++j) {
            att[((b * d.heads + h) * T + i) * T + j] = j <= i ? p[j] : 0.0;
          }
        }
        for (int64_t e = 0; e < D; ++e) {
          double s = 0.0;
          for (int64_t j = 0; j <= i; ++j) s += p[j] * qkv[(b * T + j) * 3 * C + 2 * C + h * D + e];
          out[(b * T + i) * C + h * D + e] = s;
        }
      }
    }
  }
}

// params[kLn1Weight .. kFcProjBias] of one block.
void RefBlock(const std::vector<double>* p, const GptDims& d, const double* x, double* y) {
  const int64_t N = d.rows(), C = d.width;
  std::vector<double> ln1(N * C), qkv(N * 3 * C), atty(N * C), proj(N * C), a(N * C), ln2(N * C),
      fc(N * 4 * C), mlp(N * C);
  RefLayerNorm(x, p[kLn1Weight].data(), p[kLn1Bias].data(), N, C, d.eps, ln1.data());
  RefConv1D(ln1.data(), p[kAttnWeight].data(), p[kAttnBias].data(), N, C, 3 * C, qkv.data());
  RefAttention(qkv.data(), d, nullptr, atty.data());
  RefConv1D(atty.data(), p[kProjWeight].data(), p[kProjBias].data(), N, C, C, proj.data());
  for (int64_t i = 0; i < N * C; ++i) a[i] = x[i] + proj[i];
  RefLayerNorm(a.data(), p[kLn2Weight].data(), p[kLn2Bias].data(), N, C, d.eps, ln2.data());
  RefConv1D(ln2.data(), p[kFcWeight].data(), p[kFcBias].data(), N, C, 4 * C, fc.data());
  for (double& u : fc) u = RefGelu(u);
  RefConv1D(fc.data(), p[kFcProjWeight].data(), p[kFcProjBias].data(), N, 4 * C, C, mlp.data());
  for (int64_t i = 0; i < N * C; ++i) y[i] = a[i] + mlp[i];
}

// ---------------------------------------------------------------------------
// A model: its params in one list, [wte, wpe, h.0's 12, ..., ln_f.weight,
// ln_f.bias], so that finite differences walk every element of every one.

struct Shape {
  int64_t batch, seq, width, heads, vocab, positions, layers;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "B=" << s.batch << " T=" << s.seq << " C=" << s.width << " H=" << s.heads
      << " V=" << s.vocab << " P=" << s.positions << " layers=" << s.layers;
}

struct Model {
  GptDims d;
  int64_t layers = 0;
  std::vector<std::vector<float>> params;
  std::vector<std::string> names;
  std::vector<int32_t> tokens, targets;

  int64_t BlockIndex(int64_t layer, int param) const { return 2 + layer * kNumBlockParams + param; }
  int64_t LnfIndex() const { return 2 + layers * kNumBlockParams; }
};

int64_t BlockParamSize(const GptDims& d, int param) {
  const int64_t C = d.width;
  switch (param) {
    case kAttnWeight:
      return C * 3 * C;
    case kAttnBias:
      return 3 * C;
    case kProjWeight:
      return C * C;
    case kFcWeight:
    case kFcProjWeight:
      return C * 4 * C;
    case kFcBias:
      return 4 * C;
    default:
      return C;
  }
}

GptDims DimsOf(const Shape& s) {
  GptDims d;
  d.batch = s.batch;
  d.seq = s.seq;
  d.width = s.width;
  d.heads = s.heads;
  d.vocab = s.vocab;
  d.positions = s.positions;
  return d;
}

Model MakeModel(const Shape& s, std::mt19937_64& rng) {
  Model m;
  m.d = DimsOf(s);
  m.layers = s.layers;
  const int64_t C = s.width;
  m.params.push_back(Normal(rng, s.vocab * C, 0.5));
  m.names.push_back("wte");
  m.params.push_back(Normal(rng, s.positions * C, 0.3));
  m.names.push_back("wpe");
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(C));
  for (int64_t l = 0; l < s.layers; ++l) {
    for (int p = 0; p < kNumBlockParams; ++p) {
      const int64_t n = BlockParamSize(m.d, p);
      const bool is_ln_weight = p == kLn1Weight || p == kLn2Weight;
      const bool is_weight = p == kAttnWeight || p == kProjWeight || p == kFcWeight;
      const double scale = is_ln_weight         ? 0.2
                           : is_weight          ? 1.5 * w_scale
                           : p == kFcProjWeight ? 0.75 * w_scale
                                                : 0.1;
      m.params.push_back(Normal(rng, n, scale, is_ln_weight ? 1.0 : 0.0));
      m.names.push_back("h." + std::to_string(l) + "." + std::to_string(p));
    }
  }
  m.params.push_back(Normal(rng, C, 0.2, 1.0));
  m.names.push_back("ln_f.weight");
  m.params.push_back(Normal(rng, C, 0.1));
  m.names.push_back("ln_f.bias");
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(s.vocab - 1));
  for (int64_t i = 0; i < m.d.rows(); ++i) {
    m.tokens.push_back(token(rng));
    m.targets.push_back(token(rng));
  }
  // A repeated token: its wte row sums two rows' gradients.
  if (m.d.rows() >= 2) m.tokens.back() = m.tokens.front();
  return m;
}

// The mean cross-entropy of the model in double, params given in double.
double RefLoss(const Model& m, const std::vector<std::vector<double>>& p) {
  const GptDims& d = m.d;
  const int64_t N = d.rows(), C = d.width, V = d.vocab;
  std::vector<double> x(N * C), y(N * C);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < d.seq; ++t) {
      const int64_t r = b * d.seq + t;
      for (int64_t c = 0; c < C; ++c) x[r * C + c] = p[0][m.tokens[r] * C + c] + p[1][t * C + c];
    }
  }
  for (int64_t l = 0; l < m.layers; ++l) {
    RefBlock(&p[m.BlockIndex(l, 0)], d, x.data(), y.data());
    x.swap(y);
  }
  RefLayerNorm(x.data(), p[m.LnfIndex()].data(), p[m.LnfIndex() + 1].data(), N, C, d.eps, y.data());
  double total = 0.0;
  std::vector<double> logits(V);
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t v = 0; v < V; ++v) {
      double s = 0.0;
      for (int64_t c = 0; c < C; ++c) s += y[r * C + c] * p[0][v * C + c];  // the tied head
      logits[v] = s;
    }
    const double max = *std::max_element(logits.begin(), logits.end());
    double z = 0.0;
    for (double l : logits) z += std::exp(l - max);
    total += std::log(z) + max - logits[m.targets[r]];
  }
  return total / N;
}

std::vector<std::vector<double>> ParamsInDouble(const Model& m) {
  std::vector<std::vector<double>> p;
  for (const auto& v : m.params) p.push_back(ToDouble(v));
  return p;
}

// Central differences of RefLoss over every element of every param.
std::vector<std::vector<double>> RefGradients(const Model& m) {
  std::vector<std::vector<double>> p = ParamsInDouble(m), g;
  for (auto& param : p) {
    g.emplace_back(param.size());
    for (size_t i = 0; i < param.size(); ++i) {
      const double saved = param[i];
      const double h = 1e-5 * std::max(1.0, std::fabs(saved));
      param[i] = saved + h;
      const double up = RefLoss(m, p);
      param[i] = saved - h;
      const double down = RefLoss(m, p);
      param[i] = saved;
      g.back()[i] = (up - down) / (2 * h);
    }
  }
  return g;
}

// The fp32 model as a trainer would run it: the loss and every param's
// gradient, wte's being the sum of EmbedBackward's and HeadBackward's.
// Activations, scratch and outputs start as NaN with guards after them.
struct Fp32Result {
  double loss = 0.0;
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<float>> block_outputs;  // x after each block
};

Fp32Result RunFp32(const Model& m, float scratch_fill = kNaN) {
  const GptDims& d = m.d;
  const int64_t N = d.rows(), C = d.width, V = d.vocab;
  Fp32Result res;
  std::vector<Guarded> xs;
  for (int64_t l = 0; l <= m.layers; ++l) xs.emplace_back(N * C);
  std::vector<Guarded> acts;
  for (int64_t l = 0; l < m.layers; ++l) acts.emplace_back(BlockActsFloats(d));
  Guarded scratch(BlockScratchFloats(d));
  std::fill(scratch.data.begin(), scratch.data.begin() + scratch.size, scratch_fill);

  EmbedForward(m.params[0].data(), m.params[1].data(), m.tokens.data(), d, xs[0].get());
  for (int64_t l = 0; l < m.layers; ++l) {
    std::vector<const float*> p;
    for (int i = 0; i < kNumBlockParams; ++i) p.push_back(m.params[m.BlockIndex(l, i)].data());
    BlockForward(p.data(), d, xs[l].get(), BlockActsView(d, acts[l].get()), xs[l + 1].get(),
                 scratch.get());
    res.block_outputs.emplace_back(xs[l + 1].get(), xs[l + 1].get() + N * C);
  }
  const float* lnf_w = m.params[m.LnfIndex()].data();
  const float* lnf_b = m.params[m.LnfIndex() + 1].data();
  Guarded xf(N * C), mean(N), rstd(N), logits(N * V);
  LayerNormForward(xs[m.layers].get(), lnf_w, lnf_b, N, C, d.eps, xf.get(), mean.get(), rstd.get());
  HeadForward(m.params[0].data(), xf.get(), d, logits.get());
  res.loss = CrossEntropy(logits.get(), m.targets.data(), d, 1.0f);

  for (const auto& v : m.params) res.grads.emplace_back(v.size(), kNaN);
  Guarded dwte_head(V * C), dxf(N * C), dx(N * C), dx_prev(N * C);
  HeadBackward(m.params[0].data(), xf.get(), logits.get(), d, dwte_head.get(), dxf.get());
  LayerNormBackward(xs[m.layers].get(), lnf_w, mean.get(), rstd.get(), dxf.get(), N, C, dx.get(),
                    res.grads[m.LnfIndex()].data(), res.grads[m.LnfIndex() + 1].data());
  for (int64_t l = m.layers - 1; l >= 0; --l) {
    std::vector<const float*> p;
    std::vector<float*> g;
    for (int i = 0; i < kNumBlockParams; ++i) {
      p.push_back(m.params[m.BlockIndex(l, i)].data());
      g.push_back(res.grads[m.BlockIndex(l, i)].data());
    }
    std::fill(dx_prev.data.begin(), dx_prev.data.begin() + N * C, kNaN);
    BlockBackward(p.data(), d, xs[l].get(), BlockActsView(d, acts[l].get()), dx.get(),
                  dx_prev.get(), g.data(), scratch.get());
    std::swap(dx.data, dx_prev.data);
  }
  EmbedBackward(m.tokens.data(), dx.get(), d, res.grads[0].data(), res.grads[1].data());
  for (int64_t i = 0; i < V * C; ++i) res.grads[0][i] += dwte_head.get()[i];  // the tie

  for (const auto& g : xs) g.ExpectGuardIntact("block input/output");
  for (const auto& g : acts) g.ExpectGuardIntact("BlockActs");
  scratch.ExpectGuardIntact("block scratch");
  for (const Guarded* g : {&xf, &mean, &rstd, &logits, &dwte_head, &dxf, &dx, &dx_prev}) {
    g->ExpectGuardIntact("model buffer");
  }
  return res;
}

class GptModelTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GptModelTest, LossAndEveryGradientMatchDoubleReference) {
  SCOPED_TRACE(SeedTrace());
  const Shape s = GetParam();
  std::mt19937_64 rng(Seed() + static_cast<uint64_t>(s.seq * 131 + s.heads * 17 + s.layers));
  const Model m = MakeModel(s, rng);
  const Fp32Result got = RunFp32(m);
  const double want = RefLoss(m, ParamsInDouble(m));
  EXPECT_GT(want, 0.5);  // not a degenerate case
  EXPECT_NEAR(got.loss, want, 1e-5 * want);

  const std::vector<std::vector<double>> ref = RefGradients(m);
  ASSERT_EQ(ref.size(), got.grads.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    double norm = 0.0;
    for (double g : ref[i]) norm += g * g;
    EXPECT_GT(norm, 0.0) << m.names[i] << " has no gradient at all";
    ExpectClose(got.grads[i].data(), ref[i], 1e-4, "gradient of " + m.names[i]);
  }
  // wpe rows past T are never used.
  for (int64_t i = s.seq * s.width; i < s.positions * s.width; ++i) {
    ASSERT_EQ(got.grads[1][i], 0.0f) << "wpe row " << i / s.width;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptModelTest,
    ::testing::Values(Shape{2, 5, 8, 2, 11, 7, 2},   // the main case
                      Shape{3, 1, 8, 2, 11, 4, 2},   // T = 1: attention is the identity on v
                      Shape{2, 4, 6, 1, 9, 6, 1},    // H = 1
                      Shape{1, 7, 12, 3, 13, 7, 1},  // T = P, D = 4, one sequence
                      Shape{2, 6, 8, 8, 10, 8, 1}),  // D = 1
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return "B" + std::to_string(s.batch) + "T" + std::to_string(s.seq) + "C" +
             std::to_string(s.width) + "H" + std::to_string(s.heads) + "L" +
             std::to_string(s.layers);
    });

// Scratch full of garbage instead of NaN, a second run: the same bits.
TEST(GptModelDeterminism, SameBitsWhateverTheScratchHeld) {
  std::mt19937_64 rng(Seed() + 7);
  const Model m = MakeModel(Shape{2, 5, 8, 2, 11, 7, 2}, rng);
  const Fp32Result a = RunFp32(m), b = RunFp32(m, -3.25e7f);
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0);
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_EQ(std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)),
              0)
        << m.names[i];
  }
}

// Changing token t' (its id, so every block's input row t') changes no
// output row before t', bit for bit, and does change row t'.
TEST(GptModelCausality, LaterTokenLeavesEarlierRowsUnchanged) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 11);
  const Shape s{2, 6, 8, 2, 11, 6, 2};
  Model m = MakeModel(s, rng);
  const Fp32Result before = RunFp32(m);
  const int64_t changed = 3;  // in sequence 1
  const int64_t row = s.seq + changed;
  m.tokens[row] = (m.tokens[row] + 1 + static_cast<int32_t>(rng() % (s.vocab - 1))) % s.vocab;
  const Fp32Result after = RunFp32(m);
  for (int64_t l = 0; l < s.layers; ++l) {
    const float* x0 = before.block_outputs[l].data();
    const float* x1 = after.block_outputs[l].data();
    for (int64_t r = 0; r < s.batch * s.seq; ++r) {
      const bool same = std::memcmp(x0 + r * s.width, x1 + r * s.width, s.width * 4) == 0;
      if (r < row) {
        EXPECT_TRUE(same) << "block " << l << " row " << r << " changed by row " << row;
      } else if (r == row) {
        EXPECT_FALSE(same) << "block " << l << " row " << r << " did not see its own token";
      }
    }
  }
}

// One block at a larger shape (T = 70: two attention row chunks, the last
// partial; D = 16), where the BLAS takes its blocked paths on the strided
// q, k, v columns: the output in full against
// RefBlock, and dx and every param's gradient at random elements against
// central differences of sum(y * dy).
TEST(GptBlock, LargerShapeSpotChecked) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 13);
  Model m = MakeModel(Shape{1, 70, 48, 3, 5, 70, 1}, rng);
  const GptDims& d = m.d;
  const int64_t N = d.rows(), C = d.width;
  const std::vector<float> x = Normal(rng, N * C, 1.0), dy = Normal(rng, N * C, 1.0);
  std::vector<const float*> p;
  std::vector<float*> g;
  std::vector<std::vector<float>> grads;
  for (int i = 0; i < kNumBlockParams; ++i) {
    p.push_back(m.params[m.BlockIndex(0, i)].data());
    grads.emplace_back(m.params[m.BlockIndex(0, i)].size(), kNaN);
  }
  for (auto& v : grads) g.push_back(v.data());
  Guarded acts(BlockActsFloats(d)), y(N * C), dx(N * C), scratch(BlockScratchFloats(d));
  BlockForward(p.data(), d, x.data(), BlockActsView(d, acts.get()), y.get(), scratch.get());
  BlockBackward(p.data(), d, x.data(), BlockActsView(d, acts.get()), dy.data(), dx.get(), g.data(),
                scratch.get());
  for (const Guarded* b : {&acts, &y, &dx, &scratch}) b->ExpectGuardIntact("block buffer");

  std::vector<std::vector<double>> p64;
  for (int i = 0; i < kNumBlockParams; ++i) p64.push_back(ToDouble(m.params[m.BlockIndex(0, i)]));
  std::vector<double> x64 = ToDouble(x), y64(N * C);
  RefBlock(p64.data(), d, x64.data(), y64.data());
  ExpectClose(y.get(), y64, 1e-5, "block output");

  auto objective = [&]() {
    RefBlock(p64.data(), d, x64.data(), y64.data());
    double s = 0.0;
    for (int64_t i = 0; i < N * C; ++i) s += y64[i] * dy[i];
    return s;
  };
  // |error| <= 1e-4 of the largest gradient among the spots, as for the
  // model. Spots are drawn from [lo, hi) of the array.
  auto spot_check = [&](std::vector<double>& v, const float* got,
                        const std::vector<std::array<size_t, 3>>& draws, const std::string& what) {
    std::vector<double> want;
    std::vector<float> got_at;
    for (const auto& [count, lo, hi] : draws) {
      std::uniform_int_distribution<size_t> pick(lo, hi - 1);
      for (size_t k = 0; k < count; ++k) {
        const size_t i = pick(rng);
        const double saved = v[i], h = 1e-5 * std::max(1.0, std::fabs(saved));
        v[i] = saved + h;
        const double up = objective();
        v[i] = saved - h;
        const double down = objective();
        v[i] = saved;
        want.push_back((up - down) / (2 * h));
        got_at.push_back(got[i]);
      }
    }
    ExpectClose(got_at.data(), want, 1e-4, what);
  };
  spot_check(x64, dx.get(), {{24, 0, x64.size()}}, "block dx");
  for (int i = 0; i < kNumBlockParams; ++i) {
    const size_t n = p64[i].size(), c = static_cast<size_t>(C);
    // c_attn's k bias has no gradient (it shifts a row's scores by one
    // constant, which the softmax drops): spots there are checked against
    // the scale of q's and v's, drawn too.
    const std::vector<std::array<size_t, 3>> draws =
        i == kAttnBias ? std::vector<std::array<size_t, 3>>{{3, 0, c}, {2, c, 2 * c}, {3, 2 * c, n}}
                       : std::vector<std::array<size_t, 3>>{{4, 0, n}};
    spot_check(p64[i], grads[i].data(), draws, "block gradient of param " + std::to_string(i));
  }
}

// ---------------------------------------------------------------------------
// The pieces.

TEST(GptAttention, ForwardAndBackwardMatchDoubleReference) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 21);
  for (const std::array<int64_t, 4>& shape : std::vector<std::array<int64_t, 4>>{
           {2, 5, 8, 2},
           {1, 1, 4, 1},
           {3, 4, 6, 1},
           {2, 7, 12, 3},
           {1, 9, 8, 8},
           // Past one row chunk (64): 2 and 3 chunks, the last partial.
           {2, 70, 6, 3},
           {1, 130, 8, 2}}) {
    // Plain locals, not structured bindings: lambdas below capture them.
    const int64_t B = shape[0], T = shape[1], C = shape[2], H = shape[3];
    SCOPED_TRACE("B" + std::to_string(B) + " T" + std::to_string(T) + " C" + std::to_string(C) +
                 " H" + std::to_string(H));
    GptDims d;
    d.batch = B, d.seq = T, d.width = C, d.heads = H;
    const int64_t N = d.rows();
    // Scores of order 1-3 so that the softmax is neither flat nor one-hot.
    const std::vector<float> qkv = Normal(rng, N * 3 * C, 1.2);
    const std::vector<float> dout = Normal(rng, N * C, 1.0);
    Guarded att(B * H * T * T), out(N * C), dqkv(N * 3 * C), scratch(BlockScratchFloats(d));
    AttentionForward(qkv.data(), d, att.get(), out.get());
    AttentionBackward(qkv.data(), att.get(), dout.data(), d, dqkv.get(), scratch.get());
    att.ExpectGuardIntact("att");
    out.ExpectGuardIntact("out");
    dqkv.ExpectGuardIntact("dqkv");
    scratch.ExpectGuardIntact("scratch");

    std::vector<double> q64 = ToDouble(qkv), att64(B * H * T * T), out64(N * C);
    RefAttention(q64.data(), d, att64.data(), out64.data());
    ExpectClose(att.get(), att64, 1e-6, "att");
    ExpectClose(out.get(), out64, 1e-6, "attention output");
    // The upper triangle is exactly 0.
    for (int64_t bh = 0; bh < B * H; ++bh) {
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = i + 1; j < T; ++j) ASSERT_EQ(att.get()[(bh * T + i) * T + j], 0.0f);
      }
    }
    // dqkv against central differences of sum(out * dout).
    std::vector<double> want(N * 3 * C), o(N * C);
    auto objective = [&]() {
      RefAttention(q64.data(), d, nullptr, o.data());
      double s = 0.0;
      for (int64_t i = 0; i < N * C; ++i) s += o[i] * dout[i];
      return s;
    };
    // Every element at the small shapes; 120 random ones (the same bound,
    // on the spots' own scale) past one row chunk, where each difference
    // costs a whole attention.
    std::vector<int64_t> spots;
    if (N * 3 * C <= 1000) {
      for (int64_t i = 0; i < N * 3 * C; ++i) spots.push_back(i);
    } else {
      std::uniform_int_distribution<int64_t> pick(0, N * 3 * C - 1);
      for (int k = 0; k < 120; ++k) spots.push_back(pick(rng));
    }
    std::vector<float> got_at;
    want.clear();
    for (const int64_t i : spots) {
      const double saved = q64[i], h = 1e-5;
      q64[i] = saved + h;
      const double up = objective();
      q64[i] = saved - h;
      const double down = objective();
      q64[i] = saved;
      want.push_back((up - down) / (2 * h));
      got_at.push_back(dqkv.get()[i]);
    }
    ExpectClose(got_at.data(), want, 1e-5, "dqkv");
  }
}

// Changing q, k and v of a later row of one sequence changes no earlier
// row's att or out, bit for bit.
TEST(GptAttention, CausalMask) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 23);
  GptDims d;
  d.batch = 2, d.seq = 9, d.width = 8, d.heads = 2;
  const int64_t N = d.rows(), C = d.width, T = d.seq;
  std::vector<float> qkv = Normal(rng, N * 3 * C, 1.0);
  std::vector<float> att0(2 * 2 * T * T), out0(N * C), att1(att0.size()), out1(out0.size());
  AttentionForward(qkv.data(), d, att0.data(), out0.data());
  const int64_t t_changed = 4;
  for (int64_t c = 0; c < 3 * C; ++c) qkv[(T + t_changed) * 3 * C + c] += 0.5f + c * 0.01f;
  AttentionForward(qkv.data(), d, att1.data(), out1.data());
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const bool out_same = std::memcmp(&out0[(b * T + t) * C], &out1[(b * T + t) * C], C * 4) == 0;
      bool att_same = true;
      for (int64_t h = 0; h < d.heads; ++h) {
        const int64_t at = ((b * d.heads + h) * T + t) * T;
        att_same = att_same && std::memcmp(&att0[at], &att1[at], T * 4) == 0;
      }
      if (b == 0 || t < t_changed) {
        EXPECT_TRUE(out_same && att_same) << "sequence " << b << " row " << t << " changed";
      } else {
        EXPECT_FALSE(out_same) << "sequence " << b << " row " << t << " did not change";
      }
    }
  }
}

TEST(GptLayerNorm, ForwardAndBackwardMatchDoubleReference) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 31);
  for (const int64_t width : {1, 3, 8, 64, 257}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const int64_t rows = 5;
    const float eps = 1e-5f;
    // An offset mean and rows of different scales; row 0's spread is 1e-2
    // of its mean (eps is 10% of its variance). There the float mean's own
    // rounding (3e-8) over the spread (1e-2) times rstd puts ~3e-6 into xhat,
    // which no fp32 LayerNorm avoids: the bounds below are 1e-5 to 5e-5.
    std::vector<float> x = Normal(rng, rows * width, 1.0, 3.0);
    for (int64_t i = 0; i < width; ++i) x[i] = 0.5f + 1e-2f * x[i];
    const std::vector<float> w = Normal(rng, width, 0.3, 1.0), b = Normal(rng, width, 0.2);
    const std::vector<float> dout = Normal(rng, rows * width, 1.0);
    Guarded out(rows * width), mean(rows), rstd(rows), dx(rows * width), dw(width), db(width);
    LayerNormForward(x.data(), w.data(), b.data(), rows, width, eps, out.get(), mean.get(),
                     rstd.get());
    LayerNormBackward(x.data(), w.data(), mean.get(), rstd.get(), dout.data(), rows, width,
                      dx.get(), dw.get(), db.get());
    for (const Guarded* g : {&out, &mean, &rstd, &dx, &dw, &db}) g->ExpectGuardIntact("LayerNorm");

    std::vector<double> x64 = ToDouble(x), w64 = ToDouble(w), b64 = ToDouble(b);
    std::vector<double> o(rows * width);
    RefLayerNorm(x64.data(), w64.data(), b64.data(), rows, width, eps, o.data());
    ExpectClose(out.get(), o, 1e-5, "LayerNorm output");
    std::vector<double> want_mean(rows), want_rstd(rows);
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0.0, v = 0.0;
      for (int64_t i = 0; i < width; ++i) m += x64[r * width + i];
      m /= width;
      for (int64_t i = 0; i < width; ++i) v += (x64[r * width + i] - m) * (x64[r * width + i] - m);
      want_mean[r] = m;
      want_rstd[r] = 1.0 / std::sqrt(v / width + eps);
      EXPECT_NEAR(mean.get()[r], want_mean[r], 1e-6 * (std::fabs(m) + 1)) << "row " << r;
      EXPECT_NEAR(rstd.get()[r], want_rstd[r], 1e-5 * want_rstd[r]) << "row " << r;
    }

    auto objective = [&]() {
      RefLayerNorm(x64.data(), w64.data(), b64.data(), rows, width, eps, o.data());
      double s = 0.0;
      for (int64_t i = 0; i < rows * width; ++i) s += o[i] * dout[i];
      return s;
    };
    auto differences = [&](std::vector<double>& v) {
      std::vector<double> g(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const double saved = v[i], h = 1e-6 * std::max(1.0, std::fabs(saved));
        v[i] = saved + h;
        const double up = objective();
        v[i] = saved - h;
        const double down = objective();
        v[i] = saved;
        g[i] = (up - down) / (2 * h);
      }
      return g;
    };
    ExpectClose(dx.get(), differences(x64), 5e-5, "LayerNorm dx");
    ExpectClose(dw.get(), differences(w64), 3e-5, "LayerNorm dw");
    ExpectClose(db.get(), differences(b64), 1e-5, "LayerNorm db");
  }
}

TEST(GptGelu, ForwardAndBackwardMatchDoubleReference) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 41);
  std::vector<float> u = Normal(rng, 4000, 3.0);
  // The tails and the centre.
  for (float v : {-60.0f, -20.0f, -9.0f, -1e-3f, 0.0f, 1e-6f, 1e-3f, 9.0f, 20.0f, 60.0f}) {
    u.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(u.size());
  const std::vector<float> dout = Normal(rng, n, 1.0);
  Guarded out(n), du(n);
  GeluForward(u.data(), n, out.get());
  GeluBackward(u.data(), dout.data(), n, du.get());
  out.ExpectGuardIntact("gelu");
  du.ExpectGuardIntact("gelu grad");
  for (int64_t i = 0; i < n; ++i) {
    const double x = u[i];
    // The fp32 evaluation of 0.5 u (1 + tanh(.)) (HF's, in torch, too)
    // rounds 1 + tanh to ~6e-8 absolute: the bound is that times |u|.
    const double want = RefGelu(x);
    ASSERT_NEAR(out.get()[i], want, 2.5e-7 * (std::fabs(x) + 1e-3)) << "gelu(" << x << ")";
    const double h = 1e-6 * std::max(1.0, std::fabs(x));
    const double slope = (RefGelu(x + h) - RefGelu(x - h)) / (2 * h);
    ASSERT_NEAR(du.get()[i], dout[i] * slope, 1e-6 * std::fabs(dout[i]) * (std::fabs(x) + 1))
        << "gelu'(" << x << ")";
  }
}

TEST(GptCrossEntropy, LossAndSeededGradientMatchDoubleReference) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 51);
  GptDims d;
  d.batch = 3, d.seq = 4, d.vocab = 17;
  const int64_t N = d.rows(), V = d.vocab;
  std::vector<float> logits = Normal(rng, N * V, 2.0, 30.0);  // offset: the max must be taken
  std::vector<int32_t> targets(N);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % V);
  const float seed = 3.5f;
  const std::vector<float> orig = logits;
  const double loss = CrossEntropy(logits.data(), targets.data(), d, seed);
  double want = 0.0;
  std::vector<double> want_grad(N * V);
  for (int64_t r = 0; r < N; ++r) {
    double z = 0.0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(orig[r * V + v]));
    want += std::log(z) - orig[r * V + targets[r]];
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(static_cast<double>(orig[r * V + v])) / z;
      want_grad[r * V + v] = (p - (v == targets[r] ? 1.0 : 0.0)) * seed / N;
    }
  }
  want /= N;
  EXPECT_NEAR(loss, want, 1e-12 * want);
  ExpectClose(logits.data(), want_grad, 1e-6, "dlogits");
}

}  // namespace
}  // namespace internal
}  // namespace gpt
}  // namespace zeroshard
