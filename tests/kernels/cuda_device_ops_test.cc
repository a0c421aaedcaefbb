// Every DeviceOps op and dtype on a CUDA device against the CPU DeviceOps,
// bit for bit, on random inputs (with inf / NaN / subnormal values): odd
// lengths, lengths off the 128-element norm block and the 8-element vector
// groups, operands offset so that they are not 16-byte aligned (the kernels'
// scalar fallback), and n large enough for several grid-stride passes.
// Labelled `gpu`; without a device it skips visibly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/src/device/device_ops.h"
#include "kernels/common/float16_rules.h"
#include "kernels/common/quant_int8.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/launch_config.h"
#include "tests/cuda_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/device.h"

namespace zeroshard::internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// One thread per item per pass: these sizes take several passes of the
// largest grid (kMaxGridBlocks x kLaunchThreads threads).
constexpr size_t kGridThreads = kernels::cuda::kMaxGridBlocks * kernels::cuda::kLaunchThreads;
// Groups of 4 (fp32 Adam, fp32 accumulate) and 8 (16-bit accumulate).
constexpr size_t kManyPassElements = 8 * kGridThreads * 3 + 13;
// One thread per 128-element norm block.
constexpr size_t kManyPassNormElements = kernels::kNormBlock * kGridThreads * 2 + 77;

const size_t kSizes[] = {1, 7, 8, 127, 129, 1000, 4099, 65537};
const size_t kOffsets[] = {0, 1, 3};  // elements; 1 and 3 break 16-byte alignment

size_t ElementSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Random fp32 values over many decades with a sprinkle of edge values; for
// 16-bit dtypes the same values rounded.
std::vector<uint8_t> RandomElements(std::mt19937_64& rng, size_t n, DType dtype, float scale,
                                    bool edges) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-6.0f, 2.0f);
  std::uniform_int_distribution<int> pick(0, 199);
  const float kEdges[] = {INFINITY, -INFINITY, NAN, 1e-42f, -6e-8f, 0.0f, -0.0f, 7e4f};
  const size_t width = ElementSize(dtype);
  std::vector<uint8_t> bytes(n * width);
  // Drawing costs ~36 ns an element; the many-pass sizes (hundreds of
  // millions of elements in all) take a random 64 Ki-element pattern and fill
  // the rest from it in a scrambled order, so the GPU check stays fast.
  constexpr size_t kPattern = size_t{1} << 16;
  const size_t drawn = std::min(n, kPattern);
  for (size_t i = 0; i < drawn; ++i) {
    float x = scale * std::pow(10.0f, decade(rng)) * normal(rng);
    const int k = pick(rng);
    if (edges && k < static_cast<int>(std::size(kEdges))) x = kEdges[k];
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h =
          dtype == DType::kBFloat16 ? kernels::Fp32ToBf16Rne(x) : kernels::Fp32ToFp16Rne(x);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  for (size_t i = drawn; i < n; ++i) {
    const size_t from = (i * 40503u + i / kPattern) % kPattern;
    std::memcpy(bytes.data() + i * width, bytes.data() + from * width, width);
  }
  return bytes;
}

// Same bits, except that two NaNs of the same width match whatever their
// payload (the kernels' contract leaves NaN payloads to the path).
bool IsNan(const uint8_t* p, size_t width) {
  if (width == 8) {
    double x;
    std::memcpy(&x, p, 8);
    return std::isnan(x);
  }
  if (width == 4) {
    float x;
    std::memcpy(&x, p, 4);
    return std::isnan(x);
  }
  return false;  // 16-bit: handled by the caller's dtype
}
bool IsHalfNan(uint16_t h, DType dtype) {
  return dtype == DType::kBFloat16 ? (h & 0x7f80) == 0x7f80 && (h & 0x7f)
                                   : (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}
::testing::AssertionResult SameBits(const std::vector<uint8_t>& got,
                                    const std::vector<uint8_t>& want, size_t width, DType dtype) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); i += width) {
    if (std::memcmp(got.data() + i, want.data() + i, width) == 0) continue;
    if (width == 2) {
      uint16_t a, b;
      std::memcpy(&a, got.data() + i, 2);
      std::memcpy(&b, want.data() + i, 2);
      if (IsHalfNan(a, dtype) && IsHalfNan(b, dtype)) continue;
    } else if (IsNan(got.data() + i, width) && IsNan(want.data() + i, width)) {
      continue;
    }
    return ::testing::AssertionFailure() << "element " << i / width << " differs";
  }
  return ::testing::AssertionSuccess();
}

class CudaDeviceOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZS_SKIP_WITHOUT_CUDA_DEVICE("CUDA DeviceOps");
    auto device = CreateCudaDevice(0);
    ASSERT_TRUE(device.ok()) << device.status();
    cuda_ = std::move(*device);
    auto stream = cuda_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    cuda_stream_ = std::move(*stream);
    auto ops = CreateDeviceOps(*cuda_, *cuda_stream_);
    ASSERT_TRUE(ops.ok()) << ops.status();
    cuda_ops_ = std::move(*ops);
    cpu_ = CreateCpuDevice();
    auto cpu_stream = cpu_->CreateStream();
    ASSERT_TRUE(cpu_stream.ok());
    cpu_stream_ = std::move(*cpu_stream);
    auto cpu_ops = CreateDeviceOps(*cpu_, *cpu_stream_);
    ASSERT_TRUE(cpu_ops.ok());
    cpu_ops_ = std::move(*cpu_ops);
  }

  // A device copy of `host` starting `offset_bytes` into a fresh buffer.
  struct DeviceCopy {
    DeviceBuffer buffer;
    uint8_t* data = nullptr;
  };
  DeviceCopy Upload(const std::vector<uint8_t>& host, size_t offset_bytes) {
    DeviceCopy copy;
    auto buffer = cuda_->Allocate(static_cast<int64_t>(host.size() + offset_bytes + 16),
                                  MemoryCategory::kWorkspace, "operand");
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return copy;
    copy.buffer = std::move(*buffer);
    copy.data = copy.buffer.as<uint8_t>() + offset_bytes;
    EXPECT_TRUE(
        cuda_->CopyAsync(copy.data, host.data(), static_cast<int64_t>(host.size()), *cuda_stream_)
            .ok());
    // The host vector must outlive the copy (Device::CopyAsync's contract);
    // the callers go on to change it with the CPU ops.
    EXPECT_TRUE(cuda_stream_->Synchronize().ok());
    return copy;
  }
  std::vector<uint8_t> Download(const uint8_t* data, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    EXPECT_TRUE(
        cuda_->CopyAsync(host.data(), data, static_cast<int64_t>(bytes), *cuda_stream_).ok());
    EXPECT_TRUE(cuda_stream_->Synchronize().ok());
    return host;
  }

  void CheckAccumulate(std::mt19937_64& rng, size_t n, DType dtype, size_t offset) {
    SCOPED_TRACE("Accumulate " + std::string(DTypeName(dtype)) + " n=" + std::to_string(n) +
                 " offset=" + std::to_string(offset));
    const size_t width = ElementSize(dtype);
    std::vector<uint8_t> acc = RandomElements(rng, n, dtype, 1.0f, true);
    const std::vector<uint8_t> add = RandomElements(rng, n, dtype, 1.0f, true);
    DeviceCopy dacc = Upload(acc, offset * width);
    // The addend at a different misalignment than the accumulator.
    DeviceCopy dadd = Upload(add, (offset == 0 ? 0 : offset + 1) * width);
    ASSERT_NE(dacc.data, nullptr);
    ASSERT_NE(dadd.data, nullptr);
    ASSERT_TRUE(cuda_ops_->Accumulate(dacc.data, dadd.data, n, dtype).ok());
    ASSERT_TRUE(cpu_ops_->Accumulate(acc.data(), add.data(), n, dtype).ok());
    ASSERT_TRUE(cpu_stream_->Synchronize().ok());
    EXPECT_TRUE(SameBits(Download(dacc.data, acc.size()), acc, width, dtype));
  }

  void CheckBlockSumSquares(std::mt19937_64& rng, size_t n, DType dtype, size_t offset,
                            bool edges) {
    SCOPED_TRACE("BlockSumSquares " + std::string(DTypeName(dtype)) + " n=" + std::to_string(n) +
                 " offset=" + std::to_string(offset));
    const size_t blocks = (n + kernels::kNormBlock - 1) / kernels::kNormBlock;
    const std::vector<uint8_t> x = RandomElements(rng, n, dtype, 1.0f, edges);
    DeviceCopy dx = Upload(x, offset * ElementSize(dtype));
    auto dblocks =
        cuda_->Allocate(static_cast<int64_t>(blocks * 8), MemoryCategory::kWorkspace, "blocks");
    ASSERT_NE(dx.data, nullptr);
    ASSERT_TRUE(dblocks.ok());
    ASSERT_TRUE(cuda_ops_->BlockSumSquares(dx.data, n, dtype, dblocks->as<double>()).ok());
    std::vector<uint8_t> want(blocks * 8);
    ASSERT_TRUE(
        cpu_ops_->BlockSumSquares(x.data(), n, dtype, reinterpret_cast<double*>(want.data())).ok());
    ASSERT_TRUE(cpu_stream_->Synchronize().ok());
    EXPECT_TRUE(SameBits(Download(dblocks->as<uint8_t>(), blocks * 8), want, 8, dtype));
  }

  void CheckAdam(std::mt19937_64& rng, size_t n, AdamVariant variant, kernels::AdamMode mode,
                 size_t offset, size_t grad_offset) {
    SCOPED_TRACE("Adam variant " + std::to_string(static_cast<int>(variant)) + " mode " +
                 std::to_string(static_cast<int>(mode)) + " n=" + std::to_string(n) + " offset=" +
                 std::to_string(offset) + " grad offset=" + std::to_string(grad_offset));
    const bool mixed = variant != AdamVariant::kFp32;
    const DType out_type =
        variant == AdamVariant::kMixedFp16 || variant == AdamVariant::kMixedFp16GradFp16
            ? DType::kFloat16
            : DType::kBFloat16;
    const DType grad_type = variant == AdamVariant::kMixedBf16GradBf16   ? DType::kBFloat16
                            : variant == AdamVariant::kMixedFp16GradFp16 ? DType::kFloat16
                                                                         : DType::kFloat32;
    std::vector<uint8_t> master = RandomElements(rng, n, DType::kFloat32, 0.05f, true);
    const std::vector<uint8_t> grad = RandomElements(rng, n, grad_type, 1.0f, true);
    std::vector<uint8_t> m = RandomElements(rng, n, DType::kFloat32, 1e-3f, true);
    std::vector<uint8_t> v = RandomElements(rng, n, DType::kFloat32, 1e-6f, true);
    for (size_t i = 0; i < n; ++i) v[4 * i + 3] &= 0x7f;  // v >= 0
    std::vector<uint8_t> out(mixed ? 2 * n : 0, 0);

    DeviceCopy dmaster = Upload(master, 4 * offset);
    DeviceCopy dgrad = Upload(grad, ElementSize(grad_type) * grad_offset);
    DeviceCopy dm = Upload(m, 4 * offset);
    DeviceCopy dv = Upload(v, 4 * offset);
    const std::vector<uint8_t> zeros(2 * n + 2, 0);
    DeviceCopy dout = Upload(zeros, 2 * offset);
    ASSERT_TRUE(dmaster.data && dgrad.data && dm.data && dv.data && dout.data);

    kernels::AdamStepParams params;
    params.mode = mode;
    params.lr = 2e-3;
    params.weight_decay = 0.05;
    params.grad_scale = 0.25;
    params.step = 5;
    const kernels::AdamConstants c = kernels::MakeAdamConstants(params);
    AdamArgs gpu{variant,
                 reinterpret_cast<float*>(dmaster.data),
                 mixed ? reinterpret_cast<uint16_t*>(dout.data) : nullptr,
                 dgrad.data,
                 reinterpret_cast<float*>(dm.data),
                 reinterpret_cast<float*>(dv.data),
                 static_cast<int64_t>(n)};
    AdamArgs cpu{variant,
                 reinterpret_cast<float*>(master.data()),
                 mixed ? reinterpret_cast<uint16_t*>(out.data()) : nullptr,
                 grad.data(),
                 reinterpret_cast<float*>(m.data()),
                 reinterpret_cast<float*>(v.data()),
                 static_cast<int64_t>(n)};
    ASSERT_TRUE(cuda_ops_->Adam(gpu, c).ok());
    ASSERT_TRUE(cpu_ops_->Adam(cpu, c).ok());
    ASSERT_TRUE(cpu_stream_->Synchronize().ok());
    EXPECT_TRUE(SameBits(Download(dmaster.data, 4 * n), master, 4, DType::kFloat32)) << "master";
    EXPECT_TRUE(SameBits(Download(dm.data, 4 * n), m, 4, DType::kFloat32)) << "m";
    EXPECT_TRUE(SameBits(Download(dv.data, 4 * n), v, 4, DType::kFloat32)) << "v";
    if (mixed) {
      EXPECT_TRUE(SameBits(Download(dout.data, 2 * n), out, 2, out_type)) << "param_out";
    }
  }

  // qwZ's int8 packs: the GPU's quantization and dequantization give the
  // CPU ops' bytes (packs, padding included) and bits.
  void CheckQuantizeInt8(std::mt19937_64& rng, size_t n, DType dtype, size_t offset) {
    SCOPED_TRACE("QuantizeInt8 " + std::string(DTypeName(dtype)) + " n=" + std::to_string(n) +
                 " offset=" + std::to_string(offset));
    const size_t width = ElementSize(dtype);
    const std::vector<uint8_t> x = RandomElements(rng, n, dtype, 1.0f, false);
    const size_t packed = static_cast<size_t>(kernels::QuantPackedBytes(static_cast<int64_t>(n)));
    DeviceCopy dx = Upload(x, offset * width);
    DeviceCopy dpacked = Upload(std::vector<uint8_t>(packed, 0x5a), 0);
    DeviceCopy dout = Upload(std::vector<uint8_t>(n * width, 0), offset * width);
    ASSERT_TRUE(dx.data && dpacked.data && dout.data);
    ASSERT_TRUE(cuda_ops_->QuantizeInt8(dx.data, n, dtype, dpacked.data).ok());
    ASSERT_TRUE(cuda_ops_->DequantizeInt8(dpacked.data, n, dtype, dout.data).ok());
    std::vector<uint8_t> want_packed(packed, 0xa5);
    std::vector<uint8_t> want_out(n * width);
    ASSERT_TRUE(cpu_ops_->QuantizeInt8(x.data(), n, dtype, want_packed.data()).ok());
    ASSERT_TRUE(cpu_ops_->DequantizeInt8(want_packed.data(), n, dtype, want_out.data()).ok());
    ASSERT_TRUE(cpu_stream_->Synchronize().ok());
    EXPECT_EQ(Download(dpacked.data, packed), want_packed) << "packs differ";
    EXPECT_TRUE(SameBits(Download(dout.data, n * width), want_out, width, dtype));
  }

  std::unique_ptr<Device> cuda_;
  std::unique_ptr<Stream> cuda_stream_;
  std::unique_ptr<DeviceOps> cuda_ops_;
  std::unique_ptr<Device> cpu_;
  std::unique_ptr<Stream> cpu_stream_;
  std::unique_ptr<DeviceOps> cpu_ops_;
};

const DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

TEST_F(CudaDeviceOpsTest, AccumulateMatchesCpuBits) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  for (DType dtype : kDTypes) {
    for (size_t n : kSizes) {
      for (size_t offset : kOffsets) CheckAccumulate(rng, n, dtype, offset);
    }
    CheckAccumulate(rng, kManyPassElements, dtype, 0);
    CheckAccumulate(rng, kManyPassElements, dtype, 1);
  }
}

TEST_F(CudaDeviceOpsTest, BlockSumSquaresMatchesCpuBits) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 1);
  for (DType dtype : kDTypes) {
    for (size_t n : kSizes) {
      for (size_t offset : kOffsets) {
        CheckBlockSumSquares(rng, n, dtype, offset, false);
        CheckBlockSumSquares(rng, n, dtype, offset, true);
      }
    }
    // 67 M elements: the aligned (vector) path for every dtype, the scalar
    // fallback once.
    CheckBlockSumSquares(rng, kManyPassNormElements, dtype, 0, false);
  }
  CheckBlockSumSquares(rng, kManyPassNormElements, DType::kBFloat16, 1, false);
}

TEST_F(CudaDeviceOpsTest, QuantizeInt8MatchesCpuBytes) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 3);
  for (DType dtype : kDTypes) {
    for (size_t n : kSizes) {
      for (size_t offset : kOffsets) CheckQuantizeInt8(rng, n, dtype, offset);
    }
  }
}

