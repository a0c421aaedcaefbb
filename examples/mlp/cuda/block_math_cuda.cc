#include "examples/mlp/cuda/block_math_cuda.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "examples/mlp/cuda/cuda_status.h"
#include "examples/mlp/cuda/internal/mlp_kernels.cuh"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace {

constexpr size_t kScratchAlignment = 256;

size_t AlignUp(size_t bytes) {
  return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

int64_t InnerSize(int64_t hidden) { return 4 * hidden; }

absl::Status CheckArgs(const BlockMathArgs& a, const char* what) {
  if (a.batch <= 0 || a.hidden <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": batch ", a.batch, " and hidden ", a.hidden, " must be positive"));
  }
  const size_t needed = BlockScratchBytes(a.batch, a.hidden, a.inputs);
  if (a.scratch == nullptr || a.scratch_bytes < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": scratch of ", a.scratch_bytes, " bytes, needs ", needed,
                     " (BlockScratchBytes) for batch ", a.batch, " hidden ", a.hidden));
  }
  return absl::OkStatus();
}

absl::Status CheckPointers(std::initializer_list<const void*> pointers, const char* what) {
  for (const void* p : pointers) {
    if (p == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a weight, activation or gradient pointer is null"));
    }
  }
  return absl::OkStatus();
}

// Where a product's operands are read from: the fp32 arrays themselves, or
// their bf16 copies in scratch (written by Narrow()).
class Operands {
 public:
  Operands(const BlockMathArgs& args, cudaStream_t stream)
      : args_(args),
        layout_(LayOutBlockScratch(args.batch, args.hidden, args.inputs)),
        stream_(stream) {}

  GemmInputType type() const {
    return args_.inputs == MatmulInputs::kBf16 ? GemmInputType::kBf16 : GemmInputType::kFp32;
  }

  // The operand to pass for `src` (n elements): src itself for fp32, else
  // its bf16 copy at scratch offset `offset`, enqueued now.
  absl::StatusOr<const void*> Narrow(const float* src, int64_t n, size_t offset,
                                     const char* what) const {
    if (args_.inputs == MatmulInputs::kFp32) return static_cast<const void*>(src);
    auto* dst = reinterpret_cast<uint16_t*>(static_cast<unsigned char*>(args_.scratch) + offset);
    ZS_RETURN_IF_ERROR(
        CudaCallStatus(internal::LaunchFp32ToBf16(src, static_cast<size_t>(n), dst, stream_),
                       absl::StrCat("LaunchFp32ToBf16 (", what, ")")));
    return static_cast<const void*>(dst);
  }

  const BlockScratchLayout& layout() const { return layout_; }
  float* dpre() const {
    return reinterpret_cast<float*>(static_cast<unsigned char*>(args_.scratch) + layout_.dpre);
  }

 private:
  const BlockMathArgs& args_;
  BlockScratchLayout layout_;
  cudaStream_t stream_;
};

// One launch, its error named.
absl::Status Launched(cudaError_t error, const char* launcher, const char* what) {
  return CudaCallStatus(error, absl::StrCat(launcher, " (", what, ")"));
}

}  // namespace

BlockScratchLayout LayOutBlockScratch(int64_t batch, int64_t hidden, MatmulInputs inputs) {
  const size_t io = static_cast<size_t>(batch * hidden);
  const size_t inner = static_cast<size_t>(batch * InnerSize(hidden));
  const size_t weight = static_cast<size_t>(InnerSize(hidden) * hidden);
  BlockScratchLayout layout;
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset += AlignUp(bytes);
    return at;
  };
  layout.dpre = take(inner * sizeof(float));
  if (inputs == MatmulInputs::kBf16) {
    layout.w1_bf16 = take(weight * sizeof(uint16_t));
    layout.w2_bf16 = take(weight * sizeof(uint16_t));
    layout.x_bf16 = take(io * sizeof(uint16_t));
    layout.act_bf16 = take(inner * sizeof(uint16_t));
    layout.dy_bf16 = take(io * sizeof(uint16_t));
    layout.dpre_bf16 = take(inner * sizeof(uint16_t));
  }
  layout.total_bytes = offset;
  return layout;
}

