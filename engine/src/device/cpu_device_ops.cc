// DeviceOps on the CPU device: the SIMD kernels of kernels/cpu, run in order
// on the CPU stream's thread.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "engine/src/common/convert.h"
#include "engine/src/device/cpu_stream.h"
#include "engine/src/device/device_ops.h"
#include "kernels/common/quant_int8.h"
#include "kernels/cpu/norm.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

void AccumulateNow(void* acc, const void* add, int64_t n, DType dtype) {
  if (dtype == DType::kFloat32) {
    float* a = static_cast<float*>(acc);
    const float* b = static_cast<const float*>(add);
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    return;
  }
  // 16-bit: widen blocks, add in fp32, round once.
  constexpr int64_t kBlock = 1024;
  float sum[kBlock];
  float term[kBlock];
  uint16_t* a = static_cast<uint16_t*>(acc);
  const uint16_t* b = static_cast<const uint16_t*>(add);
  const bool bf16 = dtype == DType::kBFloat16;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const size_t len = static_cast<size_t>(std::min(kBlock, n - begin));
    (bf16 ? ConvertBf16ToFp32 : ConvertFp16ToFp32)(a + begin, sum, len);
    (bf16 ? ConvertBf16ToFp32 : ConvertFp16ToFp32)(b + begin, term, len);
    for (size_t i = 0; i < len; ++i) sum[i] += term[i];
    (bf16 ? ConvertFp32ToBf16 : ConvertFp32ToFp16)(sum, a + begin, len);
  }
}

void BlockSumSquaresNow(const void* x, int64_t n, DType dtype, double* blocks) {
  const size_t count = static_cast<size_t>(n);
  switch (dtype) {
    case DType::kFloat32:
      kernels::BlockSumSquaresFp32(static_cast<const float*>(x), count, blocks);
      break;
    case DType::kBFloat16:
      kernels::BlockSumSquaresBf16(static_cast<const uint16_t*>(x), count, blocks);
      break;
    default:
      kernels::BlockSumSquaresFp16(static_cast<const uint16_t*>(x), count, blocks);
      break;
  }
}

void AdamNow(const AdamArgs& a, const kernels::AdamConstants& c) {
  const size_t n = static_cast<size_t>(a.n);
  switch (a.variant) {
    case AdamVariant::kFp32:
      kernels::AdamFp32(a.master, static_cast<const float*>(a.grad), a.m, a.v, n, c);
      break;
    case AdamVariant::kMixedBf16:
      kernels::AdamMixedBf16(a.master, a.param_out, static_cast<const float*>(a.grad), a.m, a.v, n,
                             c);
      break;
    case AdamVariant::kMixedBf16GradBf16:
      kernels::AdamMixedBf16GradBf16(a.master, a.param_out, static_cast<const uint16_t*>(a.grad),
                                     a.m, a.v, n, c);
      break;
    case AdamVariant::kMixedFp16:
      kernels::AdamMixedFp16(a.master, a.param_out, static_cast<const float*>(a.grad), a.m, a.v, n,
                             c);
      break;
    case AdamVariant::kMixedFp16GradFp16:
      kernels::AdamMixedFp16GradFp16(a.master, a.param_out, static_cast<const uint16_t*>(a.grad),
                                     a.m, a.v, n, c);
      break;
  }
}

void QuantizeNow(const void* x, int64_t n, DType dtype, void* packed) {
  using namespace kernels;  // NOLINT: the quant_int8.h element functions
  int8_t* q = static_cast<int8_t*>(packed);
  float* scales = reinterpret_cast<float*>(static_cast<char*>(packed) + QuantScalesOffset(n));
  float block[kQuantBlock];
  for (int64_t b = 0; b < QuantBlocks(n); ++b) {
    const int64_t begin = b * kQuantBlock;
    const int64_t len = std::min(kQuantBlock, n - begin);
    WidenToFp32(x, begin, len, dtype, block);
    float absmax = 0.0f;
    for (int64_t i = 0; i < len; ++i) absmax = std::fmax(absmax, std::fabs(block[i]));
    const float scale = QuantScale(absmax);
    scales[b] = scale;
    for (int64_t i = 0; i < len; ++i) q[begin + i] = QuantizeElement(block[i], scale);
  }
  // The padding is part of what ranks exchange: never uninitialised bytes.
  for (int64_t i = n; i < QuantScalesOffset(n); ++i) q[i] = 0;
  const int64_t scale_bytes = QuantPackedBytes(n) - QuantScalesOffset(n);
  for (int64_t i = QuantBlocks(n) * 4; i < scale_bytes; ++i) {
    reinterpret_cast<char*>(scales)[i] = 0;
  }
}

