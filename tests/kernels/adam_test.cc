// Tests of the fused Adam / AdamW CPU kernels against the double-precision
// reference, and of bitwise identity between every ISA path this CPU runs.
#include "kernels/cpu/adam.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/reference/adam_reference.h"
#include "kernels/reference/bf16_reference.h"
#include "kernels/reference/fp16_reference.h"
#include "tests/kernels/adam_reference_params.h"
#include "tests/kernels/isa_report.h"
#include "tests/test_env.h"
#include "tests/test_seed.h"

namespace zeroshard::kernels {
namespace {

using ::zeroshard::testing::LightMode;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// Empty, below, at and above a vector width and a 128-element block, an odd
// tail, and one large size. The large one is most of the run time; under
// ZS_TEST_LIGHT (the sanitizer builds) it is a tenth as large.
std::vector<size_t> Sizes() {
  std::vector<size_t> sizes = {0, 1, 7, 127, 128, 129, 1000, 4099};
  sizes.push_back(LightMode() ? 30011 : 300007);
  return sizes;
}

enum class Variant {
  kFp32,
  kMixedFp32Grad,
  kMixedBf16Grad,
  kMixedFp16Fp32Grad,
  kMixedFp16Fp16Grad
};

const Variant kVariants[] = {Variant::kFp32, Variant::kMixedFp32Grad, Variant::kMixedBf16Grad,
                             Variant::kMixedFp16Fp32Grad, Variant::kMixedFp16Fp16Grad};

bool HasFp16Param(Variant v) {
  return v == Variant::kMixedFp16Fp32Grad || v == Variant::kMixedFp16Fp16Grad;
}

const char* VariantName(Variant v) {
  switch (v) {
    case Variant::kFp32:
      return "fp32";
    case Variant::kMixedFp32Grad:
      return "bf16-mixed/fp32-grad";
    case Variant::kMixedBf16Grad:
      return "bf16-mixed/bf16-grad";
    case Variant::kMixedFp16Fp32Grad:
      return "fp16-mixed/fp32-grad";
    case Variant::kMixedFp16Fp16Grad:
      return "fp16-mixed/fp16-grad";
  }
  return "?";
}

// The 16-bit param copy the variant must write: RNE of the fp32 master.
uint16_t RoundToParam(Variant v, float x) {
  return HasFp16Param(v) ? reference::RoundToFp16Reference(x) : reference::RoundToBf16Reference(x);
}

// Buffers of one update, each at a deliberately odd offset from an aligned
// allocation so that no SIMD load or store is aligned.
struct AdamBuffers {
  explicit AdamBuffers(size_t n, size_t misalign)
      : n(n),
        p_store(n + 8),
        g_store(n + 8),
        m_store(n + 8),
        v_store(n + 8),
        out_store(n + 8),
        g16_store(n + 8),
        gh_store(n + 8),
        offset(misalign) {}
  float* p() { return p_store.data() + offset; }
  float* g() { return g_store.data() + offset + 1; }
  float* m() { return m_store.data() + offset + 2; }
  float* v() { return v_store.data() + offset + 3; }
  uint16_t* out() { return out_store.data() + offset + 1; }
  uint16_t* g16() { return g16_store.data() + offset + 3; }  // bf16 grads
  uint16_t* gh() { return gh_store.data() + offset + 2; }    // fp16 grads

  size_t n;
  std::vector<float> p_store, g_store, m_store, v_store;
  std::vector<uint16_t> out_store, g16_store, gh_store;
  size_t offset;
};

// Realistic, never-zero state: params ~ 0.05, grads over four decades, m and
// v consistent with earlier steps of such grads.
void FillState(std::mt19937_64& rng, AdamBuffers& b) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-4.0f, 0.0f);
  for (size_t i = 0; i < b.n; ++i) {
    b.p()[i] = 0.05f * normal(rng);
    const float scale = std::pow(10.0f, decade(rng));
    b.m()[i] = 0.1f * scale * normal(rng);
    const float s = scale * normal(rng);
    b.v()[i] = 1e-3f * s * s + 1e-20f;
    b.out()[i] = reference::RoundToBf16Reference(b.p()[i]);
  }
}

