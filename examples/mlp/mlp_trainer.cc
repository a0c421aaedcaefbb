// MlpTrainer: one rank's training loop over the engine's public API.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/mlp/data_loader.h"
#include "examples/mlp/internal/lm_math.h"
#include "examples/mlp/internal/lora_math.h"
#include "examples/mlp/internal/unit_loop.h"
#include "examples/mlp/internal/view_convert.h"
#include "examples/mlp/mlp.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

constexpr char kWho[] = "MlpTrainer";

}  // namespace

MlpTrainer::MlpTrainer(const MlpConfig& cfg, Engine& engine, Communicator& comm,
                       const DataLoaderOptions& data)
    : cfg_(cfg), engine_(engine), comm_(comm), spec_(BuildModelSpec(cfg)) {
  // Before the loader's thread makes its first teacher forward.
  internal::UseSingleThreadedBlas();
  loader_ = std::make_unique<MicroBatchLoader>(
      cfg, comm.size(), comm.rank(), engine.train().grad_accum_steps, data.depth, engine.steps());
  const int64_t batch = cfg.micro_batch;
  const int64_t h = cfg.hidden;
  const size_t io = static_cast<size_t>(batch * h);
  if (!cfg.lm()) target_.resize(io);
  dy_.resize(io);
  dx_.resize(io);
  int64_t scratch = batch * internal::InnerSize(h);
  if (cfg.lora()) scratch = std::max(scratch, internal::LoraScratchSize(batch, h, cfg.lora_rank));
  scratch_.resize(static_cast<size_t>(scratch));
  state_.Resize(cfg.blocks, batch, h);
  if (cfg.recompute) {
    // The forward keeps the block inputs only; one block's pre and act are
    // the working set of the forward and of each recompute.
    state_.pre.resize(1);
    state_.act.resize(1);
    recompute_out_.resize(io);
  }
  if (cfg.lm()) {
    tokens_.resize(static_cast<size_t>(batch));
    next_tokens_.resize(static_cast<size_t>(batch));
    logits_.resize(static_cast<size_t>(batch * cfg.vocab));
    dlogits_.resize(logits_.size());
  }
  int64_t max_unit = 0, max_grads = 0;
  for (const UnitSpec& unit : spec_.units) {
    std::vector<int64_t> sizes;
    std::vector<bool> trainable;
    int64_t all = 0, trained = 0;
    for (const ParamSpec& p : unit.params) {
      sizes.push_back(p.NumElements());
      trainable.push_back(p.trainable);
      all += p.NumElements();
      if (p.trainable) trained += p.NumElements();
    }
    unit_sizes_.push_back(std::move(sizes));
    unit_trainable_.push_back(std::move(trainable));
    unit_has_grads_.push_back(trained > 0);
    max_unit = std::max(max_unit, all);
    max_grads = std::max(max_grads, trained);
  }
  grads_.resize(static_cast<size_t>(max_grads));
  weight_copy_.resize(static_cast<size_t>(max_unit));
}

MlpTrainer::~MlpTrainer() = default;

int64_t MlpTrainer::activation_bytes() const {
  int64_t floats = 0;
  for (const auto* list : {&state_.inputs, &state_.pre, &state_.act}) {
    for (const std::vector<float>& v : *list) floats += static_cast<int64_t>(v.size());
  }
  floats += static_cast<int64_t>(recompute_out_.size() + logits_.size() + dlogits_.size());
  return floats * static_cast<int64_t>(sizeof(float));
}

double MlpTrainer::PlannedActivationBytes(const MlpConfig& cfg) {
  const double io = static_cast<double>(cfg.micro_batch) * static_cast<double>(cfg.hidden);
  const double wide = io * 4;  // [micro_batch, InnerSize(hidden)]
  // The constructor's sizes: block inputs (blocks + 1), pre and act of every
  // block (of one with recompute, plus the recomputed output), the logits.
  const double kept_blocks = cfg.recompute ? 1 : cfg.blocks;
  double floats = (cfg.blocks + 1) * io + kept_blocks * 2 * wide + (cfg.recompute ? io : 0);
  if (cfg.lm()) floats += 2 * static_cast<double>(cfg.micro_batch) * static_cast<double>(cfg.vocab);
  return floats * sizeof(float);
}

