// The shared per-element rules of kernels/common (AdamElement,
// NormBlockSumSquares, Accumulate*) against the CPU kernels that the CUDA
// kernels must reproduce: same bits on random inputs with inf / NaN /
// subnormal edge values, and the double references within stated bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/src/device/device_ops.h"
#include "kernels/common/accumulate_element.h"
#include "kernels/common/adam_element.h"
#include "kernels/common/float16_rules.h"
#include "kernels/common/norm_block.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/norm.h"
#include "kernels/reference/adam_reference.h"
#include "kernels/reference/bf16_reference.h"
#include "kernels/reference/fp16_reference.h"
#include "kernels/reference/norm_reference.h"
#include "tests/kernels/adam_reference_params.h"
#include "tests/kernels/isa_report.h"
#include "tests/test_seed.h"
#include "zeroshard/device.h"

namespace zeroshard::kernels {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

enum class Half { kNone, kBf16, kFp16 };

uint32_t Bits(float x) { return Fp32AsBits(x); }
uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Same bits, except that two NaNs match whatever their sign and payload: the
// contract (kernels/cpu/adam.h) leaves the NaN payload to the path.
template <class T>
bool SameValueBits(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return Bits(a) == Bits(b);
}
bool SameHalfBits(uint16_t a, uint16_t b, Half half) {
  const uint16_t exp_mask = half == Half::kBf16 ? 0x7f80 : 0x7c00;
  const uint16_t man_mask = half == Half::kBf16 ? 0x007f : 0x03ff;
  const bool a_nan = (a & exp_mask) == exp_mask && (a & man_mask) != 0;
  const bool b_nan = (b & exp_mask) == exp_mask && (b & man_mask) != 0;
  if (a_nan || b_nan) return a_nan && b_nan;
  return a == b;
}

uint16_t ToHalf(float x, Half half) {
  return half == Half::kBf16 ? Fp32ToBf16Rne(x) : Fp32ToFp16Rne(x);
}
float FromHalf(uint16_t h, Half half) {
  return half == Half::kBf16 ? Bf16ToFp32(h) : Fp16ToFp32(h);
}

// Values over many decades, a tenth of them replaced by edge values when
// `edges`: +-inf, NaN, fp32 subnormals, fp16 subnormals, signed zeros, and
// values near the fp16 overflow threshold.
std::vector<float> RandomValues(std::mt19937_64& rng, size_t n, float scale, bool edges) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-6.0f, 2.0f);
  std::uniform_int_distribution<int> pick(0, 79);
  const float kEdges[] = {INFINITY, -INFINITY, NAN,   1e-42f,   -3e-39f,   3e-6f,
                          -6e-8f,   0.0f,      -0.0f, 65519.0f, -65520.0f, 7e4f};
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = scale * std::pow(10.0f, decade(rng)) * normal(rng);
    const int k = pick(rng);
    if (edges && k < static_cast<int>(std::size(kEdges))) x[i] = kEdges[k];
  }
  return x;
}

// ---------------------------------------------------------------- Adam

struct AdamCase {
  Half out;  // kNone: the fp32 variant
  bool half_grad;
  const char* name;
};
const AdamCase kAdamCases[] = {
    {Half::kNone, false, "fp32"},
    {Half::kBf16, false, "mixed bf16"},
    {Half::kBf16, true, "mixed bf16, bf16 grads"},
    {Half::kFp16, false, "mixed fp16"},
    {Half::kFp16, true, "mixed fp16, fp16 grads"},
};

void RunCpuAdam(Isa isa, const AdamCase& ac, float* p, uint16_t* out, const float* g,
                const uint16_t* gh, float* m, float* v, size_t n, const AdamConstants& c) {
  if (ac.out == Half::kNone) return AdamFp32On(isa, p, g, m, v, n, c);
  if (ac.out == Half::kBf16) {
    return ac.half_grad ? AdamMixedBf16GradBf16On(isa, p, out, gh, m, v, n, c)
                        : AdamMixedBf16On(isa, p, out, g, m, v, n, c);
  }
  return ac.half_grad ? AdamMixedFp16GradFp16On(isa, p, out, gh, m, v, n, c)
                      : AdamMixedFp16On(isa, p, out, g, m, v, n, c);
}

AdamStepParams StepParams(AdamMode mode, int64_t step) {
  AdamStepParams params;
  params.mode = mode;
  params.lr = 3e-3;
  params.weight_decay = 0.1;
  params.grad_scale = 0.5;
  params.step = step;
  return params;
}