// Grads over four decades below `magnitude`; the 16-bit copies are the fp32
// grads rounded. With a loss scale the engine hands over grads of up to ~1e4
// (fp16's range ends at 65504) and a grad_scale of about 1/loss_scale.
void FillGrads(std::mt19937_64& rng, AdamBuffers& b, double magnitude = 1.0) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-4.0f, 0.0f);
  for (size_t i = 0; i < b.n; ++i) {
    b.g()[i] = static_cast<float>(magnitude) * std::pow(10.0f, decade(rng)) * normal(rng);
    b.g16()[i] = reference::RoundToBf16Reference(b.g()[i]);
    b.gh()[i] = reference::RoundToFp16Reference(b.g()[i]);
  }
}

void RunVariant(Isa isa, Variant variant, AdamBuffers& b, const AdamConstants& c) {
  switch (variant) {
    case Variant::kFp32:
      return AdamFp32On(isa, b.p(), b.g(), b.m(), b.v(), b.n, c);
    case Variant::kMixedFp32Grad:
      return AdamMixedBf16On(isa, b.p(), b.out(), b.g(), b.m(), b.v(), b.n, c);
    case Variant::kMixedBf16Grad:
      return AdamMixedBf16GradBf16On(isa, b.p(), b.out(), b.g16(), b.m(), b.v(), b.n, c);
    case Variant::kMixedFp16Fp32Grad:
      return AdamMixedFp16On(isa, b.p(), b.out(), b.g(), b.m(), b.v(), b.n, c);
    case Variant::kMixedFp16Fp16Grad:
      return AdamMixedFp16GradFp16On(isa, b.p(), b.out(), b.gh(), b.m(), b.v(), b.n, c);
  }
}

struct Case {
  AdamMode mode;
  double weight_decay;
  double grad_scale;
  double grad_magnitude = 1.0;  // of the grads handed to the kernel (FillGrads)
};

const Case kCases[] = {
    {AdamMode::kAdamW, 0.0, 1.0},
    {AdamMode::kAdamW, 0.1, 0.37},
    {AdamMode::kAdamL2, 0.0, 1.0},
    {AdamMode::kAdamL2, 0.05, 2.5},
    // Loss-scaled grads (scale 8192, averaged over 2 ranks, clipped by 0.8).
    {AdamMode::kAdamW, 0.01, 0.8 / (2 * 8192.0), 8192.0},
    {AdamMode::kAdamL2, 0.01, 0.8 / (2 * 8192.0), 8192.0},
};

std::string Describe(Isa isa, Variant variant, const Case& c, size_t n, int64_t step) {
  return std::string(IsaName(isa)) + " " + VariantName(variant) +
         (c.mode == AdamMode::kAdamW ? " adamw" : " adam-l2") +
         " wd=" + std::to_string(c.weight_decay) + " grad_scale=" + std::to_string(c.grad_scale) +
         " grad_magnitude=" + std::to_string(c.grad_magnitude) + " n=" + std::to_string(n) +
         " step=" + std::to_string(step);
}

// Tolerance. The kernel runs every operation in fp32, each rounding with a
// relative error of at most u = 2^-24, from fp32-rounded constants (another u
// each); the reference runs the same formulas in double (error ~2^-53,
// negligible). Each result passes through fewer than 16 such roundings, so
// its error is below 16u times the magnitudes of the terms that formed it:
//   m: 16u (|beta1 m0| + (1-beta1)|g|)                  (m may cancel: absolute bound)
//   v: 16u (beta2 v0 + (1-beta2) g^2)                   (all terms positive)
//   p: 16u (|p0 decay| + |update|) + step_size * err(m) / denom
//        + |update| * err(denom) / denom,  err(denom) = err(v) / (2 sqrt(v) sqrt(bc2))
// where g includes grad_scale and the L2 term. (With L2, g = grad + wd p can
// cancel, so m and v may carry a large *relative* error: the bounds follow
// it through to p instead of assuming a relative error of a few u.) Each step starts the reference
// from the kernel's own fp32 state, so errors do not compound across steps.
constexpr double kU = 1.0 / (1 << 24);
constexpr double kK = 16.0;

