// CudaMlpMath: the device memory and math of one rank's MLP micro-batch,
// ready for a GPU trainer (docs/gpu.md). It owns the activations of every
// block, the loss seed, one unit's fp32 weight copy and gradients, the block
// scratch and a cuBLASLt handle; the trainer owns the stream and the order
// of the engine calls around it.
//
// One micro-batch, with the engine's views (device memory) in between:
//   copy x into input(0), the teacher's outputs into target();
//   for u in order:   w = WeightsFromView(Gather(u)); Forward(u, w);
//   Loss(loss_scale);
//   for u in reverse: w = WeightsFromView(Gather(u)); Backward(u, w);
//                     WriteGrads(GradView(u)); synchronize; ReduceGrads(u);
//   ReadLoss().
// Every call only enqueues on `stream`, except ReadLoss (which synchronizes
// it). Not thread-safe; use one stream at a time (the scratch is shared).
#ifndef ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_MLP_MATH_H_
#define ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_MLP_MATH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/mlp/cuda/block_math_cuda.h"
#include "examples/mlp/cuda/cublaslt_gemm.h"
#include "zeroshard/engine.h"

namespace zeroshard {
namespace mlp {
namespace gpu {

struct CudaMlpMathConfig {
  int blocks = 0;
  int64_t batch = 0;   // samples per micro-batch
  int64_t hidden = 0;  // the block width h (inner width 4h)
  MatmulInputs inputs = MatmulInputs::kFp32;
};

// Byte offsets of everything CudaMlpMath keeps in its one device
// allocation, each 256-byte aligned. Pure: Create() allocates total_bytes
// and nothing else, so a planner can ask for the size first.
struct CudaMlpMathLayout {
  size_t inputs = 0;       // (blocks + 1) x [batch, h]; inputs[blocks] is the output
  size_t pre = 0;          // blocks x [batch, 4h]
  size_t act = 0;          // blocks x [batch, 4h]
  size_t target = 0;       // [batch, h]
  size_t dy = 0;           // [batch, h]
  size_t dx = 0;           // [batch, h]
  size_t weights[4] = {};  // one unit's fp32 w1, b1, w2, b2
  size_t grads[4] = {};    // one unit's fp32 dW1, db1, dW2, db2
  size_t block_scratch = 0;
  size_t loss_scratch = 0;
  size_t loss = 0;  // one double
  size_t total_bytes = 0;
};

// InvalidArgument for blocks, batch or hidden not positive.
absl::StatusOr<CudaMlpMathLayout> LayOutCudaMlpMath(const CudaMlpMathConfig& config);

class CudaMlpMath {
 public:
  // Allocates LayOutCudaMlpMath(config).total_bytes on the current device
  // and creates the cuBLASLt handle. Errors: InvalidArgument for the
  // config; the failing CUDA / cuBLASLt call (ResourceExhausted when the
  // memory does not fit).
  static absl::StatusOr<std::unique_ptr<CudaMlpMath>> Create(const CudaMlpMathConfig& config);
  ~CudaMlpMath();
  CudaMlpMath(const CudaMlpMath&) = delete;
  CudaMlpMath& operator=(const CudaMlpMath&) = delete;

  const CudaMlpMathConfig& config() const { return config_; }

  // Device arrays of [batch, hidden] floats: the input of block `block`
  // (0..blocks; input(blocks) is the network output) and the target.
  float* input(int block) const;
  float* target() const;

  // The weights of a gathered unit (the engine's param view, device memory,
  // params in w1 b1 w2 b2 order) as fp32 device pointers: the views
  // themselves for fp32, else widened (exactly) into this object's weight
  // copy, enqueued on `stream`. Valid until the view is released and the
  // next call. InvalidArgument when the view does not have the four params
  // of the block's sizes, or a dtype other than fp32, bf16, fp16.
  absl::StatusOr<DeviceBlockWeights> WeightsFromView(const UnitView& view, cudaStream_t stream);

  // Forward of block `block` (0 <= block < blocks): input(block) ->
  // input(block + 1), saving its pre-activation and GELU for Backward.
  absl::Status Forward(int block, const DeviceBlockWeights& w, cudaStream_t stream);

  // MSE of the output against target(): the loss to a device double (read
  // it with ReadLoss) and the backward's seed dL/dy, multiplied by
  // `loss_scale` when it is not 1 (the scaled gradients are what the
  // engine expects; the loss stays unscaled).
  absl::Status Loss(float loss_scale, cudaStream_t stream);

  // Backward of block `block`, from the current dL/dy (the seed for the last
  // block, then what the later block's Backward left): writes the unit's
  // fp32 gradients (grads()) and, for block > 0, dL/dx, which becomes the
  // next call's dL/dy. Call in reverse block order after Loss.
  absl::Status Backward(int block, const DeviceBlockWeights& w, cudaStream_t stream);

  // The last Backward's gradients (device, fp32, overwritten by each call).
  DeviceBlockGradients grads() const;

  // Writes grads() into the engine's gradient view (device memory, params
  // in order), narrowed to its dtype. InvalidArgument as WeightsFromView.
  absl::Status WriteGrads(const UnitView& grad_view, cudaStream_t stream) const;

  // Synchronizes `stream` and returns the last Loss's (unscaled) value.
  absl::StatusOr<double> ReadLoss(cudaStream_t stream) const;

 private:
  CudaMlpMath(const CudaMlpMathConfig& config, const CudaMlpMathLayout& layout,
              std::unique_ptr<CublasLtGemm> gemm, unsigned char* memory);
  // Block `block`'s saved pre-activation and GELU, [batch, 4h] each.
  float* pre(int block) const;
  float* act(int block) const;
  float* At(size_t offset) const { return reinterpret_cast<float*>(memory_ + offset); }
  absl::Status CheckBlock(int block, const char* what) const;
  absl::Status CheckUnitView(const UnitView& view, const char* what) const;
  BlockMathArgs block_args() const;

  CudaMlpMathConfig config_;
  CudaMlpMathLayout layout_;
  std::unique_ptr<CublasLtGemm> gemm_;
  unsigned char* memory_;  // owned: cudaFree in the destructor
  // dL/dy and dL/dx swap after each Backward, as the CPU trainer's do.
  float* dy_;
  float* dx_;
};

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_CUDA_CUDA_MLP_MATH_H_