// Every CPU path (scalar, AVX2, AVX-512 where the CPU has them) against the
// shared AdamElement applied element by element.
void ExpectAdamElementMatchesCpu(bool edges) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + (edges ? 11 : 10));
  const size_t n = 1037;  // not a multiple of any vector width: tails run
  for (const AdamCase& ac : kAdamCases) {
    for (AdamMode mode : {AdamMode::kAdamW, AdamMode::kAdamL2}) {
      const AdamConstants c = MakeAdamConstants(StepParams(mode, 7));
      const std::vector<float> p0 = RandomValues(rng, n, 0.05f, edges);
      const std::vector<float> g0 = RandomValues(rng, n, 1.0f, edges);
      std::vector<float> m0 = RandomValues(rng, n, 1e-3f, edges);
      std::vector<float> v0 = RandomValues(rng, n, 1e-6f, edges);
      for (float& x : v0) x = std::fabs(x);
      std::vector<uint16_t> gh(n);
      const Half grad_half = ac.half_grad ? ac.out : Half::kNone;
      for (size_t i = 0; i < n; ++i) {
        if (ac.half_grad) gh[i] = ToHalf(g0[i], grad_half);
      }
      // The shared rule.
      std::vector<float> wp = p0, wm = m0, wv = v0;
      std::vector<uint16_t> wout(n);
      for (size_t i = 0; i < n; ++i) {
        const float g = ac.half_grad ? FromHalf(gh[i], grad_half) : g0[i];
        AdamElement(c, g, wp[i], wm[i], wv[i]);
        if (ac.out != Half::kNone) wout[i] = ToHalf(wp[i], ac.out);
      }
      for (Isa isa : SupportedIsas()) {
        std::vector<float> p = p0, m = m0, v = v0;
        std::vector<uint16_t> out(n);
        RunCpuAdam(isa, ac, p.data(), out.data(), g0.data(), gh.data(), m.data(), v.data(), n, c);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(SameValueBits(p[i], wp[i]) && SameValueBits(m[i], wm[i]) &&
                      SameValueBits(v[i], wv[i]))
              << ac.name << (mode == AdamMode::kAdamW ? " AdamW " : " L2 ") << IsaName(isa)
              << " element " << i << ": kernel p/m/v " << p[i] << "/" << m[i] << "/" << v[i]
              << ", AdamElement " << wp[i] << "/" << wm[i] << "/" << wv[i];
          if (ac.out != Half::kNone) {
            ASSERT_TRUE(SameHalfBits(out[i], wout[i], ac.out))
                << ac.name << " " << IsaName(isa) << " param_out element " << i;
          }
        }
      }
    }
  }
}

TEST(AdamElementTest, SameBitsAsEveryCpuPath) { ExpectAdamElementMatchesCpu(false); }
TEST(AdamElementTest, SameBitsAsEveryCpuPathOnInfNanSubnormal) {
  ExpectAdamElementMatchesCpu(true);
}

// The shared rule against the double reference, with the bound of
// adam_test.cc: at most 16 fp32 roundings (relative 2^-24 each) on the
// magnitudes of the terms, followed through m and v into p.
TEST(AdamElementTest, WithinBoundsOfDoubleReference) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-4.0f, 0.0f);
  const size_t n = 4099;
  for (AdamMode mode : {AdamMode::kAdamW, AdamMode::kAdamL2}) {
    const AdamStepParams params = StepParams(mode, 3);
    const AdamConstants c = MakeAdamConstants(params);
    std::vector<float> p(n), g(n), m(n), v(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = 0.05f * normal(rng);
      g[i] = std::pow(10.0f, decade(rng)) * normal(rng);
      m[i] = 1e-3f * normal(rng);
      v[i] = 1e-6f * std::fabs(normal(rng)) + 1e-12f;
    }
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
      float pi = p[i], mi = m[i], vi = v[i];
      AdamElement(c, g[i], pi, mi, vi);
      double ge = std::fabs(g[i] * params.grad_scale);
      if (!adamw) ge += std::fabs(params.weight_decay * p[i]);
      const double m_err = k16u * (params.beta1 * std::fabs(m[i]) + (1 - params.beta1) * ge);
      const double v_err = k16u * (params.beta2 * v[i] + (1 - params.beta2) * ge * ge);
      const double denom = std::sqrt(rv[i]) / std::sqrt(bc2) + params.eps;
      const double update = step_size * std::fabs(rm[i]) / denom;
      const double denom_err = v_err / (2.0 * std::sqrt(rv[i]) * std::sqrt(bc2));
      const double p_err = k16u * (std::fabs(p[i] * decay) + update) + step_size * m_err / denom +
                           update * denom_err / denom;
      ASSERT_LE(std::fabs(pi - rp[i]), p_err) << "element " << i;
      ASSERT_LE(std::fabs(mi - rm[i]), m_err) << "element " << i;
      ASSERT_LE(std::fabs(vi - rv[i]), v_err) << "element " << i;
    }
  }
}

// ---------------------------------------------------------------- norm

const size_t kNormSizes[] = {1, 7, 8, 127, 128, 129, 1000, 4099};