void ExpectStepMatchesReference(Isa isa, Variant variant, const Case& tc, int64_t step,
                                AdamBuffers& b, const AdamStepParams& params) {
  const size_t n = b.n;
  std::vector<double> p(n), g(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = b.p()[i];
    switch (variant) {
      case Variant::kMixedBf16Grad:
        g[i] = reference::Bf16ValueReference(b.g16()[i]);
        break;
      case Variant::kMixedFp16Fp16Grad:
        g[i] = reference::Fp16ValueReference(b.gh()[i]);
        break;
      default:
        g[i] = b.g()[i];
    }
    m[i] = b.m()[i];
    v[i] = b.v()[i];
  }
  const std::vector<double> p0 = p, m0 = m, v0 = v;
  RunVariant(isa, variant, b, MakeAdamConstants(params));
  reference::AdamStepReference(testing::ToReferenceParams(params), p.data(), g.data(), m.data(),
                               v.data(), n);

  const bool adamw = params.mode == AdamMode::kAdamW;
  const double bc1 = 1.0 - std::pow(params.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(params.beta2, static_cast<double>(step));
  const double step_size = params.lr / bc1;
  const double decay = adamw ? 1.0 - params.lr * params.weight_decay : 1.0;
  int failures = 0;
  for (size_t i = 0; i < n && failures < 5; ++i) {
    double ge = std::fabs(g[i] * params.grad_scale);
    if (!adamw) ge += std::fabs(params.weight_decay * p0[i]);
    const double m_err = kK * kU * (params.beta1 * std::fabs(m0[i]) + (1 - params.beta1) * ge);
    const double v_err = kK * kU * (params.beta2 * v0[i] + (1 - params.beta2) * ge * ge);
    const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + params.eps;
    const double update = step_size * std::fabs(m[i]) / denom;
    const double denom_err = v_err / (2.0 * std::sqrt(v[i]) * std::sqrt(bc2));
    const double p_err = kK * kU * (std::fabs(p0[i] * decay) + update) + step_size * m_err / denom +
                         update * denom_err / denom;
    const bool ok = std::fabs(b.m()[i] - m[i]) <= m_err && std::fabs(b.v()[i] - v[i]) <= v_err &&
                    std::fabs(b.p()[i] - p[i]) <= p_err;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << Describe(isa, variant, tc, n, step) << " element " << i << ": p " << b.p()[i]
                    << " vs " << p[i] << " (tol " << p_err << "), m " << b.m()[i] << " vs " << m[i]
                    << " (tol " << m_err << "), v " << b.v()[i] << " vs " << v[i] << " (tol "
                    << v_err << ")";
    }
    if (variant != Variant::kFp32 && b.out()[i] != RoundToParam(variant, b.p()[i])) {
      ++failures;
      ADD_FAILURE() << Describe(isa, variant, tc, n, step) << " element " << i
                    << ": 16-bit param out 0x" << std::hex << b.out()[i]
                    << " is not round-to-nearest-even of master " << b.p()[i] << std::dec;
    }
  }
}

TEST(AdamTest, MatchesDoubleReferenceOverFiveSteps) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  for (Isa isa : SupportedIsas()) {
    for (Variant variant : kVariants) {
      for (const Case& tc : kCases) {
        for (size_t n : Sizes()) {
          AdamBuffers b(n, n % 5);
          FillState(rng, b);
          for (int64_t step = 1; step <= 5; ++step) {
            FillGrads(rng, b, tc.grad_magnitude);
            AdamStepParams params;
            params.mode = tc.mode;
            params.lr = 1e-3 * step;  // vary it too
            params.weight_decay = tc.weight_decay;
            params.grad_scale = tc.grad_scale;
            params.step = step;
            ExpectStepMatchesReference(isa, variant, tc, step, b, params);
            if (::testing::Test::HasFailure()) return;
          }
        }
      }
    }
  }
}

// "" if a and b hold the same bits, else the first element that differs. Two
// NaNs count as equal: when NaNs of different sign or payload meet, x86
// returns the first operand's, and the compiler may order the operands of a
// commutative operation differently in each path (see adam.h).
std::string FirstDifference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], sizeof(x));
    std::memcpy(&y, &b[i], sizeof(y));
    if (x == y || (std::isnan(a[i]) && std::isnan(b[i]))) continue;
    char text[96];
    std::snprintf(text, sizeof(text), "element %zu: 0x%08x vs 0x%08x", i, x, y);
    return text;
  }
  return "";
}