TEST_F(CudaDeviceOpsTest, AdamMatchesCpuBitsForEveryVariant) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed() + 2);
  for (AdamVariant variant :
       {AdamVariant::kFp32, AdamVariant::kMixedBf16, AdamVariant::kMixedBf16GradBf16,
        AdamVariant::kMixedFp16, AdamVariant::kMixedFp16GradFp16}) {
    for (kernels::AdamMode mode : {kernels::AdamMode::kAdamW, kernels::AdamMode::kAdamL2}) {
      for (size_t n : kSizes) {
        for (size_t offset : kOffsets) CheckAdam(rng, n, variant, mode, offset, offset);
        CheckAdam(rng, n, variant, mode, 0, 1);  // only the grad misaligned
      }
      CheckAdam(rng, kManyPassElements, variant, mode, 0, 0);
      CheckAdam(rng, kManyPassElements, variant, mode, 1, 1);
    }
  }
}

TEST_F(CudaDeviceOpsTest, RejectsBadArgumentsAndForeignStreams) {
  EXPECT_EQ(cuda_ops_->Accumulate(nullptr, nullptr, 5, DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_ops_->BlockSumSquares(nullptr, 5, DType::kInt64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cuda_ops_->Accumulate(nullptr, nullptr, 0, DType::kFloat32).ok());
  // A CPU stream with the CUDA device, and the reverse.
  EXPECT_EQ(CreateDeviceOps(*cuda_, *cpu_stream_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CreateDeviceOps(*cpu_, *cuda_stream_).ok());
}

}  // namespace
}  // namespace zeroshard::internal