std::vector<double> SharedBlockSums(const void* x, size_t n, Half half) {
  std::vector<double> out((n + kNormBlock - 1) / kNormBlock);
  for (size_t b = 0; b < out.size(); ++b) {
    const size_t start = b * kNormBlock;
    const size_t len = std::min(kNormBlock, n - start);
    if (half == Half::kNone) {
      out[b] = NormBlockSumSquares(Fp32Loader{static_cast<const float*>(x) + start}, len);
    } else if (half == Half::kBf16) {
      out[b] = NormBlockSumSquares(Bf16Loader{static_cast<const uint16_t*>(x) + start}, len);
    } else {
      out[b] = NormBlockSumSquares(Fp16Loader{static_cast<const uint16_t*>(x) + start}, len);
    }
  }
  return out;
}

void CpuBlockSums(Isa isa, const void* x, size_t n, Half half, double* out) {
  if (half == Half::kNone) return BlockSumSquaresFp32On(isa, static_cast<const float*>(x), n, out);
  if (half == Half::kBf16) {
    return BlockSumSquaresBf16On(isa, static_cast<const uint16_t*>(x), n, out);
  }
  BlockSumSquaresFp16On(isa, static_cast<const uint16_t*>(x), n, out);
}

TEST(NormBlockTest, SameBitsAsEveryCpuPath) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 20);
  for (bool edges : {false, true}) {
    for (Half half : {Half::kNone, Half::kBf16, Half::kFp16}) {
      for (size_t n : kNormSizes) {
        // Values spread so that the order of additions changes the result.
        std::vector<float> xf = RandomValues(rng, n, 1.0f, edges);
        std::vector<uint16_t> xh(n);
        for (size_t i = 0; i < n; ++i) xh[i] = ToHalf(xf[i], half);
        const void* x = half == Half::kNone ? static_cast<const void*>(xf.data()) : xh.data();
        const std::vector<double> want = SharedBlockSums(x, n, half);
        for (Isa isa : SupportedIsas()) {
          std::vector<double> got(want.size(), -1.0);
          CpuBlockSums(isa, x, n, half, got.data());
          for (size_t b = 0; b < got.size(); ++b) {
            ASSERT_TRUE(SameValueBits(got[b], want[b]))
                << IsaName(isa) << " dtype " << static_cast<int>(half) << " n=" << n << " block "
                << b << ": kernel " << got[b] << ", NormBlockSumSquares " << want[b];
          }
        }
      }
    }
  }
}

// Relative error below 18 * 2^-53 (norm_test.cc: at most 15 additions in a
// lane and 3 combining lanes, of non-negative terms); the reference sums in
// long double.
TEST(NormBlockTest, WithinBoundsOfReference) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 21);
  const double tol = 18.0 * std::numeric_limits<double>::epsilon() / 2;
  for (Half half : {Half::kNone, Half::kBf16, Half::kFp16}) {
    for (size_t n : kNormSizes) {
      std::vector<float> xf = RandomValues(rng, n, 1.0f, false);
      std::vector<uint16_t> xh(n);
      std::vector<double> xd(n);
      for (size_t i = 0; i < n; ++i) {
        // A value that rounds to zero in the 16-bit type is drawn again: a
        // block of zeros has no relative error to bound (a one-element
        // block of 1e-6 is zero in fp16).
        while (true) {
          xh[i] = ToHalf(xf[i], half);
          xd[i] = half == Half::kNone   ? xf[i]
                  : half == Half::kBf16 ? reference::Bf16ValueReference(xh[i])
                                        : reference::Fp16ValueReference(xh[i]);
          if (xd[i] != 0.0) break;
          xf[i] = RandomValues(rng, 1, 1.0f, false)[0];
        }
      }
      const void* x = half == Half::kNone ? static_cast<const void*>(xf.data()) : xh.data();
      const std::vector<double> got = SharedBlockSums(x, n, half);
      std::vector<double> want(got.size());
      reference::BlockSumSquaresReference(xd.data(), n, kNormBlock, want.data());
      for (size_t b = 0; b < got.size(); ++b) {
        ASSERT_GT(want[b], 0.0) << "inputs must not be all zeros";
        ASSERT_LE(std::fabs(got[b] - want[b]), tol * want[b])
            << "dtype " << static_cast<int>(half) << " n=" << n << " block " << b;
      }
    }
  }
}

// ---------------------------------------------------------------- accumulate