// The same for 16-bit param copies (bf16, or fp16 if `fp16`).
std::string FirstDifference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                            bool fp16) {
  const uint16_t inf = fp16 ? 0x7c00 : 0x7f80;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i] || ((a[i] & 0x7fff) > inf && (b[i] & 0x7fff) > inf)) continue;
    char text[64];
    std::snprintf(text, sizeof(text), "element %zu: 0x%04x vs 0x%04x", i, a[i], b[i]);
    return text;
  }
  return "";
}

// Every path must produce the same bits (the engine's cross-rank
// reproducibility relies on it), for ordinary and for extreme inputs.
void ExpectPathsBitwiseEqual(bool extreme_values) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + (extreme_values ? 1 : 0));
  const std::vector<Isa> isas = SupportedIsas();
  if (isas.size() < 2) {
    // Nothing to compare: say so in the log and the XML report (ctest
    // counts a skip apart from a pass).
    GTEST_SKIP() << "only the " << IsaName(isas.front())
                 << " path runs on this CPU: no second path to compare its bits with";
  }
  for (Variant variant : kVariants) {
    for (const Case& tc : kCases) {
      for (size_t n : Sizes()) {
        AdamBuffers initial(n, 1);
        FillState(rng, initial);
        FillGrads(rng, initial, tc.grad_magnitude);
        if (extreme_values) {
          const float specials[] = {INFINITY, -INFINITY, NAN,  1e30f, -1e30f,
                                    1e-40f,   -0.0f,     0.0f, 3e38f, 1e-45f};
          std::uniform_int_distribution<size_t> pick(0, std::size(specials) - 1);
          for (size_t i = 0; i < n; i += 3) {
            initial.g()[i] = specials[pick(rng)];
            initial.g16()[i] = reference::RoundToBf16Reference(initial.g()[i]);
            initial.gh()[i] = reference::RoundToFp16Reference(initial.g()[i]);
            // fp16 grads the fp32 specials do not produce: signalling and
            // payload NaNs, the smallest subnormal, the largest finite half.
            const uint16_t half_specials[] = {0x7c01, 0xfd55, 0x0001, 0x83ff, 0x7bff, 0xfbff};
            if (i % 5 == 0) initial.gh()[i] = half_specials[(i / 5) % std::size(half_specials)];
            if (i % 7 == 0) initial.m()[i] = specials[pick(rng)];
            if (i % 11 == 0) initial.v()[i] = std::fabs(specials[pick(rng)]);
            if (i % 13 == 0) initial.p()[i] = specials[pick(rng)];
          }
        }
        std::vector<AdamBuffers> results;
        for (Isa isa : isas) {
          AdamBuffers b = initial;
          for (int64_t step = 1; step <= 3; ++step) {
            AdamStepParams params;
            params.mode = tc.mode;
            params.weight_decay = tc.weight_decay;
            params.grad_scale = tc.grad_scale;
            params.step = step;
            RunVariant(isa, variant, b, MakeAdamConstants(params));
          }
          results.push_back(std::move(b));
        }
        for (size_t k = 1; k < results.size(); ++k) {
          const std::string what = std::string(IsaName(isas[k])) + " vs " + IsaName(isas[0]) + " " +
                                   Describe(isas[k], variant, tc, n, 3);
          const AdamBuffers& a = results[0];
          const AdamBuffers& b = results[k];
          EXPECT_EQ("", FirstDifference(a.p_store, b.p_store)) << "master/param differ: " << what;
          EXPECT_EQ("", FirstDifference(a.m_store, b.m_store)) << "m differs: " << what;
          EXPECT_EQ("", FirstDifference(a.v_store, b.v_store)) << "v differs: " << what;
          EXPECT_EQ("", FirstDifference(a.out_store, b.out_store, HasFp16Param(variant)))
              << "16-bit param_out differs: " << what;
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

TEST(AdamTest, AllPathsBitwiseIdentical) { ExpectPathsBitwiseEqual(false); }

TEST(AdamTest, AllPathsBitwiseIdenticalOnInfNanSubnormal) { ExpectPathsBitwiseEqual(true); }

TEST(AdamTest, DispatchingEntryPointsUseActivePath) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 2);
  AdamBuffers a(4099, 1);
  FillState(rng, a);
  FillGrads(rng, a);
  AdamBuffers b = a;
  const AdamConstants c = MakeAdamConstants(AdamStepParams{});
  AdamMixedBf16(a.p(), a.out(), a.g(), a.m(), a.v(), a.n, c);
  AdamMixedBf16On(ActiveIsa(), b.p(), b.out(), b.g(), b.m(), b.v(), b.n, c);
  EXPECT_EQ(0, std::memcmp(a.p_store.data(), b.p_store.data(), a.p_store.size() * 4));
  EXPECT_EQ(a.out_store, b.out_store);
  AdamMixedFp16GradFp16(a.p(), a.out(), a.gh(), a.m(), a.v(), a.n, c);
  AdamMixedFp16GradFp16On(ActiveIsa(), b.p(), b.out(), b.gh(), b.m(), b.v(), b.n, c);
  AdamMixedFp16(a.p(), a.out(), a.g(), a.m(), a.v(), a.n, c);
  AdamMixedFp16On(ActiveIsa(), b.p(), b.out(), b.g(), b.m(), b.v(), b.n, c);
  EXPECT_EQ(0, std::memcmp(a.p_store.data(), b.p_store.data(), a.p_store.size() * 4));
  EXPECT_EQ(a.out_store, b.out_store);
}

TEST(AdamTest, ConstantsFollowTheContract) {
  AdamStepParams p;
  p.lr = 0.01;
  p.weight_decay = 0.1;
  p.step = 3;
  const AdamConstants w = MakeAdamConstants(p);
  EXPECT_EQ(w.decay_factor, static_cast<float>(1.0 - 0.01 * 0.1));
  EXPECT_EQ(w.l2, 0.0f);
  EXPECT_EQ(w.step_size, static_cast<float>(0.01 / (1.0 - std::pow(0.9, 3.0))));
  EXPECT_EQ(w.inv_sqrt_bias_correction2,
            static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(0.999, 3.0))));
  p.mode = AdamMode::kAdamL2;
  const AdamConstants l2 = MakeAdamConstants(p);
  EXPECT_EQ(l2.decay_factor, 1.0f);
  EXPECT_EQ(l2.l2, 0.1f);
}