void DequantizeNow(const void* packed, int64_t n, DType dtype, void* out) {
  using namespace kernels;  // NOLINT
  const int8_t* q = static_cast<const int8_t*>(packed);
  const float* scales =
      reinterpret_cast<const float*>(static_cast<const char*>(packed) + QuantScalesOffset(n));
  float block[kQuantBlock];
  for (int64_t b = 0; b < QuantBlocks(n); ++b) {
    const int64_t begin = b * kQuantBlock;
    const int64_t len = std::min(kQuantBlock, n - begin);
    for (int64_t i = 0; i < len; ++i) block[i] = DequantizeElement(q[begin + i], scales[b]);
    NarrowFromFp32(block, begin, len, dtype, out);
  }
}

class CpuDeviceOps final : public DeviceOps {
 public:
  explicit CpuDeviceOps(CpuStream& stream) : stream_(stream) {}

  absl::Status Accumulate(void* acc, const void* add, int64_t n, DType dtype) override {
    ZS_RETURN_IF_ERROR(CheckOperands("Accumulate", n, dtype, {acc, add}));
    if (n > 0)
      stream_.Enqueue([=] {
        AccumulateNow(acc, add, n, dtype);
        return absl::OkStatus();
      });
    return absl::OkStatus();
  }

  absl::Status BlockSumSquares(const void* x, int64_t n, DType dtype, double* blocks) override {
    ZS_RETURN_IF_ERROR(CheckOperands("BlockSumSquares", n, dtype, {x, blocks}));
    if (n > 0)
      stream_.Enqueue([=] {
        BlockSumSquaresNow(x, n, dtype, blocks);
        return absl::OkStatus();
      });
    return absl::OkStatus();
  }

  absl::Status Adam(const AdamArgs& args, const kernels::AdamConstants& c) override {
    ZS_RETURN_IF_ERROR(CheckAdamArgs(args));
    if (args.n > 0)
      stream_.Enqueue([args, c] {
        AdamNow(args, c);
        return absl::OkStatus();
      });
    return absl::OkStatus();
  }

  absl::Status QuantizeInt8(const void* x, int64_t n, DType dtype, void* packed) override {
    ZS_RETURN_IF_ERROR(CheckOperands("QuantizeInt8", n, dtype, {x, packed}));
    if (n > 0)
      stream_.Enqueue([=] {
        QuantizeNow(x, n, dtype, packed);
        return absl::OkStatus();
      });
    return absl::OkStatus();
  }

  absl::Status DequantizeInt8(const void* packed, int64_t n, DType dtype, void* out) override {
    ZS_RETURN_IF_ERROR(CheckOperands("DequantizeInt8", n, dtype, {packed, out}));
    if (n > 0)
      stream_.Enqueue([=] {
        DequantizeNow(packed, n, dtype, out);
        return absl::OkStatus();
      });
    return absl::OkStatus();
  }

  Stream& stream() override { return stream_; }

 private:
  CpuStream& stream_;
};

}  // namespace

absl::Status CheckOperands(const char* op, int64_t n, DType dtype,
                           std::initializer_list<const void*> pointers) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: dtype %s is not a gradient type (fp32, bf16, fp16)", op, DTypeName(dtype)));
  }
  if (n < 0) return absl::InvalidArgumentError(absl::StrFormat("%s: n = %d", op, n));
  for (const void* p : pointers) {
    if (n > 0 && p == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: a null operand for %d elements", op, n));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAdamArgs(const AdamArgs& a) {
  if (a.n < 0) return absl::InvalidArgumentError(absl::StrFormat("Adam: n = %d", a.n));
  if (a.n == 0) return absl::OkStatus();
  const bool mixed = a.variant != AdamVariant::kFp32;
  if (a.master == nullptr || a.grad == nullptr || a.m == nullptr || a.v == nullptr ||
      mixed != (a.param_out != nullptr)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Adam: operands do not match the variant (master %p, param_out %p, grad %p, m %p, v %p; "
        "param_out is given exactly for the mixed variants)",
        a.master, a.param_out, a.grad, a.m, a.v));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceOps>> CreateCpuDeviceOps(Stream& stream) {
  CpuStream* cpu = CpuStream::From(stream);
  if (cpu == nullptr) {
    return absl::InvalidArgumentError("CPU device ops need a stream of the CPU device");
  }
  return std::unique_ptr<DeviceOps>(std::make_unique<CpuDeviceOps>(*cpu));
}

}  // namespace zeroshard::internal
