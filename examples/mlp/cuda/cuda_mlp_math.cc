#include "examples/mlp/cuda/cuda_mlp_math.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/mlp/cuda/cuda_status.h"
#include "examples/mlp/cuda/internal/mlp_kernels.cuh"
#include "examples/mlp/cuda/view_convert_cuda.h"
#include "zeroshard/dtype.h"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace {

constexpr size_t kAlignment = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// Bytes between the activations of consecutive blocks: each starts on an
// aligned boundary, as cuBLASLt operands should.
size_t IoStride(const CudaMlpMathConfig& c) {
  return AlignUp(static_cast<size_t>(c.batch * c.hidden) * sizeof(float));
}
size_t WideStride(const CudaMlpMathConfig& c) {
  return AlignUp(static_cast<size_t>(c.batch * 4 * c.hidden) * sizeof(float));
}

// Elements of each block param, in w1 b1 w2 b2 order.
void BlockParamSizes(int64_t hidden, int64_t sizes[4]) {
  const int64_t inner = 4 * hidden;
  sizes[0] = inner * hidden;
  sizes[1] = inner;
  sizes[2] = hidden * inner;
  sizes[3] = hidden;
}

}  // namespace

absl::StatusOr<CudaMlpMathLayout> LayOutCudaMlpMath(const CudaMlpMathConfig& c) {
  if (c.blocks <= 0 || c.batch <= 0 || c.hidden <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("CudaMlpMath: blocks ", c.blocks, ", batch ",
                                                   c.batch, " and hidden ", c.hidden,
                                                   " must be positive"));
  }
  const size_t io = static_cast<size_t>(c.batch * c.hidden) * sizeof(float);
  const size_t blocks = static_cast<size_t>(c.blocks);
  CudaMlpMathLayout l;
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset += AlignUp(bytes);
    return at;
  };
  l.inputs = take(IoStride(c) * (blocks + 1));
  l.pre = take(WideStride(c) * blocks);
  l.act = take(WideStride(c) * blocks);
  l.target = take(io);
  l.dy = take(io);
  l.dx = take(io);
  int64_t sizes[4];
  BlockParamSizes(c.hidden, sizes);
  for (int p = 0; p < 4; ++p) l.weights[p] = take(static_cast<size_t>(sizes[p]) * sizeof(float));
  for (int p = 0; p < 4; ++p) l.grads[p] = take(static_cast<size_t>(sizes[p]) * sizeof(float));
  l.block_scratch = take(BlockScratchBytes(c.batch, c.hidden, c.inputs));
  l.loss_scratch = take(MseScratchBytes());
  l.loss = take(sizeof(double));
  l.total_bytes = offset;
  return l;
}

absl::StatusOr<std::unique_ptr<CudaMlpMath>> CudaMlpMath::Create(const CudaMlpMathConfig& config) {
  ZS_ASSIGN_OR_RETURN(const CudaMlpMathLayout layout, LayOutCudaMlpMath(config));
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<CublasLtGemm> gemm, CublasLtGemm::Create());
  void* memory = nullptr;
  ZS_RETURN_IF_ERROR(CudaCallStatus(
      cudaMalloc(&memory, layout.total_bytes),
      absl::StrCat("cudaMalloc (CudaMlpMath, ", layout.total_bytes, " bytes for ", config.blocks,
                   " blocks, batch ", config.batch, ", hidden ", config.hidden, ")")));
  return std::unique_ptr<CudaMlpMath>(
      new CudaMlpMath(config, layout, std::move(gemm), static_cast<unsigned char*>(memory)));
}

CudaMlpMath::CudaMlpMath(const CudaMlpMathConfig& config, const CudaMlpMathLayout& layout,
                         std::unique_ptr<CublasLtGemm> gemm, unsigned char* memory)
    : config_(config),
      layout_(layout),
      gemm_(std::move(gemm)),
      memory_(memory),
      dy_(At(layout.dy)),
      dx_(At(layout.dx)) {}

CudaMlpMath::~CudaMlpMath() {
  // cudaFree waits for the device, so no enqueued kernel still uses it.
  cudaFree(memory_);
}

float* CudaMlpMath::input(int block) const {
  return At(layout_.inputs + IoStride(config_) * static_cast<size_t>(block));
}

float* CudaMlpMath::pre(int block) const {
  return At(layout_.pre + WideStride(config_) * static_cast<size_t>(block));
}

float* CudaMlpMath::act(int block) const {
  return At(layout_.act + WideStride(config_) * static_cast<size_t>(block));
}

float* CudaMlpMath::target() const { return At(layout_.target); }

