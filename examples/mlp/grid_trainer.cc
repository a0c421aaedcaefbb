// GridMlpTrainer: one rank of a dp x tp x pp run of the residual MLP.
#include "examples/mlp/grid_trainer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/mlp/internal/steady_clock.h"
#include "examples/mlp/internal/unit_loop.h"
#include "examples/mlp/internal/view_convert.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

// Point-to-point tags on grid.pp(): activations downstream, their gradients
// upstream (matched in issue order per direction).
constexpr uint64_t kActivationTag = 1;
constexpr uint64_t kGradientTag = 2;

constexpr char kWho[] = "GridMlpTrainer";

// [outer, split, inner] of a tensor around its split dimension.
struct SplitShape {
  int64_t outer = 1;
  int64_t split = 1;
  int64_t inner = 1;
};

SplitShape SplitAround(const ParamSpec& param) {
  SplitShape s;
  const int d = param.tp_split_dim;
  for (int i = 0; i < static_cast<int>(param.shape.size()); ++i) {
    if (i < d) s.outer *= param.shape[i];
    if (i == d) s.split = param.shape[i];
    if (i > d) s.inner *= param.shape[i];
  }
  return s;
}

}  // namespace

absl::StatusOr<ModelSpec> BuildShardModelSpec(const MlpConfig& cfg, const GridShape& shape,
                                              const GridCoord& coord) {
  return ShardModelSpec(BuildModelSpec(cfg), shape.tp, coord.tp, shape.pp, coord.pp);
}

std::vector<float> SliceForTensorParallel(const ParamSpec& param, const std::vector<float>& full,
                                          int tp, int tp_rank) {
  if (tp == 1 || param.tp_split_dim < 0) return full;
  const SplitShape s = SplitAround(param);
  const int64_t part = s.split / tp * s.inner;  // contiguous elements per outer index
  std::vector<float> slice(static_cast<size_t>(s.outer * part));
  for (int64_t o = 0; o < s.outer; ++o) {
    const float* src = full.data() + o * s.split * s.inner + tp_rank * part;
    std::copy(src, src + part, slice.begin() + o * part);
  }
  return slice;
}

std::vector<float> JoinTensorParallel(const ParamSpec& param, const std::vector<float>& slices,
                                      int tp) {
  if (tp == 1) return slices;
  if (param.tp_split_dim < 0) {
    return std::vector<float>(slices.begin(), slices.begin() + slices.size() / tp);
  }
  const SplitShape s = SplitAround(param);
  const int64_t part = s.split / tp * s.inner;
  const int64_t slice_numel = s.outer * part;
  std::vector<float> full(static_cast<size_t>(s.outer * s.split * s.inner));
  for (int r = 0; r < tp; ++r) {
    for (int64_t o = 0; o < s.outer; ++o) {
      const float* src = slices.data() + r * slice_numel + o * part;
      std::copy(src, src + part, full.begin() + o * s.split * s.inner + r * part);
    }
  }
  return full;
}

