// MlpTrainer: one rank's training loop over the engine's public API.
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "examples/mlp/mlp.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

// Elements of each block param, in BlockParam order.
std::vector<int64_t> BlockParamSizes(int64_t hidden) {
  const int64_t inner = internal::InnerSize(hidden);
  return {inner * hidden, inner, hidden * inner, hidden};
}

absl::Status CheckUnitView(const UnitView& view, int unit, const std::vector<int64_t>& sizes,
                           const char* what) {
  if (view.params.size() != sizes.size()) {
    return absl::InternalError(absl::StrCat("MlpTrainer: ", what, " of unit block.", unit, " has ",
                                            view.params.size(), " params, expected ",
                                            sizes.size()));
  }
  for (size_t p = 0; p < sizes.size(); ++p) {
    const TensorView& t = view.params[p];
    if (t.numel != sizes[p] || t.data == nullptr) {
      return absl::InternalError(absl::StrCat("MlpTrainer: ", what, " of unit block.", unit,
                                              " param ", p, " has ", t.numel,
                                              " elements, expected ", sizes[p]));
    }
    if (t.dtype != DType::kFloat32 && t.dtype != DType::kBFloat16) {
      return absl::UnimplementedError(absl::StrCat("MlpTrainer: ", what, " of unit block.", unit,
                                                   " param ", p, " is ", DTypeName(t.dtype),
                                                   "; the MLP example handles fp32 and bf16 only"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

MlpTrainer::MlpTrainer(const MlpConfig& cfg, Engine& engine, Communicator& comm)
    : cfg_(cfg),
      engine_(engine),
      comm_(comm),
      sampler_(cfg, comm.size(), comm.rank(), engine.train().grad_accum_steps) {
  internal::UseSingleThreadedBlas();
  const size_t io = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  target_.resize(io);
  dy_.resize(io);
  dx_.resize(io);
  scratch_.resize(static_cast<size_t>(cfg.micro_batch * internal::InnerSize(cfg.hidden)));
  state_.Resize(cfg.blocks, cfg.micro_batch, cfg.hidden);
  weights_.resize(static_cast<size_t>(cfg.blocks));
  weight_copies_.resize(static_cast<size_t>(cfg.blocks));
  int64_t unit_numel = 0;
  for (int64_t n : BlockParamSizes(cfg.hidden)) unit_numel += n;
  grads_.resize(static_cast<size_t>(unit_numel));
}

absl::StatusOr<internal::BlockWeights> MlpTrainer::Fp32Weights(int unit, const UnitView& view) {
  const std::vector<int64_t> sizes = BlockParamSizes(cfg_.hidden);
  ZS_RETURN_IF_ERROR(CheckUnitView(view, unit, sizes, "params"));
  const float* ptrs[kNumBlockParams];
  std::vector<float>& copy = weight_copies_[unit];
  if (copy.size() != grads_.size()) copy.resize(grads_.size());
  size_t offset = 0;
  for (int p = 0; p < kNumBlockParams; ++p) {
    const TensorView& t = view.params[p];
    if (t.dtype == DType::kFloat32) {
      ptrs[p] = t.as<const float>();
    } else {
      // BLAS wants fp32: widen the bf16 params (exactly) into a scratch copy.
      const uint16_t* src = t.as<const uint16_t>();
      float* dst = copy.data() + offset;
      for (int64_t i = 0; i < t.numel; ++i) dst[i] = Bf16ToFp32(src[i]);
      ptrs[p] = dst;
    }
    offset += static_cast<size_t>(sizes[p]);
  }
  return internal::BlockWeights{ptrs[kW1], ptrs[kB1], ptrs[kW2], ptrs[kB2]};
}

absl::Status MlpTrainer::WriteGrads(int unit, const UnitView& view) const {
  const std::vector<int64_t> sizes = BlockParamSizes(cfg_.hidden);
  ZS_RETURN_IF_ERROR(CheckUnitView(view, unit, sizes, "gradient view"));
  size_t offset = 0;
  for (int p = 0; p < kNumBlockParams; ++p) {
    const TensorView& t = view.params[p];
    const float* src = grads_.data() + offset;
    // Overwrite, never accumulate: the engine does the summing, in an order
    // that does not depend on the world size.
    if (t.dtype == DType::kFloat32) {
      std::memcpy(t.data, src, static_cast<size_t>(t.numel) * sizeof(float));
    } else {
      uint16_t* dst = t.as<uint16_t>();
      for (int64_t i = 0; i < t.numel; ++i) dst[i] = Fp32ToBf16(src[i]);
    }
    offset += static_cast<size_t>(sizes[p]);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MlpTrainer::MicroBatch(int micro) {
  const int64_t batch = cfg_.micro_batch;
  const int64_t h = cfg_.hidden;
  const absl::Time input_start = absl::Now();
  sampler_.Fill(engine_.steps(), micro, state_.inputs[0].data(), target_.data());
  engine_.RecordInputWait(absl::Now() - input_start);

  for (int u = 0; u < cfg_.blocks; ++u) {
    ZS_ASSIGN_OR_RETURN(const UnitView view, engine_.Gather(u));
    ZS_ASSIGN_OR_RETURN(weights_[u], Fp32Weights(u, view));
    internal::BlockForward(weights_[u], batch, h, state_.inputs[u].data(), state_.pre[u].data(),
                           state_.act[u].data(), state_.inputs[u + 1].data());
  }
  const double loss =
      internal::MseLoss(state_.output().data(), target_.data(), batch * h, dy_.data());

  const std::vector<int64_t> sizes = BlockParamSizes(h);
  internal::BlockGradients grads;
  grads.w1 = grads_.data();
  grads.b1 = grads.w1 + sizes[kW1];
  grads.w2 = grads.b1 + sizes[kB1];
  grads.b2 = grads.w2 + sizes[kW2];
  for (int u = cfg_.blocks - 1; u >= 0; --u) {
    // Compute into our own fp32 buffer before asking for the grad view:
    // GradView may block on an earlier reduction, and the copy is cheap.
    internal::BlockBackward(weights_[u], batch, h, state_.inputs[u].data(), state_.pre[u].data(),
                            state_.act[u].data(), dy_.data(), scratch_.data(),
                            u > 0 ? dx_.data() : nullptr, grads);
    ZS_ASSIGN_OR_RETURN(const UnitView grad_view, engine_.GradView(u));
    ZS_RETURN_IF_ERROR(WriteGrads(u, grad_view));
    ZS_RETURN_IF_ERROR(engine_.ReduceGrads(u));
    ZS_RETURN_IF_ERROR(engine_.Release(u));
    std::swap(dy_, dx_);
  }
  return loss;
}

absl::StatusOr<double> MlpTrainer::TrainStep() {
  const int accum = engine_.train().grad_accum_steps;
  double local_loss_sum = 0.0;
  for (int m = 0; m < accum; ++m) {
    ZS_ASSIGN_OR_RETURN(const double loss, MicroBatch(m));
    local_loss_sum += loss;
  }
  ZS_ASSIGN_OR_RETURN(last_step_, engine_.Step());
  double global_loss_sum = 0.0;
  ZS_RETURN_IF_ERROR(comm_.AllReduceSync(&local_loss_sum, &global_loss_sum, 1, DType::kFloat64));
  return global_loss_sum / (static_cast<double>(comm_.size()) * accum);
}

}  // namespace mlp
}  // namespace zeroshard