double MlpTrainer::EstimateBytes(const MlpConfig& cfg, const DataLoaderOptions& data) {
  const double h = static_cast<double>(cfg.hidden);
  const double io = static_cast<double>(cfg.micro_batch) * h;
  const double r = cfg.lora_rank;
  // One block's elements, adapters included; the LM's embedding [V, h].
  const double block = 8 * h * h + 5 * h + (cfg.lora() ? 10 * h * r : 0);
  const double unit = std::max(block, static_cast<double>(cfg.vocab) * h + cfg.vocab);
  const double scratch =
      std::max(4 * io, cfg.lora() ? static_cast<double>(internal::LoraScratchSize(
                                        cfg.micro_batch, cfg.hidden, cfg.lora_rank))
                                  : 0.0);
  // target, dy, dx; scratch; the widened weights and gradients of one unit.
  const double trainer_floats = 3 * io + scratch + 2 * unit;
  // The loader's sampler: the teacher's blocks and their forward state,
  // and (regression) x and y of each queued micro-batch.
  const double teacher_floats = cfg.blocks * (8 * h * h + 5 * h) + (cfg.blocks + 1) * io +
                                cfg.blocks * 8 * io +
                                (cfg.lm() ? static_cast<double>(cfg.vocab) * (h + 1) : 0);
  const double queued_floats = std::max(1, data.depth) * 2 * io;
  return PlannedActivationBytes(cfg) +
         (trainer_floats + teacher_floats + queued_floats) * sizeof(float);
}

absl::Status MlpTrainer::BlockForwardAt(int block, const float* const* p, float* pre, float* act,
                                        float* y) {
  const internal::BlockWeights w{p[kW1], p[kB1], p[kW2], p[kB2]};
  const float* x = state_.inputs[static_cast<size_t>(block)].data();
  if (cfg_.lora()) {
    const internal::LoraWeights lora{p[kLoraA1], p[kLoraB1],     p[kLoraA2],
                                     p[kLoraB2], cfg_.lora_rank, cfg_.LoraScale()};
    internal::LoraBlockForward(w, lora, cfg_.micro_batch, cfg_.hidden, x, pre, act, y,
                               scratch_.data());
  } else {
    internal::BlockForward(w, cfg_.micro_batch, cfg_.hidden, x, pre, act, y);
  }
  return absl::OkStatus();
}

absl::Status MlpTrainer::ForwardUnit(int u, const UnitView& params) {
  const float* p[kNumLoraBlockParams];
  ZS_RETURN_IF_ERROR(internal::UnitParamsAsFp32(params, u, unit_sizes_[static_cast<size_t>(u)],
                                                kWho, weight_copy_.data(), p));
  if (cfg_.lm() && u == EmbedUnit()) {
    internal::EmbedForward(p[kEmbedWeight], tokens_.data(), cfg_.micro_batch, cfg_.hidden,
                           state_.inputs[0].data());
    return absl::OkStatus();
  }
  if (cfg_.lm() && u == HeadUnit(cfg_)) {
    internal::HeadForward(p[kHeadWeight], p[kHeadBias], state_.output().data(), cfg_.micro_batch,
                          cfg_.hidden, cfg_.vocab, logits_.data());
    return absl::OkStatus();
  }
  const int block = u - BlockUnit(cfg_, 0);
  const size_t slot = cfg_.recompute ? 0 : static_cast<size_t>(block);
  return BlockForwardAt(block, p, state_.pre[slot].data(), state_.act[slot].data(),
                        state_.inputs[static_cast<size_t>(block) + 1].data());
}

absl::Status MlpTrainer::BackwardUnit(int u, const UnitView& params) {
  const int64_t batch = cfg_.micro_batch;
  const int64_t h = cfg_.hidden;
  const float* p[kNumLoraBlockParams];
  ZS_RETURN_IF_ERROR(internal::UnitParamsAsFp32(params, u, unit_sizes_[static_cast<size_t>(u)],
                                                kWho, weight_copy_.data(), p));
  float* g = grads_.data();
  const bool trains = unit_has_grads_[static_cast<size_t>(u)];
  if (cfg_.lm() && u == HeadUnit(cfg_)) {
    // The head's use of the tied weight, and its bias; dL/dx into dy_.
    internal::HeadBackward(p[kHeadWeight], state_.output().data(), dlogits_.data(), batch, h,
                           cfg_.vocab, trains ? g : nullptr, trains ? g + cfg_.vocab * h : nullptr,
                           dy_.data());
    return absl::OkStatus();
  }
  if (cfg_.lm() && u == EmbedUnit()) {
    // The embedding's use: scatter-add of dL/dx0 into the tokens' rows.
    if (trains) internal::EmbedBackward(tokens_.data(), dy_.data(), batch, h, cfg_.vocab, g);
    return absl::OkStatus();
  }
  const int block = u - BlockUnit(cfg_, 0);
  const size_t slot = cfg_.recompute ? 0 : static_cast<size_t>(block);
  if (cfg_.recompute) {
    // The same operations on the same input as the forward: the same bits.
    ZS_RETURN_IF_ERROR(BlockForwardAt(block, p, state_.pre[0].data(), state_.act[0].data(),
                                      recompute_out_.data()));
  }
  // dL/dx of the first block is needed only by a trained embedding.
  const bool need_dx = block > 0 || (cfg_.lm() && unit_has_grads_[EmbedUnit()]);
  const float* x = state_.inputs[static_cast<size_t>(block)].data();
  const internal::BlockWeights w{p[kW1], p[kB1], p[kW2], p[kB2]};
  if (cfg_.lora()) {
    const internal::LoraWeights lora{p[kLoraA1], p[kLoraB1],     p[kLoraA2],
                                     p[kLoraB2], cfg_.lora_rank, cfg_.LoraScale()};
    internal::LoraBlockBackward(w, lora, batch, h, x, state_.pre[slot].data(),
                                state_.act[slot].data(), dy_.data(), scratch_.data(),
                                need_dx ? dx_.data() : nullptr,
                                internal::LoraGradientsIn(g, h, cfg_.lora_rank));
  } else {
    internal::BlockBackward(w, batch, h, x, state_.pre[slot].data(), state_.act[slot].data(),
                            dy_.data(), scratch_.data(), need_dx ? dx_.data() : nullptr,
                            internal::BlockGradientsIn(g, internal::InnerSize(h), h));
  }
  std::swap(dy_, dx_);
  return absl::OkStatus();
}