BlockMathArgs CudaMlpMath::block_args() const {
  return {config_.batch, config_.hidden, config_.inputs, memory_ + layout_.block_scratch,
          BlockScratchBytes(config_.batch, config_.hidden, config_.inputs)};
}

absl::Status CudaMlpMath::CheckBlock(int block, const char* what) const {
  if (block < 0 || block >= config_.blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaMlpMath::", what, ": block ", block, " of ", config_.blocks));
  }
  return absl::OkStatus();
}

absl::Status CudaMlpMath::CheckUnitView(const UnitView& view, const char* what) const {
  int64_t sizes[4];
  BlockParamSizes(config_.hidden, sizes);
  if (view.params.size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat("CudaMlpMath::", what, ": view has ",
                                                   view.params.size(), " params, expected 4"));
  }
  for (int p = 0; p < 4; ++p) {
    if (view.params[p].numel != sizes[p]) {
      return absl::InvalidArgumentError(absl::StrCat("CudaMlpMath::", what, ": param ", p, " has ",
                                                     view.params[p].numel, " elements, expected ",
                                                     sizes[p]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceBlockWeights> CudaMlpMath::WeightsFromView(const UnitView& view,
                                                                cudaStream_t stream) {
  ZS_RETURN_IF_ERROR(CheckUnitView(view, "WeightsFromView"));
  const float* ptrs[4];
  for (int p = 0; p < 4; ++p) {
    const TensorView& t = view.params[p];
    if (t.dtype == DType::kFloat32) {
      ptrs[p] = t.as<const float>();
    } else {
      // cuBLASLt's bf16 path would take bf16 weights directly, but the
      // activations are fp32: widen (exactly) and keep one code path.
      ZS_RETURN_IF_ERROR(ReadAsFp32Cuda(t, At(layout_.weights[p]), stream));
      ptrs[p] = At(layout_.weights[p]);
    }
  }
  return DeviceBlockWeights{ptrs[0], ptrs[1], ptrs[2], ptrs[3]};
}

absl::Status CudaMlpMath::Forward(int block, const DeviceBlockWeights& w, cudaStream_t stream) {
  ZS_RETURN_IF_ERROR(CheckBlock(block, "Forward"));
  return BlockForwardCuda(*gemm_, block_args(), w, input(block), pre(block), act(block),
                          input(block + 1), stream);
}

absl::Status CudaMlpMath::Loss(float loss_scale, cudaStream_t stream) {
  dy_ = At(layout_.dy);
  dx_ = At(layout_.dx);
  const int64_t n = config_.batch * config_.hidden;
  ZS_RETURN_IF_ERROR(MseLossCuda(input(config_.blocks), target(), n, dy_,
                                 memory_ + layout_.loss_scratch, MseScratchBytes(),
                                 reinterpret_cast<double*>(memory_ + layout_.loss), stream));
  // Scale the seed, not the gradients: every later value is linear in it.
  // With a scale of 1 the arithmetic is left exactly as the CPU's.
  if (loss_scale == 1.0f) return absl::OkStatus();
  return CudaCallStatus(
      internal::LaunchScaleInPlace(loss_scale, static_cast<size_t>(n), dy_, stream),
      "LaunchScaleInPlace (CudaMlpMath::Loss, dy *= loss_scale)");
}

absl::Status CudaMlpMath::Backward(int block, const DeviceBlockWeights& w, cudaStream_t stream) {
  ZS_RETURN_IF_ERROR(CheckBlock(block, "Backward"));
  ZS_RETURN_IF_ERROR(BlockBackwardCuda(*gemm_, block_args(), w, input(block), pre(block),
                                       act(block), dy_, block > 0 ? dx_ : nullptr, grads(),
                                       stream));
  std::swap(dy_, dx_);
  return absl::OkStatus();
}

DeviceBlockGradients CudaMlpMath::grads() const {
  return {At(layout_.grads[0]), At(layout_.grads[1]), At(layout_.grads[2]), At(layout_.grads[3])};
}

absl::Status CudaMlpMath::WriteGrads(const UnitView& grad_view, cudaStream_t stream) const {
  ZS_RETURN_IF_ERROR(CheckUnitView(grad_view, "WriteGrads"));
  for (int p = 0; p < 4; ++p) {
    // Overwrite, never accumulate: the engine does the summing.
    ZS_RETURN_IF_ERROR(WriteFromFp32Cuda(At(layout_.grads[p]), grad_view.params[p], stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CudaMlpMath::ReadLoss(cudaStream_t stream) const {
  return gpu::ReadLoss(reinterpret_cast<const double*>(memory_ + layout_.loss), stream);
}

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