// The CPU DeviceOps' Accumulate (engine/src/device/cpu_device_ops.cc, SIMD
// casts) against the shared rule, through the engine's own entry point.
TEST(AccumulateElementTest, SameBitsAsCpuDeviceOps) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 30);
  std::unique_ptr<Device> device = CreateCpuDevice();
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto ops = internal::CreateCpuDeviceOps(**stream);
  ASSERT_TRUE(ops.ok()) << ops.status();
  const size_t n = 3001;  // several of the CPU's 1024-element blocks and a tail
  for (Half half : {Half::kNone, Half::kBf16, Half::kFp16}) {
    const std::vector<float> a = RandomValues(rng, n, 1.0f, true);
    std::vector<float> b = RandomValues(rng, n, 1.0f, true);
    // Near-cancelling pairs too: their sums are where rounding twice would show.
    for (size_t i = 0; i < n; i += 7) b[i] = -a[i] * 1.0009765625f;
    if (half == Half::kNone) {
      std::vector<float> acc = a;
      ASSERT_TRUE((*ops)->Accumulate(acc.data(), b.data(), n, DType::kFloat32).ok());
      ASSERT_TRUE((*stream)->Synchronize().ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameValueBits(acc[i], AccumulateFp32(a[i], b[i])))
            << "fp32 element " << i << ": " << a[i] << " + " << b[i];
      }
      continue;
    }
    std::vector<uint16_t> ah(n), bh(n);
    for (size_t i = 0; i < n; ++i) {
      ah[i] = ToHalf(a[i], half);
      bh[i] = ToHalf(b[i], half);
    }
    std::vector<uint16_t> acc = ah;
    const DType dtype = half == Half::kBf16 ? DType::kBFloat16 : DType::kFloat16;
    ASSERT_TRUE((*ops)->Accumulate(acc.data(), bh.data(), n, dtype).ok());
    ASSERT_TRUE((*stream)->Synchronize().ok());
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want =
          half == Half::kBf16 ? AccumulateBf16(ah[i], bh[i]) : AccumulateFp16(ah[i], bh[i]);
      ASSERT_TRUE(SameHalfBits(acc[i], want, half))
          << (half == Half::kBf16 ? "bf16" : "fp16") << " element " << i << ": 0x" << std::hex
          << ah[i] << " + 0x" << bh[i] << " gave 0x" << acc[i] << ", shared rule 0x" << want;
    }
  }
}

// The value: the exact sum (in double) rounded to the 16-bit type, allowing
// for the fp32 rounding in between: within one 16-bit ulp (relative 2^-7
// bf16, 2^-10 fp16, or the subnormal spacing), and exactly the reference
// rounding whenever the fp32 sum was exact.
TEST(AccumulateElementTest, WithinOneUlpOfExactSum) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 31);
  const size_t n = 20000;
  for (Half half : {Half::kBf16, Half::kFp16}) {
    const std::vector<float> a = RandomValues(rng, n, 1.0f, false);
    const std::vector<float> b = RandomValues(rng, n, 1.0f, false);
    int exact_checked = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t ah = ToHalf(a[i], half), bh = ToHalf(b[i], half);
      const double va = half == Half::kBf16 ? reference::Bf16ValueReference(ah)
                                            : reference::Fp16ValueReference(ah);
      const double vb = half == Half::kBf16 ? reference::Bf16ValueReference(bh)
                                            : reference::Fp16ValueReference(bh);
      const double exact = va + vb;  // exact: both are 16-bit values within 2^40 of each other
      const uint16_t got = half == Half::kBf16 ? AccumulateBf16(ah, bh) : AccumulateFp16(ah, bh);
      const double gv = half == Half::kBf16 ? reference::Bf16ValueReference(got)
                                            : reference::Fp16ValueReference(got);
      if (std::isinf(gv)) {
        ASSERT_TRUE(half == Half::kFp16 && std::fabs(exact) >= 65504.0) << "element " << i;
        continue;
      }
      const double rel = half == Half::kBf16 ? 0x1p-7 : 0x1p-10;
      const double spacing = half == Half::kBf16 ? 0x1p-133 : 0x1p-24;
      ASSERT_LE(std::fabs(gv - exact), rel * std::fabs(exact) + spacing)
          << "element " << i << ": " << va << " + " << vb << " gave " << gv;
      if (static_cast<double>(static_cast<float>(exact)) == exact) {
        const uint16_t want = half == Half::kBf16
                                  ? reference::RoundToBf16Reference(static_cast<float>(exact))
                                  : reference::RoundToFp16Reference(static_cast<float>(exact));
        ASSERT_EQ(got, want) << "element " << i << ": " << va << " + " << vb;
        ++exact_checked;
      }
    }
    EXPECT_GT(exact_checked, static_cast<int>(n / 10)) << "too few exactly rounded cases checked";
  }
}

// The bitwise tests compare against every path the CPU has; one it lacks is
// reported, never silently counted as passed.
TEST(ElementOpsTest, ReportsIsaPathsNotRun) {
  testing::ReportIsaPaths();
  RecordProperty("random_seed", std::to_string(Seed()));
}

}  // namespace
}  // namespace zeroshard::kernels
