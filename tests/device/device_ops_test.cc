// The CPU DeviceOps (the engine's per-step arithmetic, enqueued on a CPU
// stream) against double-precision references: the right kernel for each
// dtype and Adam variant, the results there after Synchronize, bad operands
// refused.
#include "engine/src/device/device_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/quant_int8.h"
#include "kernels/cpu/norm.h"
#include "kernels/reference/adam_reference.h"
#include "kernels/reference/bf16_reference.h"
#include "kernels/reference/fp16_reference.h"
#include "kernels/reference/norm_reference.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;
namespace ref = ::zeroshard::kernels::reference;

struct Fixture {
  std::unique_ptr<Device> device = CreateCpuDevice();
  std::unique_ptr<Stream> stream;
  std::unique_ptr<DeviceOps> ops;
  Fixture() {
    auto s = device->CreateStream();
    EXPECT_TRUE(s.ok());
    stream = std::move(*s);
    auto o = CreateDeviceOps(*device, *stream);
    EXPECT_TRUE(o.ok()) << o.status();
    ops = std::move(*o);
  }
};

// 16-bit bits and their value, by the references.
uint16_t Round16(DType dtype, float x) {
  return dtype == DType::kBFloat16 ? ref::RoundToBf16Reference(x) : ref::RoundToFp16Reference(x);
}
double Value16(DType dtype, uint16_t h) {
  return dtype == DType::kBFloat16 ? ref::Bf16ValueReference(h) : ref::Fp16ValueReference(h);
}

TEST(CpuDeviceOpsTest, AccumulateAddsInFp32AndRoundsOncePerDtype) {
  Fixture f;
  std::mt19937_64 rng(Seed());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t n = 3000 + static_cast<int64_t>(rng() % 2000);  // odd lengths too
  // fp32: the correctly rounded sum (a double sum of two floats rounds to it).
  std::vector<float> acc(n), add(n), expected(n);
  for (int64_t i = 0; i < n; ++i) {
    acc[i] = normal(rng);
    add[i] = normal(rng);
    expected[i] = static_cast<float>(static_cast<double>(acc[i]) + add[i]);
  }
  ASSERT_TRUE(f.ops->Accumulate(acc.data(), add.data(), n, DType::kFloat32).ok());
  ASSERT_TRUE(f.stream->Synchronize().ok());
  ASSERT_EQ(std::memcmp(acc.data(), expected.data(), n * sizeof(float)), 0) << SeedTrace();
  // 16-bit: widen, add in fp32, round to nearest even once.
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> a(n), b(n), want(n);
    for (int64_t i = 0; i < n; ++i) {
      a[i] = Round16(dtype, normal(rng));
      b[i] = Round16(dtype, normal(rng));
      want[i] = Round16(dtype, static_cast<float>(Value16(dtype, a[i]) + Value16(dtype, b[i])));
    }
    ASSERT_TRUE(f.ops->Accumulate(a.data(), b.data(), n, dtype).ok());
    ASSERT_TRUE(f.stream->Synchronize().ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(a[i], want[i]) << DTypeName(dtype) << " element " << i << "; " << SeedTrace();
    }
  }
}

TEST(CpuDeviceOpsTest, BlockSumSquaresMatchesTheDoubleReferencePerDtype) {
  Fixture f;
  std::mt19937_64 rng(Seed());
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t n = 1000 + static_cast<int64_t>(rng() % 1000);
  const int64_t blocks = (n + kernels::kNormBlock - 1) / kernels::kNormBlock;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> x32(n);
    std::vector<uint16_t> x16(n);
    std::vector<double> values(n);
    for (int64_t i = 0; i < n; ++i) {
      x32[i] = normal(rng);
      if (dtype == DType::kFloat32) {
        values[i] = x32[i];
      } else {
        x16[i] = Round16(dtype, x32[i]);
        values[i] = Value16(dtype, x16[i]);
      }
    }
    std::vector<double> got(blocks, -1.0), want(blocks);
    const void* x = dtype == DType::kFloat32 ? static_cast<const void*>(x32.data()) : x16.data();
    ASSERT_TRUE(f.ops->BlockSumSquares(x, n, dtype, got.data()).ok());
    ASSERT_TRUE(f.stream->Synchronize().ok());
    ref::BlockSumSquaresReference(values.data(), n, kernels::kNormBlock, want.data());
    for (int64_t b = 0; b < blocks; ++b) {
      EXPECT_NEAR(got[b], want[b], 1e-13 * want[b])
          << DTypeName(dtype) << " block " << b << "; " << SeedTrace();
    }
  }
}

struct VariantCase {
  AdamVariant variant;
  DType param;  // param_out dtype (fp32: none)
  DType grad;
  const char* name;
};