size_t MseScratchBytes() { return internal::MseScratchDoubles() * sizeof(double); }

absl::Status BlockForwardCuda(CublasLtGemm& gemm, const BlockMathArgs& args,
                              const DeviceBlockWeights& w, const float* x, float* pre, float* act,
                              float* y, cudaStream_t stream) {
  ZS_RETURN_IF_ERROR(CheckArgs(args, "BlockForwardCuda"));
  ZS_RETURN_IF_ERROR(CheckPointers({w.w1, w.b1, w.w2, w.b2, x, pre, act, y}, "BlockForwardCuda"));
  const int64_t batch = args.batch;
  const int64_t hidden = args.hidden;
  const int64_t inner = InnerSize(hidden);
  const size_t io = static_cast<size_t>(batch * hidden);
  const Operands ops(args, stream);
  const BlockScratchLayout& l = ops.layout();

  // pre [B,4h] = x [B,h] * W1^T, then + b1; act = gelu(pre).
  ZS_ASSIGN_OR_RETURN(const void* x_op, ops.Narrow(x, batch * hidden, l.x_bf16, "x"));
  ZS_ASSIGN_OR_RETURN(const void* w1_op, ops.Narrow(w.w1, inner * hidden, l.w1_bf16, "W1"));
  ZS_RETURN_IF_ERROR(gemm.RowMajor({Transpose::kNo, Transpose::kYes, batch, inner, hidden,
                                    ops.type(), x_op, hidden, w1_op, hidden, pre, inner},
                                   stream, "forward pre = x W1^T"));
  ZS_RETURN_IF_ERROR(Launched(internal::LaunchAddBias(w.b1, static_cast<size_t>(batch),
                                                      static_cast<size_t>(inner), pre, stream),
                              "LaunchAddBias", "forward pre += b1"));
  ZS_RETURN_IF_ERROR(
      Launched(internal::LaunchGelu(pre, static_cast<size_t>(batch * inner), act, stream),
               "LaunchGelu", "forward act = gelu(pre)"));

  // y [B,h] = act [B,4h] * W2^T, then + b2 + x (the residual).
  ZS_ASSIGN_OR_RETURN(const void* act_op, ops.Narrow(act, batch * inner, l.act_bf16, "act"));
  ZS_ASSIGN_OR_RETURN(const void* w2_op, ops.Narrow(w.w2, hidden * inner, l.w2_bf16, "W2"));
  ZS_RETURN_IF_ERROR(gemm.RowMajor({Transpose::kNo, Transpose::kYes, batch, hidden, inner,
                                    ops.type(), act_op, inner, w2_op, inner, y, hidden},
                                   stream, "forward y = act W2^T"));
  ZS_RETURN_IF_ERROR(Launched(internal::LaunchAddBias(w.b2, static_cast<size_t>(batch),
                                                      static_cast<size_t>(hidden), y, stream),
                              "LaunchAddBias", "forward y += b2"));
  return Launched(internal::LaunchAddInPlace(x, io, y, stream), "LaunchAddInPlace",
                  "forward y += x");
}

