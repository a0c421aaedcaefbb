// MlpTrainer: one rank's training loop over the engine's public API.
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/mlp/data_loader.h"
#include "examples/mlp/internal/unit_loop.h"
#include "examples/mlp/internal/view_convert.h"
#include "examples/mlp/mlp.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

constexpr char kWho[] = "MlpTrainer";

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

absl::StatusOr<double> MlpTrainer::MicroBatch(int micro, float loss_scale) {
  const int64_t batch = cfg_.micro_batch;
  const int64_t h = cfg_.hidden;
  const std::vector<int64_t> sizes = BlockParamSizes(h);
  engine_.RecordInputWait(
      loader_->Next(engine_.steps(), micro, state_.inputs[0].data(), target_.data()));

  // The activations the backward needs stay in state_, the weights do not.
  ZS_RETURN_IF_ERROR(internal::ForwardUnits(
      engine_, cfg_.blocks, [&](int u, const UnitView& params) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(
            const internal::BlockWeights weights,
            internal::BlockWeightsAsFp32(params, u, sizes, kWho, weight_copy_.data()));
        internal::BlockForward(weights, batch, h, state_.inputs[u].data(), state_.pre[u].data(),
                               state_.act[u].data(), state_.inputs[u + 1].data());
        return absl::OkStatus();
      }));
  const double loss =
      internal::MseLoss(state_.output().data(), target_.data(), batch * h, dy_.data());
  internal::ScaleLossSeed(loss_scale, &dy_);

  const internal::BlockGradients grads =
      internal::BlockGradientsIn(grads_.data(), internal::InnerSize(h), h);
  ZS_RETURN_IF_ERROR(internal::BackwardUnits(
      engine_, cfg_.blocks,
      [&](int u, const UnitView& params) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(
            const internal::BlockWeights weights,
            internal::BlockWeightsAsFp32(params, u, sizes, kWho, weight_copy_.data()));
        internal::BlockBackward(weights, batch, h, state_.inputs[u].data(), state_.pre[u].data(),
                                state_.act[u].data(), dy_.data(), scratch_.data(),
                                u > 0 ? dx_.data() : nullptr, grads);
        std::swap(dy_, dx_);
        return absl::OkStatus();
      },
      [&](int u, const UnitView& grad_view) {
        return internal::WriteUnitFromFp32(grads_.data(), grad_view, u, sizes, kWho);
      }));
  return loss;
}

absl::StatusOr<double> MlpTrainer::TrainStep() {
  ZS_ASSIGN_OR_RETURN(
      const double local_loss_sum,
      internal::AccumulateAndStep(
          engine_, [&](int m, float loss_scale) { return MicroBatch(m, loss_scale); },
          &last_step_));
  double global_loss_sum = 0.0;
  ZS_RETURN_IF_ERROR(comm_.AllReduceSync(&local_loss_sum, &global_loss_sum, 1, DType::kFloat64));
  return global_loss_sum / (static_cast<double>(comm_.size()) * engine_.train().grad_accum_steps);
}

}  // namespace mlp
}  // namespace zeroshard