absl::Status MlpTrainer::WriteGrads(int u, const UnitView& grad_view) {
  const UnitSpec& unit = spec_.units[static_cast<size_t>(u)];
  const std::vector<int64_t>& sizes = unit_sizes_[static_cast<size_t>(u)];
  if (grad_view.params.size() != sizes.size()) {
    return absl::InternalError(absl::StrCat(kWho, ": the gradient view of unit ", unit.name,
                                            " has ", grad_view.params.size(), " params, expected ",
                                            sizes.size()));
  }
  size_t offset = 0;
  for (size_t p = 0; p < sizes.size(); ++p) {
    const TensorView& view = grad_view.params[p];
    if (!unit_trainable_[static_cast<size_t>(u)][p]) {
      // A frozen param has no gradient buffer (data == nullptr, numel 0).
      if (view.data != nullptr || view.numel != 0) {
        return absl::InternalError(absl::StrCat(
            kWho, ": the gradient view of frozen param ", unit.name, ".", unit.params[p].name,
            " has a buffer of ", view.numel, " elements; the engine gives a frozen param none"));
      }
      continue;
    }
    if (view.data == nullptr || view.numel != sizes[p]) {
      return absl::InternalError(absl::StrCat(kWho, ": the gradient view of ", unit.name, ".",
                                              unit.params[p].name, " has ", view.numel,
                                              " elements, expected ", sizes[p]));
    }
    // Overwrite, never accumulate: the engine does the summing, in an order
    // that does not depend on the world size.
    ZS_RETURN_IF_ERROR(internal::WriteFromFp32(grads_.data() + offset, view));
    offset += static_cast<size_t>(sizes[p]);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MlpTrainer::MicroBatch(int micro, float loss_scale) {
  const int64_t batch = cfg_.micro_batch;
  if (cfg_.lm()) {
    engine_.RecordInputWait(
        loader_->NextTokens(engine_.steps(), micro, tokens_.data(), next_tokens_.data()));
  } else {
    engine_.RecordInputWait(
        loader_->Next(engine_.steps(), micro, state_.inputs[0].data(), target_.data()));
  }
  // The activations the backward needs stay in state_, the weights do not.
  ZS_RETURN_IF_ERROR(internal::ForwardUnits(
      engine_, NumUnits(cfg_),
      [&](int u, const UnitView& params) { return ForwardUnit(u, params); }));
  double loss = 0.0;
  if (cfg_.lm()) {
    loss = internal::CrossEntropyLoss(logits_.data(), next_tokens_.data(), batch, cfg_.vocab,
                                      dlogits_.data());
    internal::ScaleLossSeed(loss_scale, &dlogits_);
  } else {
    loss =
        internal::MseLoss(state_.output().data(), target_.data(), batch * cfg_.hidden, dy_.data());
    internal::ScaleLossSeed(loss_scale, &dy_);
  }
  ZS_RETURN_IF_ERROR(internal::BackwardUnits(
      engine_, NumUnits(cfg_), [&](int u) { return unit_has_grads_[static_cast<size_t>(u)]; },
      [&](int u, const UnitView& params) { return BackwardUnit(u, params); },
      [&](int u, const UnitView& grad_view) { return WriteGrads(u, grad_view); }));
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