// A path this CPU cannot run is reported, never silently counted as passed;
// every path reported as tested is one this binary ran and found equal to
// the double-precision reference: the scalar path always, the dispatching
// entry points' path among them.
TEST(AdamTest, ReportsIsaPathsNotRun) {
  testing::ReportIsaPaths();
  RecordProperty("random_seed", std::to_string(Seed()));
  SCOPED_TRACE(SeedTrace());
  const std::vector<Isa> isas = SupportedIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar) << "the scalar path must always be tested";
  bool active_tested = false;
  for (Isa isa : isas) active_tested |= isa == ActiveIsa();
  EXPECT_TRUE(active_tested) << "the active path " << IsaName(ActiveIsa()) << " is not tested";
  std::mt19937_64 rng(Seed() + 3);
  for (Isa isa : isas) {
    for (Variant variant : kVariants) {
      for (const Case& loss_scaled : {kCases[4], kCases[5]}) {
        // Adam and AdamW on loss-scaled grads; two vector widths and a
        // tail (300 = 2 x 128 + 44), two steps from realistic state.
        AdamBuffers b(300, 3);
        FillState(rng, b);
        for (int64_t step = 1; step <= 2; ++step) {
          FillGrads(rng, b, loss_scaled.grad_magnitude);
          AdamStepParams params;
          params.mode = loss_scaled.mode;
          params.lr = 2e-3;
          params.weight_decay = loss_scaled.weight_decay;
          params.grad_scale = loss_scaled.grad_scale;
          params.step = step;
          ExpectStepMatchesReference(isa, variant, loss_scaled, step, b, params);
          if (HasFailure()) return;
        }
      }
    }
  }
}

}  // namespace
}  // namespace zeroshard::kernels
