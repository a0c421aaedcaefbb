// MlpTrainer: one rank's training loop over the engine's public API.
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/mlp/data_loader.h"
#include "examples/mlp/internal/view_convert.h"
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

}  // namespace

MlpTrainer::MlpTrainer(const MlpConfig& cfg, Engine& engine, Communicator& comm,
                       const DataLoaderOptions& data)
    : cfg_(cfg), engine_(engine), comm_(comm) {
  // Before the loader's thread makes its first teacher forward.
  internal::UseSingleThreadedBlas();
  loader_ = std::make_unique<MicroBatchLoader>(
      cfg, comm.size(), comm.rank(), engine.train().grad_accum_steps, data.depth, engine.steps());
  const size_t io = static_cast<size_t>(cfg.micro_batch * cfg.hidden);
  target_.resize(io);
  dy_.resize(io);
  dx_.resize(io);
  scratch_.resize(static_cast<size_t>(cfg.micro_batch * internal::InnerSize(cfg.hidden)));
  state_.Resize(cfg.blocks, cfg.micro_batch, cfg.hidden);
  int64_t unit_numel = 0;
  for (int64_t n : BlockParamSizes(cfg.hidden)) unit_numel += n;
  grads_.resize(static_cast<size_t>(unit_numel));
  weight_copy_.resize(static_cast<size_t>(unit_numel));
}

MlpTrainer::~MlpTrainer() = default;

absl::StatusOr<internal::BlockWeights> MlpTrainer::GatherFp32Weights(int unit) {
  ZS_ASSIGN_OR_RETURN(const UnitView view, engine_.Gather(unit));
  const float* ptrs[kNumBlockParams];
  ZS_RETURN_IF_ERROR(internal::UnitParamsAsFp32(view, unit, BlockParamSizes(cfg_.hidden),
                                                "MlpTrainer", weight_copy_.data(), ptrs));
  return internal::BlockWeights{ptrs[kW1], ptrs[kB1], ptrs[kW2], ptrs[kB2]};
}

absl::Status MlpTrainer::WriteGrads(int unit, const UnitView& view) const {
  return internal::WriteUnitFromFp32(grads_.data(), view, unit, BlockParamSizes(cfg_.hidden),
                                     "MlpTrainer");
}

absl::StatusOr<double> MlpTrainer::MicroBatch(int micro, float loss_scale) {
  const int64_t batch = cfg_.micro_batch;
  const int64_t h = cfg_.hidden;
  engine_.RecordInputWait(
      loader_->Next(engine_.steps(), micro, state_.inputs[0].data(), target_.data()));

  // Forward. Each unit is released before the next is gathered (stage 3
  // holds one gathered unit at a time); the activations the backward needs
  // stay in state_, the weights do not.
  for (int u = 0; u < cfg_.blocks; ++u) {
    ZS_ASSIGN_OR_RETURN(const internal::BlockWeights weights, GatherFp32Weights(u));
    internal::BlockForward(weights, batch, h, state_.inputs[u].data(), state_.pre[u].data(),
                           state_.act[u].data(), state_.inputs[u + 1].data());
    ZS_RETURN_IF_ERROR(engine_.Release(u));
  }
  const double loss =
      internal::MseLoss(state_.output().data(), target_.data(), batch * h, dy_.data());
  // Scale the seed, not the gradients: every later value is linear in it, so
  // the scale reaches all gradients, and small fp16 gradients stay above the
  // underflow threshold. With a scale of 1 (fp32, bf16) the arithmetic is
  // left exactly as it was.
  if (loss_scale != 1.0f) {
    for (float& d : dy_) d *= loss_scale;
  }

  const std::vector<int64_t> sizes = BlockParamSizes(h);
  internal::BlockGradients grads;
  grads.w1 = grads_.data();
  grads.b1 = grads.w1 + sizes[kW1];
  grads.w2 = grads.b1 + sizes[kB1];
  grads.b2 = grads.w2 + sizes[kW2];
  for (int u = cfg_.blocks - 1; u >= 0; --u) {
    // The backward needs the weights again: gather the unit a second time.
    ZS_ASSIGN_OR_RETURN(const internal::BlockWeights weights, GatherFp32Weights(u));
    // Compute into our own fp32 buffer before asking for the grad view:
    // GradView may block on an earlier reduction, and the copy is cheap.
    internal::BlockBackward(weights, batch, h, state_.inputs[u].data(), state_.pre[u].data(),
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
  // Constant within a step; the engine unscales what we write.
  const float loss_scale = static_cast<float>(engine_.loss_scale());
  double local_loss_sum = 0.0;
  for (int m = 0; m < accum; ++m) {
    ZS_ASSIGN_OR_RETURN(const double loss, MicroBatch(m, loss_scale));
    local_loss_sum += loss;
  }
  ZS_ASSIGN_OR_RETURN(last_step_, engine_.Step());
  double global_loss_sum = 0.0;
  ZS_RETURN_IF_ERROR(comm_.AllReduceSync(&local_loss_sum, &global_loss_sum, 1, DType::kFloat64));
  return global_loss_sum / (static_cast<double>(comm_.size()) * accum);
}

}  // namespace mlp
}  // namespace zeroshard