absl::Status InitShardEngineParams(Engine& engine, const MlpConfig& cfg, const ProcessGrid& grid) {
  const ModelSpec full = BuildModelSpec(cfg);
  ZS_ASSIGN_OR_RETURN(const auto stages, PipelineStageUnits(full, grid.shape().pp));
  const auto [first, last] = stages[grid.coord().pp];
  if (static_cast<int>(engine.model().units.size()) != last - first) {
    return absl::InvalidArgumentError(absl::StrCat(
        "InitShardEngineParams: the engine's model has ", engine.model().units.size(),
        " units but pipeline stage ", grid.coord().pp, " of ", grid.shape().pp, " holds ",
        last - first, " blocks; create the engine with BuildShardModelSpec(cfg, grid)"));
  }
  for (int u = first; u < last; ++u) {
    for (int p = 0; p < kNumBlockParams; ++p) {
      ZS_RETURN_IF_ERROR(
          engine.SetParam(u - first, p,
                          SliceForTensorParallel(full.units[u].params[p], InitialParam(cfg, u, p),
                                                 grid.shape().tp, grid.coord().tp)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> GatherGridParams(Engine& engine,
                                                                 const MlpConfig& cfg,
                                                                 ProcessGrid& grid) {
  const ModelSpec full = BuildModelSpec(cfg);
  const GridShape& shape = grid.shape();
  ZS_ASSIGN_OR_RETURN(const auto stages, PipelineStageUnits(full, shape.pp));
  std::vector<std::vector<float>> params;
  for (int s = 0; s < shape.pp; ++s) {
    for (int u = stages[s].first; u < stages[s].second; ++u) {
      for (int p = 0; p < kNumBlockParams; ++p) {
        const ParamSpec& spec = full.units[u].params[p];
        std::vector<float> values(static_cast<size_t>(spec.NumElements()));
        if (grid.coord().pp == s) {
          ZS_ASSIGN_OR_RETURN(std::vector<float> shard, engine.GetParam(u - stages[s].first, p));
          if (shape.tp > 1) {
            std::vector<float> slices(shard.size() * shape.tp);
            ZS_RETURN_IF_ERROR(grid.tp().AllGatherSync(
                shard.data(), slices.data(), static_cast<int64_t>(shard.size()), DType::kFloat32));
            shard = JoinTensorParallel(spec, slices, shape.tp);
          }
          values = std::move(shard);
        }
        if (shape.pp > 1) {
          ZS_RETURN_IF_ERROR(grid.pp()
                                 .Broadcast(values.data(), static_cast<int64_t>(values.size()),
                                            DType::kFloat32, /*root=*/s)
                                 .Wait());
        }
        params.push_back(std::move(values));
      }
    }
  }
  return params;
}

// One micro-batch in flight on this stage: its saved activations (inputs[0]
// is the stage's input, received or drawn), the targets and the backward
// seed (last stage) or the received output gradient, the gradient sent
// upstream, and the handles of the sends still reading them.
struct GridMlpTrainer::Slot {
  internal::ForwardState state;
  std::vector<float> target;
  std::vector<float> dy;       // dL/d(stage output)
  std::vector<float> dx_sent;  // dL/d(stage input), being sent upstream
  CommHandle input_recv;
  CommHandle dy_recv;
  CommHandle output_send;
  CommHandle dx_send;
};

GridMlpTrainer::GridMlpTrainer(const MlpConfig& cfg, Engine& engine, ProcessGrid& grid,
                               int first_unit, int num_units)
    : cfg_(cfg),
      engine_(engine),
      grid_(grid),
      first_unit_(first_unit),
      num_units_(num_units),
      inner_(internal::InnerSize(cfg.hidden) / grid.shape().tp),
      micro_batches_(engine.train().grad_accum_steps),
      first_stage_(grid.coord().pp == 0),
      last_stage_(grid.coord().pp == grid.shape().pp - 1),
      schedule_(
          OneFOneBSchedule(grid.shape().pp, grid.coord().pp, engine.train().grad_accum_steps)) {
  internal::UseSingleThreadedBlas();
  if (first_stage_ || last_stage_) {
    loader_ =
        std::make_unique<MicroBatchLoader>(cfg, grid.shape().dp, grid.coord().dp, micro_batches_,
                                           DataLoaderOptions{}.depth, engine.steps());
  }
  const int64_t h = cfg.hidden;
  const size_t io = static_cast<size_t>(cfg.micro_batch * h);
  param_sizes_ = {inner_ * h, inner_, h * inner_, h};
  // 1F1B keeps at most pp - stage micro-batches in flight on this stage, and
  // runs backwards in micro-batch order: micro-batch m can take slot
  // m % slots once m - slots has finished its backward.
  const int slots = std::min(micro_batches_, grid.shape().pp - grid.coord().pp);
  for (int i = 0; i < slots; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->state.Resize(num_units, cfg.micro_batch, h, inner_);
    slot->target.resize(io);
    slot->dy.resize(io);
    slot->dx_sent.resize(io);
    slots_.push_back(std::move(slot));
  }
  work_a_.resize(io);
  work_b_.resize(io);
  scratch_.resize(static_cast<size_t>(cfg.micro_batch * inner_));
  int64_t unit_numel = 0;
  for (int64_t n : param_sizes_) unit_numel += n;
  weight_copy_.resize(static_cast<size_t>(unit_numel));
  grads_.resize(static_cast<size_t>(unit_numel));
}

GridMlpTrainer::~GridMlpTrainer() = default;

absl::StatusOr<std::unique_ptr<GridMlpTrainer>> GridMlpTrainer::Create(const MlpConfig& cfg,
                                                                       Engine& engine,
                                                                       ProcessGrid& grid) {
  ZS_RETURN_IF_ERROR(cfg.Validate());
  ZS_RETURN_IF_ERROR(CheckRegressionModelOnly(cfg, "GridMlpTrainer"));
  ZS_ASSIGN_OR_RETURN(const auto stages, PipelineStageUnits(BuildModelSpec(cfg), grid.shape().pp));
  ZS_ASSIGN_OR_RETURN(const ModelSpec shard, BuildShardModelSpec(cfg, grid.shape(), grid.coord()));
  const ModelSpec& model = engine.model();
  bool same = model.units.size() == shard.units.size();
  for (size_t u = 0; same && u < shard.units.size(); ++u) {
    same = model.units[u].name == shard.units[u].name &&
           model.units[u].params.size() == shard.units[u].params.size();
    for (size_t p = 0; same && p < shard.units[u].params.size(); ++p) {
      same = model.units[u].params[p].shape == shard.units[u].params[p].shape;
    }
  }
  if (!same) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GridMlpTrainer: the engine's model is not the shard of grid position (tp ",
        grid.coord().tp, ", pp ", grid.coord().pp, ") of ", grid.shape().ToString(),
        "; create the engine with BuildShardModelSpec(cfg, grid.shape(), grid.coord())"));
  }
  const auto [first, last] = stages[grid.coord().pp];
  return std::unique_ptr<GridMlpTrainer>(
      new GridMlpTrainer(cfg, engine, grid, first, last - first));
}

absl::Status GridMlpTrainer::WaitPipeline(CommHandle& handle) {
  if (!handle.valid()) return absl::OkStatus();
  const absl::Duration start = internal::SteadyNow();
  absl::Status status = handle.Wait();
  engine_.RecordPipelineWait(internal::SteadyNow() - start);
  handle = CommHandle();
  return status;
}

absl::Status GridMlpTrainer::TensorParallelSum(float* data) {
  if (grid_.shape().tp == 1) return absl::OkStatus();
  // In place, summed in tp rank order: every tp rank gets the same bits.
  return grid_.tp().AllReduceSync(data, data, cfg_.micro_batch * cfg_.hidden, DType::kFloat32);
}

void GridMlpTrainer::IssueRecvs() {
  const int64_t count = cfg_.micro_batch * cfg_.hidden;
  const int slots = static_cast<int>(slots_.size());
  const int stage = grid_.coord().pp;
  // A slot's buffers are free once its previous micro-batch finished its
  // backward; issuing the Recv then lets the neighbour's message land while
  // this stage computes.
  if (!first_stage_) {
    for (; forward_recvs_ < micro_batches_ && forward_recvs_ < backwards_done_ + slots;
         ++forward_recvs_) {
      Slot& slot = *slots_[forward_recvs_ % slots];
      slot.input_recv = grid_.pp().Recv(slot.state.inputs[0].data(), count, DType::kFloat32,
                                        stage - 1, kActivationTag);
    }
  }
  if (!last_stage_) {
    for (; backward_recvs_ < micro_batches_ && backward_recvs_ < backwards_done_ + slots;
         ++backward_recvs_) {
      Slot& slot = *slots_[backward_recvs_ % slots];
      slot.dy_recv =
          grid_.pp().Recv(slot.dy.data(), count, DType::kFloat32, stage + 1, kGradientTag);
    }
  }
}

absl::Status GridMlpTrainer::Forward(int micro, float loss_scale, double* loss_sum) {
  const int64_t batch = cfg_.micro_batch;
  const int64_t h = cfg_.hidden;
  Slot& slot = *slots_[micro % slots_.size()];
  // The slot's output may still be on its way to the next stage.
  ZS_RETURN_IF_ERROR(WaitPipeline(slot.output_send));
  internal::ForwardState& state = slot.state;
  if (first_stage_ || last_stage_) {
    // The first stage needs the inputs, the last the targets; the loader
    // writes both (a stage in between draws nothing).
    float* x = first_stage_ ? state.inputs[0].data() : work_a_.data();
    engine_.RecordInputWait(loader_->Next(engine_.steps(), micro, x, slot.target.data()));
  }
  if (!first_stage_) ZS_RETURN_IF_ERROR(WaitPipeline(slot.input_recv));

  ZS_RETURN_IF_ERROR(internal::ForwardUnits(
      engine_, num_units_, [&](int u, const UnitView& params) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(const internal::BlockWeights w,
                            internal::BlockWeightsAsFp32(params, first_unit_ + u, param_sizes_,
                                                         kWho, weight_copy_.data()));
        float* y = state.inputs[u + 1].data();
        internal::BlockForwardPartial(w, batch, h, inner_, state.inputs[u].data(),
                                      state.pre[u].data(), state.act[u].data(), y);
        ZS_RETURN_IF_ERROR(TensorParallelSum(y));  // g: the row-parallel product's sum
        internal::BlockForwardFinish(w.b2, batch, h, state.inputs[u].data(), y);
        return absl::OkStatus();
      }));
  const std::vector<float>& out = state.output();
  if (!last_stage_) {
    slot.output_send = grid_.pp().Send(out.data(), batch * h, DType::kFloat32, grid_.coord().pp + 1,
                                       kActivationTag);
    return absl::OkStatus();
  }
  *loss_sum += internal::MseLoss(out.data(), slot.target.data(), batch * h, slot.dy.data());
  internal::ScaleLossSeed(loss_scale, &slot.dy);
  return absl::OkStatus();
}

absl::Status GridMlpTrainer::Backward(int micro) {
  const int64_t batch = cfg_.micro_batch;
  const int64_t h = cfg_.hidden;
  Slot& slot = *slots_[micro % slots_.size()];
  if (!last_stage_) ZS_RETURN_IF_ERROR(WaitPipeline(slot.dy_recv));
  const internal::ForwardState& state = slot.state;
  const internal::BlockGradients grads = internal::BlockGradientsIn(grads_.data(), inner_, h);
  const float* dy = slot.dy.data();
  float* dx = work_a_.data();
  float* spare = work_b_.data();
  ZS_RETURN_IF_ERROR(internal::BackwardUnits(
      engine_, num_units_,
      [&](int u, const UnitView& params) -> absl::Status {
        // Block 0 of the model needs no input gradient; every other block
        // does (the first block of a later stage sends it upstream).
        const bool need_dx = first_unit_ + u > 0;
        ZS_ASSIGN_OR_RETURN(const internal::BlockWeights w,
                            internal::BlockWeightsAsFp32(params, first_unit_ + u, param_sizes_,
                                                         kWho, weight_copy_.data()));
        internal::BlockBackwardPartial(w, batch, h, inner_, state.inputs[u].data(),
                                       state.pre[u].data(), state.act[u].data(), dy,
                                       scratch_.data(), need_dx ? dx : nullptr, grads);
        if (need_dx) {
          ZS_RETURN_IF_ERROR(TensorParallelSum(dx));  // f's backward: sum of dx partials
          internal::BlockBackwardFinish(dy, batch, h, dx);
        }
        dy = dx;
        std::swap(dx, spare);
        return absl::OkStatus();
      },
      [&](int u, const UnitView& grad_view) {
        return internal::WriteUnitFromFp32(grads_.data(), grad_view, first_unit_ + u, param_sizes_,
                                           kWho);
      }));
  if (!first_stage_) {
    ZS_RETURN_IF_ERROR(WaitPipeline(slot.dx_send));
    std::copy(dy, dy + batch * h, slot.dx_sent.begin());
    slot.dx_send = grid_.pp().Send(slot.dx_sent.data(), batch * h, DType::kFloat32,
                                   grid_.coord().pp - 1, kGradientTag);
  }
  ++backwards_done_;
  return absl::OkStatus();
}

absl::StatusOr<double> GridMlpTrainer::TrainStep() {
  const float loss_scale = static_cast<float>(engine_.loss_scale());
  forward_recvs_ = 0;
  backward_recvs_ = 0;
  backwards_done_ = 0;
  double local_loss_sum = 0.0;
  IssueRecvs();
  for (const PipelineOp& op : schedule_) {
    if (op.kind == PipelineOpKind::kForward) {
      ZS_RETURN_IF_ERROR(Forward(op.micro, loss_scale, &local_loss_sum));
    } else {
      ZS_RETURN_IF_ERROR(Backward(op.micro));
    }
    IssueRecvs();
  }
  // The last sends read buffers the next step writes.
  for (auto& slot : slots_) {
    ZS_RETURN_IF_ERROR(WaitPipeline(slot->output_send));
    ZS_RETURN_IF_ERROR(WaitPipeline(slot->dx_send));
  }
  ZS_ASSIGN_OR_RETURN(last_step_, engine_.Step());
  // Only one rank per (dp, last stage) counts its losses (tp ranks hold the
  // same ones); the others add zeros, which leave the rank-order sum exact.
  const bool counts = last_stage_ && grid_.coord().tp == 0;
  const double mine = counts ? local_loss_sum : 0.0;
  double global_loss_sum = 0.0;
  ZS_RETURN_IF_ERROR(grid_.world().AllReduceSync(&mine, &global_loss_sum, 1, DType::kFloat64));
  return global_loss_sum / (static_cast<double>(grid_.shape().dp) * micro_batches_);
}

}  // namespace mlp
}  // namespace zeroshard