TEST(CpuDeviceOpsTest, AdamRunsTheVariantItIsGiven) {
  Fixture f;
  std::mt19937_64 rng(Seed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const VariantCase cases[] = {
      {AdamVariant::kFp32, DType::kFloat32, DType::kFloat32, "fp32"},
      {AdamVariant::kMixedBf16, DType::kBFloat16, DType::kFloat32, "bf16 / fp32 grads"},
      {AdamVariant::kMixedBf16GradBf16, DType::kBFloat16, DType::kBFloat16, "bf16 / bf16 grads"},
      {AdamVariant::kMixedFp16, DType::kFloat16, DType::kFloat32, "fp16 / fp32 grads"},
      {AdamVariant::kMixedFp16GradFp16, DType::kFloat16, DType::kFloat16, "fp16 / fp16 grads"},
  };
  kernels::AdamStepParams p;
  p.lr = 1e-2;
  p.weight_decay = 0.1;
  p.grad_scale = 0.5;
  p.step = 3;
  const kernels::AdamConstants c = kernels::MakeAdamConstants(p);
  ref::AdamReferenceParams r;
  r.lr = p.lr;
  r.beta1 = p.beta1;
  r.beta2 = p.beta2;
  r.eps = p.eps;
  r.weight_decay = p.weight_decay;
  r.grad_scale = p.grad_scale;
  r.step = p.step;
  for (const VariantCase& vc : cases) {
    const int64_t n = 2000 + static_cast<int64_t>(rng() % 1000);
    std::vector<float> master(n), grad32(n), m(n), v(n);
    std::vector<uint16_t> grad16(n), param_out(n, 0);
    std::vector<double> dp(n), dg(n), dm(n), dv(n);
    for (int64_t i = 0; i < n; ++i) {
      master[i] = normal(rng);
      grad32[i] = normal(rng);
      m[i] = 0.1f * normal(rng);
      v[i] = std::fabs(0.01f * normal(rng));
      dp[i] = master[i];
      dm[i] = m[i];
      dv[i] = v[i];
      if (vc.grad == DType::kFloat32) {
        dg[i] = grad32[i];
      } else {
        grad16[i] = Round16(vc.grad, grad32[i]);
        dg[i] = Value16(vc.grad, grad16[i]);
      }
    }
    AdamArgs args;
    args.variant = vc.variant;
    args.master = master.data();
    args.param_out = vc.variant == AdamVariant::kFp32 ? nullptr : param_out.data();
    args.grad =
        vc.grad == DType::kFloat32 ? static_cast<const void*>(grad32.data()) : grad16.data();
    args.m = m.data();
    args.v = v.data();
    args.n = n;
    const std::vector<float> m0 = m, v0 = v;
    ASSERT_TRUE(f.ops->Adam(args, c).ok()) << vc.name;
    ASSERT_TRUE(f.stream->Synchronize().ok());
    ref::AdamStepReference(r, dp.data(), dg.data(), dm.data(), dv.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(master[i], dp[i], 1e-5 * (1.0 + std::fabs(dp[i])))
          << vc.name << " element " << i << "; " << SeedTrace();
      // The moments are sums of two terms that may cancel: bound the error
      // by the terms' size (a few fp32 roundings of each).
      const double g = dg[i] * p.grad_scale;
      ASSERT_NEAR(m[i], dm[i], 1e-6 * (std::fabs(m0[i]) + std::fabs(g)) + 1e-30)
          << vc.name << " " << i;
      ASSERT_NEAR(v[i], dv[i], 1e-6 * (std::fabs(v0[i]) + g * g) + 1e-30) << vc.name << " " << i;
      if (vc.variant != AdamVariant::kFp32) {
        // The 16-bit copy is the master rounded to the variant's dtype.
        ASSERT_EQ(param_out[i], Round16(vc.param, master[i]))
            << vc.name << " element " << i << "; " << SeedTrace();
      }
    }
  }
}

// qwZ's blockwise int8 quantization against a double reference: each
// block's scale is its largest magnitude / 127 (one fp32 division), each
// value within half a scale of its input before the dtype's rounding, the
// packed form's padding zero, a block of zeros all zeros, and every
// dequantized value the dtype's rounding of q * scale.
TEST(CpuDeviceOpsTest, QuantizeInt8KeepsEachValueWithinHalfItsBlocksScale) {
  Fixture f;
  std::mt19937_64 rng(Seed());
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = 1 + static_cast<int64_t>(rng() % 3000);
    const size_t esize = DTypeSize(dtype);
    // Values of several magnitudes per block; one block of zeros.
    std::vector<double> values(n);
    std::normal_distribution<double> normal;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t block = i / kernels::kQuantBlock;
      values[i] = block == 1 ? 0.0 : normal(rng) * std::ldexp(1.0, static_cast<int>(rng() % 9) - 4);
    }
    std::vector<char> x(n * esize);
    std::vector<double> input(n);  // what x holds, in the dtype
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(values[i]);
      if (dtype == DType::kFloat32) {
        std::memcpy(x.data() + i * 4, &v, 4);
        input[i] = v;
      } else {
        const uint16_t h = Round16(dtype, v);
        std::memcpy(x.data() + i * 2, &h, 2);
        input[i] = Value16(dtype, h);
      }
    }
    const int64_t packed_bytes = kernels::QuantPackedBytes(n);
    std::vector<char> packed(packed_bytes, 0x55);
    std::vector<char> out(n * esize);
    ASSERT_TRUE(f.ops->QuantizeInt8(x.data(), n, dtype, packed.data()).ok());
    ASSERT_TRUE(f.ops->DequantizeInt8(packed.data(), n, dtype, out.data()).ok());
    ASSERT_TRUE(f.stream->Synchronize().ok());
    const int8_t* q = reinterpret_cast<const int8_t*>(packed.data());
    const float* scales =
        reinterpret_cast<const float*>(packed.data() + kernels::QuantScalesOffset(n));
    for (int64_t b = 0; b < kernels::QuantBlocks(n); ++b) {
      double absmax = 0;
      for (int64_t i = b * 256; i < std::min<int64_t>(n, (b + 1) * 256); ++i) {
        absmax = std::max(absmax, std::fabs(input[i]));
      }
      ASSERT_EQ(scales[b], static_cast<float>(absmax / 127.0))
          << "block " << b << ", " << SeedTrace();
    }
    for (int64_t i = n; i < kernels::QuantScalesOffset(n); ++i) ASSERT_EQ(packed[i], 0) << i;
    for (int64_t i = kernels::QuantScalesOffset(n) + kernels::QuantBlocks(n) * 4; i < packed_bytes;
         ++i) {
      ASSERT_EQ(packed[i], 0) << i;
    }
    for (int64_t i = 0; i < n; ++i) {
      const double scale = scales[i / 256];
      ASSERT_LE(std::abs(q[i]), 127);
      // Within half a scale, up to the fp32 division x / scale's rounding
      // (its quotient is at most 127: 127 * 2^-24 of a scale) and the
      // scale's own (the same again): 2^-16 of a scale covers both.
      ASSERT_LE(std::fabs(q[i] * scale - input[i]), (0.5 + std::ldexp(1.0, -16)) * scale)
          << "element " << i << ", " << SeedTrace();
      const float deq = static_cast<float>(q[i]) * scales[i / 256];
      double got;
      if (dtype == DType::kFloat32) {
        float v;
        std::memcpy(&v, out.data() + i * 4, 4);
        ASSERT_EQ(v, deq) << i;
        got = v;
      } else {
        uint16_t h;
        std::memcpy(&h, out.data() + i * 2, 2);
        ASSERT_EQ(h, Round16(dtype, deq)) << i;
        got = Value16(dtype, h);
      }
      if (i / 256 == 1) {
        ASSERT_EQ(got, 0.0) << "a block of zeros";
      }
    }
  }
  EXPECT_FALSE(f.ops->QuantizeInt8(nullptr, 4, DType::kFloat32, nullptr).ok());
  EXPECT_FALSE(f.ops->DequantizeInt8(nullptr, 4, DType::kInt64, nullptr).ok());
}

TEST(CpuDeviceOpsTest, BadOperandsAreRefusedBeforeAnythingIsEnqueued) {
  Fixture f;
  std::vector<float> a(8), b(8);
  const absl::Status dtype = f.ops->Accumulate(a.data(), b.data(), 8, DType::kInt64);
  EXPECT_EQ(dtype.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dtype.message().find("not a gradient type"), std::string::npos) << dtype;
  EXPECT_EQ(f.ops->Accumulate(a.data(), nullptr, 8, DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.ops->BlockSumSquares(a.data(), -1, DType::kFloat32, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  AdamArgs args;
  args.variant = AdamVariant::kMixedBf16;  // needs param_out
  args.master = a.data();
  args.grad = b.data();
  args.m = a.data();
  args.v = b.data();
  args.n = 8;
  const kernels::AdamConstants c = kernels::MakeAdamConstants(kernels::AdamStepParams{});
  const absl::Status adam = f.ops->Adam(args, c);
  EXPECT_EQ(adam.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(adam.message().find("param_out"), std::string::npos) << adam;
  EXPECT_TRUE(f.stream->Synchronize().ok());
}

}  // namespace
}  // namespace zeroshard::internal