absl::Status BlockBackwardCuda(CublasLtGemm& gemm, const BlockMathArgs& args,
                               const DeviceBlockWeights& w, const float* x, const float* pre,
                               const float* act, const float* dy, float* dx,
                               const DeviceBlockGradients& grads, cudaStream_t stream) {
  ZS_RETURN_IF_ERROR(CheckArgs(args, "BlockBackwardCuda"));
  ZS_RETURN_IF_ERROR(CheckPointers(
      {w.w1, w.w2, x, pre, act, dy, grads.w1, grads.b1, grads.w2, grads.b2}, "BlockBackwardCuda"));
  const int64_t batch = args.batch;
  const int64_t hidden = args.hidden;
  const int64_t inner = InnerSize(hidden);
  const Operands ops(args, stream);
  const BlockScratchLayout& l = ops.layout();

  // dW2 [h,4h] = dy^T [h,B] * act [B,4h]; db2 = column sums of dy.
  ZS_ASSIGN_OR_RETURN(const void* dy_op, ops.Narrow(dy, batch * hidden, l.dy_bf16, "dy"));
  ZS_ASSIGN_OR_RETURN(const void* act_op, ops.Narrow(act, batch * inner, l.act_bf16, "act"));
  ZS_RETURN_IF_ERROR(gemm.RowMajor({Transpose::kYes, Transpose::kNo, hidden, inner, batch,
                                    ops.type(), dy_op, hidden, act_op, inner, grads.w2, inner},
                                   stream, "backward dW2 = dy^T act"));
  ZS_RETURN_IF_ERROR(
      Launched(internal::LaunchColumnSums(dy, static_cast<size_t>(batch),
                                          static_cast<size_t>(hidden), grads.b2, stream),
               "LaunchColumnSums", "backward db2"));

  // dpre [B,4h] = (dy [B,h] * W2 [h,4h]) * gelu'(pre).
  float* dpre = ops.dpre();
  ZS_ASSIGN_OR_RETURN(const void* w2_op, ops.Narrow(w.w2, hidden * inner, l.w2_bf16, "W2"));
  ZS_RETURN_IF_ERROR(gemm.RowMajor({Transpose::kNo, Transpose::kNo, batch, inner, hidden,
                                    ops.type(), dy_op, hidden, w2_op, inner, dpre, inner},
                                   stream, "backward dact = dy W2"));
  ZS_RETURN_IF_ERROR(
      Launched(internal::LaunchMulGeluGrad(pre, static_cast<size_t>(batch * inner), dpre, stream),
               "LaunchMulGeluGrad", "backward dpre = dact * gelu'(pre)"));

  // dW1 [4h,h] = dpre^T [4h,B] * x [B,h]; db1 = column sums of dpre.
  ZS_ASSIGN_OR_RETURN(const void* dpre_op, ops.Narrow(dpre, batch * inner, l.dpre_bf16, "dpre"));
  ZS_ASSIGN_OR_RETURN(const void* x_op, ops.Narrow(x, batch * hidden, l.x_bf16, "x"));
  ZS_RETURN_IF_ERROR(gemm.RowMajor({Transpose::kYes, Transpose::kNo, inner, hidden, batch,
                                    ops.type(), dpre_op, inner, x_op, hidden, grads.w1, hidden},
                                   stream, "backward dW1 = dpre^T x"));
  ZS_RETURN_IF_ERROR(
      Launched(internal::LaunchColumnSums(dpre, static_cast<size_t>(batch),
                                          static_cast<size_t>(inner), grads.b1, stream),
               "LaunchColumnSums", "backward db1"));
  if (dx == nullptr) return absl::OkStatus();

  // dx [B,h] = dy (the residual path) + dpre [B,4h] * W1 [4h,h].
  ZS_ASSIGN_OR_RETURN(const void* w1_op, ops.Narrow(w.w1, inner * hidden, l.w1_bf16, "W1"));
  ZS_RETURN_IF_ERROR(gemm.RowMajor({Transpose::kNo, Transpose::kNo, batch, hidden, inner,
                                    ops.type(), dpre_op, inner, w1_op, hidden, dx, hidden},
                                   stream, "backward dx = dpre W1"));
  return Launched(internal::LaunchAddInPlace(dy, static_cast<size_t>(batch * hidden), dx, stream),
                  "LaunchAddInPlace", "backward dx += dy");
}

absl::Status MseLossCuda(const float* out, const float* target, int64_t n, float* dout,
                         void* scratch, size_t scratch_bytes, double* loss, cudaStream_t stream) {
  if (n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MseLossCuda: ", n, " elements"));
  }
  if (out == nullptr || target == nullptr || dout == nullptr || loss == nullptr ||
      scratch == nullptr || scratch_bytes < MseScratchBytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MseLossCuda: a null pointer, or scratch of ", scratch_bytes,
                     " bytes (needs MseScratchBytes() = ", MseScratchBytes(), ")"));
  }
  return CudaCallStatus(internal::LaunchMseLoss(out, target, static_cast<size_t>(n), dout,
                                                static_cast<double*>(scratch), loss, stream),
                        "LaunchMseLoss");
}

absl::StatusOr<double> ReadLoss(const double* loss, cudaStream_t stream) {
  double host = 0.0;
  ZS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&host, loss, sizeof(double), cudaMemcpyDeviceToHost, stream));
  ZS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
