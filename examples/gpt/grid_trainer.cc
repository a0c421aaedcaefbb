// GridGptTrainer: one rank of a dp x tp x pp run of the GPT example.
#include "examples/gpt/grid_trainer.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "examples/common/cpu_blas.h"
#include "examples/gpt/internal/tensor_parallel_block.h"
#include "examples/mlp/internal/steady_clock.h"
#include "examples/mlp/internal/unit_loop.h"
#include "examples/mlp/internal/view_convert.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace {

// Point-to-point tags on grid.pp(): activations downstream, their gradients
// upstream, the head's gradient from the last stage to the first, the
// updated wte back, and TieHolds' copy (matched in issue order per tag).
constexpr uint64_t kActivationTag = 1;
constexpr uint64_t kGradientTag = 2;
constexpr uint64_t kTieGradientTag = 3;
constexpr uint64_t kTieWeightTag = 4;
constexpr uint64_t kTieCheckTag = 5;

constexpr char kWho[] = "GridGptTrainer";
constexpr int kTieBuffers = 2;

using mlp::internal::UnitParamsAsFp32;
using mlp::internal::WriteUnitFromFp32;

// The tp split of block param `p` in the spec (HF Conv1D weights are
// [in, out]): column-parallel splits the output dimension, row-parallel
// the input one. c_attn's split is by heads within q, k and v
// (SliceBlockParam), not one contiguous run.
int BlockSplitDim(int p) {
  switch (p) {
    case internal::kAttnWeight:
    case internal::kFcWeight:
      return 1;
    case internal::kAttnBias:
    case internal::kFcBias:
    case internal::kProjWeight:
    case internal::kFcProjWeight:
      return 0;
    default:
      return -1;
  }
}

// wte's rows [shard.begin, shard.begin + shard.size) of the padded matrix.
std::vector<float> VocabRows(const std::vector<float>& wte, int64_t width,
                             const internal::VocabShard& shard) {
  std::vector<float> rows(static_cast<size_t>(shard.size * width), 0.0f);
  std::copy(wte.begin() + shard.begin * width, wte.begin() + (shard.begin + shard.valid) * width,
            rows.begin());
  return rows;
}

}  // namespace

ModelSpec BuildGptGridModelSpec(const GptConfig& cfg, const GridShape& shape) {
  ModelSpec spec = BuildGptModelSpec(cfg);
  const int64_t padded = internal::PaddedVocab(cfg.vocab, shape.tp);
  ParamSpec& wte = spec.units[cfg.embed_unit()].params[0];
  wte.shape[0] = padded;
  wte.tp_split_dim = 0;
  for (int64_t i = 0; i < cfg.layers; ++i) {
    std::vector<ParamSpec>& params = spec.units[cfg.block_unit(i)].params;
    for (int p = 0; p < static_cast<int>(params.size()); ++p)
      params[p].tp_split_dim = BlockSplitDim(p);
  }
  ParamSpec& head = spec.units[cfg.head_unit()].params[0];
  head.shape[0] = padded;
  head.tp_split_dim = 0;
  if (shape.pp > 1) {
    // The first stage trains wte; the last holds a replica of it.
    head.tied_to = std::nullopt;
    head.trainable = false;
  }
  return spec;
}

namespace {

// The first stage [first, last) of `stages` without a trainable param, or -1.
int StageWithNothingToTrain(const ModelSpec& spec, const std::vector<std::pair<int, int>>& stages) {
  for (size_t s = 0; s < stages.size(); ++s) {
    bool trains = false;
    for (int u = stages[s].first; u < stages[s].second; ++u) {
      for (const ParamSpec& p : spec.units[u].params) trains |= p.trainable;
    }
    if (!trains) return static_cast<int>(s);
  }
  return -1;
}

}  // namespace

absl::StatusOr<std::vector<std::pair<int, int>>> GptStageUnits(const GptConfig& cfg,
                                                               const GridShape& shape) {
  const ModelSpec spec = BuildGptGridModelSpec(cfg, shape);
  ZS_ASSIGN_OR_RETURN(auto stages, PipelineStageUnits(spec, shape.pp));
  const int idle = StageWithNothingToTrain(spec, stages);
  if (idle < 0) return stages;
  // Every stage trains something: the most stages this model splits into so.
  int most = 1;
  for (int pp = shape.pp - 1; pp > 1; --pp) {
    GridShape fewer = shape;
    fewer.pp = pp;
    const ModelSpec fewer_spec = BuildGptGridModelSpec(cfg, fewer);
    absl::StatusOr<std::vector<std::pair<int, int>>> split = PipelineStageUnits(fewer_spec, pp);
    if (split.ok() && StageWithNothingToTrain(fewer_spec, *split) < 0) {
      most = pp;
      break;
    }
  }
  std::vector<std::string> names;
  for (int u = stages[idle].first; u < stages[idle].second; ++u) {
    names.push_back(spec.units[u].name);
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "--pp %d: pipeline stage %d would hold only %s, which has nothing to train (the head is a "
      "frozen replica of wte on the last stage); this %d-layer GPT splits into at most %d "
      "stages: give --pp %d or fewer",
      shape.pp, idle, absl::StrJoin(names, ", "), cfg.layers, most, most));
}

absl::StatusOr<ModelSpec> BuildGptShardModelSpec(const GptConfig& cfg, const GridShape& shape,
                                                 const GridCoord& coord) {
  ZS_RETURN_IF_ERROR(internal::CheckTensorParallelDims(Dims(cfg, 1, 1), shape.tp));
  // Every stage trains something (else a --pp problem, said as one).
  ZS_RETURN_IF_ERROR(GptStageUnits(cfg, shape).status());
  ZS_ASSIGN_OR_RETURN(ModelSpec shard, ShardModelSpec(BuildGptGridModelSpec(cfg, shape), shape.tp,
                                                      coord.tp, shape.pp, coord.pp));
  if (shape.pp > 1 && coord.pp == 0) {
    // The head's use of wte, whose gradient the last stage sends.
    UnitSpec alias;
    alias.name = "lm_head";
    ParamSpec w = shard.units[0].params[0];
    w.name = "lm_head.weight";
    w.tied_to = ParamRef{"embed", "wte.weight"};
    alias.params.push_back(std::move(w));
    shard.units.push_back(std::move(alias));
  }
  ZS_RETURN_IF_ERROR(shard.Validate());
  return shard;
}

std::vector<std::vector<ParamOrigin>> GptParamOrigins(const ModelSpec& shard,
                                                      const GridShape& shape,
                                                      const GridCoord& coord) {
  std::vector<std::vector<ParamOrigin>> origins;
  for (const UnitSpec& unit : shard.units) {
    std::vector<ParamOrigin> params;
    for (size_t p = 0; p < unit.params.size(); ++p) {
      ParamOrigin o;
      o.unit = unit.name;
      o.param = unit.params[p].name;
      o.parts = shape.tp;
      o.part = coord.tp;
      const bool block = unit.name.rfind("h.", 0) == 0;
      if (!block) {
        // wte and the head: rows; wpe, ln_f: whole.
        o.split_dim = unit.params[p].tp_split_dim;
      } else {
        o.split_dim = BlockSplitDim(static_cast<int>(p));
        if (p == internal::kAttnWeight || p == internal::kAttnBias) o.groups = 3;
      }
      if (o.split_dim < 0) o.parts = 1, o.part = 0;
      params.push_back(o);
    }
    origins.push_back(std::move(params));
  }
  return origins;
}

absl::Status InitGptShardParams(Engine& engine, const GptConfig& cfg, const ProcessGrid& grid,
                                uint64_t seed) {
  return SetGptShardParams(engine, cfg, grid, [&cfg, seed](int unit, int param) {
    return InitialParam(cfg, unit, param, seed);
  });
}

absl::Status SetGptShardParams(
    Engine& engine, const GptConfig& cfg, const ProcessGrid& grid,
    const std::function<std::vector<float>(int unit, int param)>& whole_value) {
  const GridShape& shape = grid.shape();
  ZS_ASSIGN_OR_RETURN(const auto stages, GptStageUnits(cfg, shape));
  const auto [first, last] = stages[grid.coord().pp];
  const ModelSpec& model = engine.model();
  const int extra = shape.pp > 1 && grid.coord().pp == 0 ? 1 : 0;
  if (static_cast<int>(model.units.size()) != last - first + extra) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SetGptShardParams: the engine's model has %d units, stage %d of %s holds %d; create "
        "the engine with BuildGptShardModelSpec(cfg, grid.shape(), grid.coord())",
        model.units.size(), grid.coord().pp, shape.ToString(), last - first + extra));
  }
  const internal::GptDims d = Dims(cfg, 1, 1);
  ZS_ASSIGN_OR_RETURN(const internal::VocabShard vocab,
                      internal::VocabShardOf(cfg.vocab, shape.tp, grid.coord().tp));
  for (int u = first; u < last; ++u) {
    const UnitSpec& unit = model.units[u - first];
    for (int p = 0; p < static_cast<int>(unit.params.size()); ++p) {
      if (unit.params[p].tied_to.has_value()) continue;  // set through its owner
      std::vector<float> values;
      if (u == cfg.embed_unit() && p == 0) {
        values = VocabRows(whole_value(u, p), cfg.width, vocab);
      } else if (u == cfg.head_unit()) {
        // The replica of wte (pp > 1).
        values = VocabRows(whole_value(cfg.embed_unit(), 0), cfg.width, vocab);
      } else if (u >= cfg.block_unit(0) && u < cfg.final_norm_unit()) {
        const std::vector<float> full = whole_value(u, p);
        values = internal::SliceBlockParam(static_cast<internal::BlockParam>(p), d, shape.tp,
                                           grid.coord().tp, full.data());
      } else {
        values = whole_value(u, p);
      }
      ZS_RETURN_IF_ERROR(engine.SetParam(u - first, p, values));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> GatherGptGridParams(Engine& engine,
                                                                    const GptConfig& cfg,
                                                                    ProcessGrid& grid) {
  const GridShape& shape = grid.shape();
  ZS_ASSIGN_OR_RETURN(const auto stages, GptStageUnits(cfg, shape));
  const ModelSpec full = BuildGptModelSpec(cfg);
  const internal::GptDims d = Dims(cfg, 1, 1);
  std::vector<std::vector<float>> params;
  for (int s = 0; s < shape.pp; ++s) {
    for (int u = stages[s].first; u < stages[s].second; ++u) {
      if (u == cfg.head_unit()) continue;  // wte
      for (int p = 0; p < static_cast<int>(full.units[u].params.size()); ++p) {
        std::vector<float> values(static_cast<size_t>(full.units[u].params[p].NumElements()));
        if (grid.coord().pp == s) {
          ZS_ASSIGN_OR_RETURN(std::vector<float> share, engine.GetParam(u - stages[s].first, p));
          if (shape.tp > 1) {
            std::vector<float> all(share.size() * shape.tp);
            ZS_RETURN_IF_ERROR(grid.tp().AllGatherSync(
                share.data(), all.data(), static_cast<int64_t>(share.size()), DType::kFloat32));
            const bool block = u >= cfg.block_unit(0) && u < cfg.final_norm_unit();
            if (block) {
              std::vector<std::vector<float>> shares;
              for (int r = 0; r < shape.tp; ++r) {
                shares.emplace_back(all.begin() + r * share.size(),
                                    all.begin() + (r + 1) * share.size());
              }
              share = internal::JoinBlockParam(static_cast<internal::BlockParam>(p), d, shape.tp,
                                               shares);
            } else if (u == cfg.embed_unit() && p == 0) {
              share = std::move(all);  // the padded rows in rank order
            } else {
              share.assign(all.begin(), all.begin() + share.size());  // replicated
            }
          }
          // wte: the V token rows (the padding's follow them).
          std::copy(share.begin(), share.begin() + values.size(), values.begin());
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

// One micro-batch in flight on this stage: its tokens and targets, each
// unit's output (outs[0] the stage's input), the units' saved state (a
// block's activations, the final norm's moments, the head's logits and
// then their gradient), the gradient received from the next stage and the
// one sent to the previous, and the handles of the transfers.
struct GridGptTrainer::Slot {
  int micro = -1;
  double loss = 0.0;
  std::vector<int32_t> tokens;  // [2N]: inputs, then targets
  std::vector<std::vector<float>> outs;
  std::vector<std::vector<float>> saved;
  std::vector<float> dy;
  std::vector<float> dx_sent;
  CommHandle input_recv;
  CommHandle dy_recv;
  CommHandle output_send;
  CommHandle dx_send;
};

GridGptTrainer::GridGptTrainer(const GptConfig& cfg, const GptRunOptions& run, Engine& engine,
                               ProcessGrid& grid, const WindowSampler* train, int first_unit,
                               int num_units)
    : cfg_(cfg),
      run_(run),
      d_(Dims(cfg, run.micro_batch, run.seq)),
      engine_(engine),
      grid_(grid),
      train_(train),
      first_unit_(first_unit),
      num_units_(num_units),
      micro_batches_(engine.train().grad_accum_steps),
      tp_(grid.shape().tp),
      first_stage_(grid.coord().pp == 0),
      last_stage_(grid.coord().pp == grid.shape().pp - 1),
      tie_across_(grid.shape().pp > 1),
      schedule_(mlp::OneFOneBSchedule(grid.shape().pp, grid.coord().pp,
                                      engine.train().grad_accum_steps)) {}

GridGptTrainer::~GridGptTrainer() = default;

absl::StatusOr<std::unique_ptr<GridGptTrainer>> GridGptTrainer::Create(const GptConfig& cfg,
                                                                       const GptRunOptions& run,
                                                                       Engine& engine,
                                                                       ProcessGrid& grid,
                                                                       const WindowSampler* train) {
  if (run.seq < 1 || run.seq > cfg.positions || run.micro_batch < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: micro-batch %d, sequence length %d; give a micro-batch >= 1 and a sequence length "
        "in [1, n_positions = %d]",
        kWho, run.micro_batch, run.seq, cfg.positions));
  }
  ZS_ASSIGN_OR_RETURN(const ModelSpec shard,
                      BuildGptShardModelSpec(cfg, grid.shape(), grid.coord()));
  const ModelSpec& model = engine.model();
  bool same = model.units.size() == shard.units.size();
  for (size_t u = 0; same && u < shard.units.size(); ++u) {
    same = model.units[u].name == shard.units[u].name &&
           model.units[u].params.size() == shard.units[u].params.size();
    for (size_t p = 0; same && p < shard.units[u].params.size(); ++p) {
      const ParamSpec& a = model.units[u].params[p];
      const ParamSpec& b = shard.units[u].params[p];
      same = a.shape == b.shape && a.trainable == b.trainable &&
             a.tied_to.has_value() == b.tied_to.has_value();
    }
  }
  if (!same) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the engine's model is not the shard of grid position (tp %d, pp %d) of %s; create "
        "the engine with BuildGptShardModelSpec(cfg, grid.shape(), grid.coord())",
        kWho, grid.coord().tp, grid.coord().pp, grid.shape().ToString()));
  }
  ZS_ASSIGN_OR_RETURN(const auto stages, GptStageUnits(cfg, grid.shape()));
  const auto [first, last] = stages[grid.coord().pp];
  examples::SetUpCpuBlas();
  std::unique_ptr<GridGptTrainer> t(
      new GridGptTrainer(cfg, run, engine, grid, train, first, last - first));
  ZS_ASSIGN_OR_RETURN(t->vocab_,
                      internal::VocabShardOf(cfg.vocab, grid.shape().tp, grid.coord().tp));
  ZS_RETURN_IF_ERROR(t->Allocate());
  return t;
}

float* GridGptTrainer::BlockActsOf(Slot& slot, int local) {
  return run_.recompute ? recompute_acts_.data() : slot.saved[local].data();
}

GridGptTrainer::Kind GridGptTrainer::KindOf(int local) const {
  const int u = first_unit_ + local;
  if (u == cfg_.embed_unit()) return Kind::kEmbed;
  if (u == cfg_.final_norm_unit()) return Kind::kFinalNorm;
  if (u == cfg_.head_unit()) return Kind::kHead;
  return Kind::kBlock;
}

absl::Status GridGptTrainer::Allocate() {
  const int64_t n = d_.rows(), c = d_.width;
  int64_t max_unit = 0;
  size_t max_params = 0;
  for (const UnitSpec& unit : engine_.model().units) {
    std::vector<int64_t> sizes;
    int64_t all = 0;
    for (const ParamSpec& p : unit.params) {
      sizes.push_back(p.NumElements());
      all += p.NumElements();
    }
    max_unit = std::max(max_unit, all);
    max_params = std::max(max_params, sizes.size());
    unit_sizes_.push_back(std::move(sizes));
  }
  param_ptrs_.assign(max_params, nullptr);
  grad_ptrs_.assign(max_params, nullptr);
  if (engine_.train().precision != Precision::kFp32) param_copy_.resize(max_unit);
  grads_.resize(max_unit);
  scratch_.resize(
      std::max(internal::BlockScratchFloats(d_), internal::TensorParallelScratchFloats(d_, tp_)));
  grad_a_.resize(n * c);
  grad_b_.resize(n * c);
  if (run_.recompute) recompute_acts_.resize(internal::BlockActsFloats(d_, tp_));
  // 1F1B keeps at most pp - stage micro-batches in flight on this stage and
  // runs the backwards in micro-batch order: micro-batch m takes slot
  // m % slots once m - slots has finished its backward.
  const int slots = std::min(micro_batches_, grid_.shape().pp - grid_.coord().pp);
  for (int i = 0; i < slots; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->tokens.resize(2 * n);
    slot->outs.assign(num_units_ + 1, std::vector<float>(n * c));
    slot->saved.resize(num_units_);
    for (int k = 0; k < num_units_; ++k) {
      switch (KindOf(k)) {
        case Kind::kBlock:
          // With recompute the block's activations live in recompute_acts_
          // from its forward (again) to its backward.
          if (!run_.recompute) slot->saved[k].resize(internal::BlockActsFloats(d_, tp_));
          break;
        case Kind::kFinalNorm:
          slot->saved[k].resize(2 * n);
          break;
        case Kind::kHead:
          slot->saved[k].resize(n * vocab_.size);
          break;
        case Kind::kEmbed:
          break;
      }
    }
    slot->dy.resize(n * c);
    slot->dx_sent.resize(n * c);
    slots_.push_back(std::move(slot));
  }
  if (tie_across_ && (first_stage_ || last_stage_)) {
    tie_bufs_.assign(kTieBuffers, std::vector<float>(vocab_.size * c));
    tie_handles_.resize(kTieBuffers);
  }
  return absl::OkStatus();
}

absl::StatusOr<const float* const*> GridGptTrainer::ParamsAsFp32(int local, const UnitView& view) {
  ZS_RETURN_IF_ERROR(UnitParamsAsFp32(view, local, unit_sizes_[local], kWho, param_copy_.data(),
                                      param_ptrs_.data()));
  return param_ptrs_.data();
}

absl::Status GridGptTrainer::WaitPipeline(CommHandle& handle) {
  if (!handle.valid()) return absl::OkStatus();
  const absl::Duration start = mlp::internal::SteadyNow();
  absl::Status status = handle.Wait();
  engine_.RecordPipelineWait(mlp::internal::SteadyNow() - start);
  handle = CommHandle();
  return status;
}

void GridGptTrainer::IssueRecvs() {
  const int64_t count = d_.rows() * d_.width;
  const int slots = static_cast<int>(slots_.size());
  const int stage = grid_.coord().pp;
  // A slot's buffers are free once its previous micro-batch finished its
  // backward; issuing the Recv then lets the neighbour's message land while
  // this stage computes.
  if (!first_stage_) {
    for (; forward_recvs_ < micro_batches_ && forward_recvs_ < backwards_done_ + slots;
         ++forward_recvs_) {
      Slot& slot = *slots_[forward_recvs_ % slots];
      slot.input_recv =
          grid_.pp().Recv(slot.outs[0].data(), count, DType::kFloat32, stage - 1, kActivationTag);
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
  if (tie_across_ && first_stage_) {
    // The head's gradient of micro-batch m lands in buffer m % 2, free once
    // the backward of m - 2 handed it to the engine.
    for (; tie_recvs_ < micro_batches_ && tie_recvs_ < backwards_done_ + kTieBuffers;
         ++tie_recvs_) {
      std::vector<float>& buf = tie_bufs_[tie_recvs_ % kTieBuffers];
      tie_handles_[tie_recvs_ % kTieBuffers] =
          grid_.pp().Recv(buf.data(), static_cast<int64_t>(buf.size()), DType::kFloat32,
                          grid_.shape().pp - 1, kTieGradientTag);
    }
  }
}

absl::Status GridGptTrainer::ForwardUnit(Slot& slot, int k, const float* const* p) {
  const int64_t n = d_.rows(), c = d_.width;
  const float* in = slot.outs[k].data();
  float* out = slot.outs[k + 1].data();
  const int32_t* tokens = slot.tokens.data();
  switch (KindOf(k)) {
    case Kind::kEmbed:
      if (tp_ == 1) {
        internal::EmbedForward(p[0], p[1], tokens, d_, out);
        return absl::OkStatus();
      }
      return internal::VocabParallelEmbedForward(p[0], p[1], tokens, d_, vocab_, grid_.tp(), out);
    case Kind::kBlock: {
      const internal::BlockActs acts = internal::BlockActsView(d_, BlockActsOf(slot, k), tp_);
      if (tp_ == 1) {
        internal::BlockForward(p, d_, in, acts, out, scratch_.data());
        return absl::OkStatus();
      }
      return internal::TensorParallelBlockForward(p, d_, in, acts, out, grid_.tp());
    }
    case Kind::kFinalNorm:
      internal::LayerNormForward(in, p[0], p[1], n, c, d_.eps, out, slot.saved[k].data(),
                                 slot.saved[k].data() + n);
      return absl::OkStatus();
    case Kind::kHead: {
      float* logits = slot.saved[k].data();
      const float seed = static_cast<float>(engine_.loss_scale());
      const int32_t* targets = tokens + n;
      if (tp_ == 1) {
        internal::HeadForward(p[0], in, d_, logits);
        if (logits_only_) return absl::OkStatus();
        slot.loss = internal::CrossEntropy(logits, targets, d_, seed);
        return absl::OkStatus();
      }
      internal::VocabParallelHeadForward(p[0], in, d_, vocab_, logits);
      if (logits_only_) return absl::OkStatus();
      ZS_ASSIGN_OR_RETURN(slot.loss, internal::VocabParallelCrossEntropy(logits, targets, d_,
                                                                         vocab_, seed, grid_.tp()));
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status GridGptTrainer::Forward(int micro, double* loss_sum) {
  Slot& slot = *slots_[micro % slots_.size()];
  // The slot's output may still be on its way to the next stage.
  ZS_RETURN_IF_ERROR(WaitPipeline(slot.output_send));
  slot.micro = micro;
  if (first_stage_ || last_stage_) {
    const int64_t n = d_.rows();
    const int64_t first =
        FirstWindow(consumed_, grid_.coord().dp, micro, micro_batches_, run_.micro_batch);
    train_->Fill(first, run_.micro_batch, slot.tokens.data(), slot.tokens.data() + n);
  }
  if (!first_stage_) ZS_RETURN_IF_ERROR(WaitPipeline(slot.input_recv));
  ZS_RETURN_IF_ERROR(mlp::internal::ForwardUnits(
      engine_, num_units_, [&](int k, const UnitView& view) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(const float* const* p, ParamsAsFp32(k, view));
        return ForwardUnit(slot, k, p);
      }));
  if (!last_stage_) {
    slot.output_send = grid_.pp().Send(slot.outs[num_units_].data(), d_.rows() * d_.width,
                                       DType::kFloat32, grid_.coord().pp + 1, kActivationTag);
    return absl::OkStatus();
  }
  *loss_sum += slot.loss;
  return absl::OkStatus();
}

absl::Status GridGptTrainer::BackwardUnit(Slot& slot, int k, const float* const* p, float** dy,
                                          float** dx) {
  const int64_t n = d_.rows(), c = d_.width;
  const float* in = slot.outs[k].data();
  float* g = grads_.data();
  int64_t offset = 0;
  for (size_t i = 0; i < unit_sizes_[k].size(); ++i) {
    grad_ptrs_[i] = g + offset;
    offset += unit_sizes_[k][i];
  }
  switch (KindOf(k)) {
    case Kind::kHead: {
      float* dwte = grad_ptrs_[0];
      CommHandle* send = nullptr;
      if (tie_across_) {
        // The head's gradient goes to the first stage, which trains wte.
        const int b = slot.micro % kTieBuffers;
        send = &tie_handles_[b];
        ZS_RETURN_IF_ERROR(WaitPipeline(*send));
        dwte = tie_bufs_[b].data();
      }
      // dlogits (in saved[k]) -> the head's use of wte, and dL/d(input) in *dx.
      if (tp_ == 1) {
        internal::HeadBackward(p[0], in, slot.saved[k].data(), d_, dwte, *dx);
      } else {
        ZS_RETURN_IF_ERROR(internal::VocabParallelHeadBackward(p[0], in, slot.saved[k].data(), d_,
                                                               vocab_, grid_.tp(), dwte, *dx));
      }
      if (send != nullptr) {
        *send = grid_.pp().Send(dwte, vocab_.size * c, DType::kFloat32, 0, kTieGradientTag);
      }
      break;
    }
    case Kind::kFinalNorm:
      internal::LayerNormBackward(in, p[0], slot.saved[k].data(), slot.saved[k].data() + n, *dy, n,
                                  c, *dx, grad_ptrs_[0], grad_ptrs_[1]);
      break;
    case Kind::kBlock: {
      if (run_.recompute) {
        // The block's forward again from its kept input (the same bits; its
        // output, rewritten, is read by no later backward).
        ZS_RETURN_IF_ERROR(ForwardUnit(slot, k, p));
      }
      const internal::BlockActs acts = internal::BlockActsView(d_, BlockActsOf(slot, k), tp_);
      if (tp_ == 1) {
        internal::BlockBackward(p, d_, in, acts, *dy, *dx, grad_ptrs_.data(), scratch_.data());
      } else {
        ZS_RETURN_IF_ERROR(internal::TensorParallelBlockBackward(
            p, d_, in, acts, *dy, *dx, grad_ptrs_.data(), scratch_.data(), grid_.tp()));
      }
      break;
    }
    case Kind::kEmbed:
      if (tp_ == 1) {
        internal::EmbedBackward(slot.tokens.data(), *dy, d_, grad_ptrs_[0], grad_ptrs_[1]);
      } else {
        internal::VocabParallelEmbedBackward(slot.tokens.data(), *dy, d_, vocab_, grad_ptrs_[0],
                                             grad_ptrs_[1]);
      }
      return absl::OkStatus();  // the model's input has no gradient
  }
  // The unit's input gradient is the next unit's output gradient.
  *dy = *dx;
  *dx = *dy == grad_a_.data() ? grad_b_.data() : grad_a_.data();
  return absl::OkStatus();
}

absl::Status GridGptTrainer::HandTieGradient(int micro) {
  // The head's use first, as one rank's backward reduces it before the
  // embedding's: the engine adds the two uses in call order.
  const int b = micro % kTieBuffers;
  ZS_RETURN_IF_ERROR(WaitPipeline(tie_handles_[b]));
  const int alias = num_units_;
  ZS_ASSIGN_OR_RETURN(const UnitView view, engine_.GradView(alias));
  ZS_RETURN_IF_ERROR(WriteUnitFromFp32(tie_bufs_[b].data(), view, alias, unit_sizes_[alias], kWho));
  return engine_.ReduceGrads(alias);
}

absl::Status GridGptTrainer::Backward(int micro) {
  Slot& slot = *slots_[micro % slots_.size()];
  if (!last_stage_) ZS_RETURN_IF_ERROR(WaitPipeline(slot.dy_recv));
  // Recompute rewrites the stage's output (the same bits): its send must
  // be done reading it (it is: the next stage's backward needed it).
  if (run_.recompute) ZS_RETURN_IF_ERROR(WaitPipeline(slot.output_send));
  if (tie_across_ && first_stage_) ZS_RETURN_IF_ERROR(HandTieGradient(micro));
  float* dy = slot.dy.data();
  float* dx = grad_a_.data();
  const bool head_replica = tie_across_ && last_stage_;
  ZS_RETURN_IF_ERROR(mlp::internal::BackwardUnits(
      engine_, num_units_, [&](int k) { return !(head_replica && KindOf(k) == Kind::kHead); },
      [&](int k, const UnitView& view) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(const float* const* p, ParamsAsFp32(k, view));
        return BackwardUnit(slot, k, p, &dy, &dx);
      },
      [&](int k, const UnitView& grad_view) {
        return WriteUnitFromFp32(grads_.data(), grad_view, k, unit_sizes_[k], kWho);
      }));
  if (!first_stage_) {
    ZS_RETURN_IF_ERROR(WaitPipeline(slot.dx_send));
    std::copy(dy, dy + d_.rows() * d_.width, slot.dx_sent.begin());
    slot.dx_send = grid_.pp().Send(slot.dx_sent.data(), d_.rows() * d_.width, DType::kFloat32,
                                   grid_.coord().pp - 1, kGradientTag);
  }
  ++backwards_done_;
  return absl::OkStatus();
}

absl::Status GridGptTrainer::SendUpdatedEmbedding() {
  const int last = grid_.shape().pp - 1;
  if (first_stage_) {
    ZS_ASSIGN_OR_RETURN(std::vector<float> wte, engine_.GetParam(0, 0));
    CommHandle send = grid_.pp().Send(wte.data(), static_cast<int64_t>(wte.size()), DType::kFloat32,
                                      last, kTieWeightTag);
    return WaitPipeline(send);
  }
  if (last_stage_) {
    std::vector<float>& buf = tie_bufs_[0];
    CommHandle recv = grid_.pp().Recv(buf.data(), static_cast<int64_t>(buf.size()), DType::kFloat32,
                                      0, kTieWeightTag);
    ZS_RETURN_IF_ERROR(WaitPipeline(recv));
    return engine_.SetFrozenParam(num_units_ - 1, 0, buf);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GridGptTrainer::TrainStep() {
  forward_recvs_ = 0;
  backward_recvs_ = 0;
  backwards_done_ = 0;
  tie_recvs_ = 0;
  double local_loss_sum = 0.0;
  IssueRecvs();
  for (const mlp::PipelineOp& op : schedule_) {
    if (op.kind == mlp::PipelineOpKind::kForward) {
      ZS_RETURN_IF_ERROR(Forward(op.micro, &local_loss_sum));
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
  for (CommHandle& h : tie_handles_) ZS_RETURN_IF_ERROR(WaitPipeline(h));
  ZS_ASSIGN_OR_RETURN(last_step_, engine_.Step());
  if (tie_across_) ZS_RETURN_IF_ERROR(SendUpdatedEmbedding());
  consumed_ += WindowsPerStep(grid_.shape().dp, micro_batches_, run_.micro_batch);
  // One rank per (dp, last stage) counts its losses (its tp peers hold the
  // same ones); the others add zeros, which leave the rank-order sum exact.
  const bool counts = last_stage_ && grid_.coord().tp == 0;
  const double mine = counts ? local_loss_sum : 0.0;
  double global = 0.0;
  ZS_RETURN_IF_ERROR(grid_.world().AllReduceSync(&mine, &global, 1, DType::kFloat64));
  return global / (static_cast<double>(grid_.shape().dp) * micro_batches_);
}

absl::StatusOr<double> GridGptTrainer::ValLoss(const std::vector<uint8_t>& val,
                                               int64_t max_windows) {
  const int64_t b = run_.micro_batch, n = d_.rows(), c = d_.width;
  const int world = grid_.shape().world();
  const int64_t available = std::min(max_windows, ValWindows(val, run_.seq));
  const int64_t per_rank = available / (static_cast<int64_t>(world) * b);  // the dp-only run's
  if (per_rank < 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the validation split has %d windows of %d tokens; %d ranks x micro-batch %d need "
        "at least %d (use a larger corpus or a smaller --val-fraction's complement)",
        kWho, ValWindows(val, run_.seq), run_.seq + 1, world, b, int64_t{world} * b));
  }
  // This dp rank's micro-batches: those of the tp x pp ranks of the dp-only
  // run that its position stands for.
  const int64_t micro = per_rank * grid_.shape().tp * grid_.shape().pp;
  Slot& slot = *slots_[0];
  double local = 0.0;
  ZS_RETURN_IF_ERROR(engine_.SetEvalMode(true));
  for (int64_t k = 0; k < micro; ++k) {
    if (first_stage_ || last_stage_) {
      for (int64_t s = 0; s < b; ++s) {
        const int64_t w = (grid_.coord().dp * micro + k) * b + s;
        FillValWindow(val, run_.seq, w, slot.tokens.data() + s * run_.seq,
                      slot.tokens.data() + n + s * run_.seq);
      }
    }
    if (!first_stage_) {
      CommHandle recv = grid_.pp().Recv(slot.outs[0].data(), n * c, DType::kFloat32,
                                        grid_.coord().pp - 1, kActivationTag);
      ZS_RETURN_IF_ERROR(WaitPipeline(recv));
    }
    ZS_RETURN_IF_ERROR(mlp::internal::ForwardUnits(
        engine_, num_units_, [&](int unit, const UnitView& view) -> absl::Status {
          ZS_ASSIGN_OR_RETURN(const float* const* p, ParamsAsFp32(unit, view));
          return ForwardUnit(slot, unit, p);
        }));
    if (!last_stage_) {
      CommHandle send = grid_.pp().Send(slot.outs[num_units_].data(), n * c, DType::kFloat32,
                                        grid_.coord().pp + 1, kActivationTag);
      ZS_RETURN_IF_ERROR(WaitPipeline(send));
    } else {
      local += slot.loss;
    }
  }
  ZS_RETURN_IF_ERROR(engine_.SetEvalMode(false));
  const double mine = last_stage_ && grid_.coord().tp == 0 ? local : 0.0;
  double sum = 0.0;
  ZS_RETURN_IF_ERROR(grid_.world().AllReduceSync(&mine, &sum, 1, DType::kFloat64));
  return sum / static_cast<double>(int64_t{world} * per_rank);
}

absl::StatusOr<std::vector<float>> GridGptTrainer::Logits(const std::vector<int32_t>& tokens) {
  const int64_t n = d_.rows(), c = d_.width, v = cfg_.vocab;
  if (static_cast<int64_t>(tokens.size()) != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: Logits of %d tokens; give micro-batch x seq = %d", kWho, tokens.size(), n));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= v) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: token %d is outside [0, vocab_size = %d)", kWho, t, v));
    }
  }
  Slot& slot = *slots_[0];
  std::copy(tokens.begin(), tokens.end(), slot.tokens.begin());
  std::vector<float> logits(static_cast<size_t>(n * v));
  ZS_RETURN_IF_ERROR(engine_.SetEvalMode(true));
  if (!first_stage_) {
    CommHandle recv = grid_.pp().Recv(slot.outs[0].data(), n * c, DType::kFloat32,
                                      grid_.coord().pp - 1, kActivationTag);
    ZS_RETURN_IF_ERROR(WaitPipeline(recv));
  }
  logits_only_ = true;
  const absl::Status forward = mlp::internal::ForwardUnits(
      engine_, num_units_, [&](int unit, const UnitView& view) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(const float* const* p, ParamsAsFp32(unit, view));
        return ForwardUnit(slot, unit, p);
      });
  logits_only_ = false;
  ZS_RETURN_IF_ERROR(forward);
  ZS_RETURN_IF_ERROR(engine_.SetEvalMode(false));
  if (!last_stage_) {
    CommHandle send = grid_.pp().Send(slot.outs[num_units_].data(), n * c, DType::kFloat32,
                                      grid_.coord().pp + 1, kActivationTag);
    ZS_RETURN_IF_ERROR(WaitPipeline(send));
  } else {
    // Each tp rank's columns [N, V'/tp], gathered and put in vocabulary
    // order (the padding left out).
    const std::vector<float>& mine = slot.saved[num_units_ - 1];
    std::vector<float> all(mine.size() * tp_);
    ZS_RETURN_IF_ERROR(grid_.tp().AllGatherSync(
        mine.data(), all.data(), static_cast<int64_t>(mine.size()), DType::kFloat32));
    for (int r = 0; r < tp_; ++r) {
      ZS_ASSIGN_OR_RETURN(const internal::VocabShard shard, internal::VocabShardOf(v, tp_, r));
      const float* part = all.data() + static_cast<size_t>(r) * mine.size();
      for (int64_t row = 0; row < n; ++row) {
        std::copy(part + row * shard.size, part + row * shard.size + shard.valid,
                  logits.begin() + row * v + shard.begin);
      }
    }
  }
  // From the last stage to every stage.
  if (grid_.shape().pp > 1) {
    ZS_RETURN_IF_ERROR(grid_.pp()
                           .Broadcast(logits.data(), n * v, DType::kFloat32,
                                      /*root=*/grid_.shape().pp - 1)
                           .Wait());
  }
  return logits;
}

absl::Status GridGptTrainer::Save(const std::string& dir, const std::string& trainer_state,
                                  const CheckpointOptions& options) {
  return engine_.SaveSlices(dir, trainer_state, BuildGptModelSpec(cfg_),
                            GptParamOrigins(engine_.model(), grid_.shape(), grid_.coord()),
                            grid_.world(), options);
}

absl::StatusOr<bool> GridGptTrainer::TieHolds() {
  if (!tie_across_) return true;
  // What each stage computes with: its gathered view, as fp32.
  int64_t mismatches = 0;
  auto view_of = [&](int local) -> absl::StatusOr<std::vector<float>> {
    ZS_RETURN_IF_ERROR(engine_.SetEvalMode(true));
    ZS_ASSIGN_OR_RETURN(const UnitView view, engine_.Gather(local));
    ZS_ASSIGN_OR_RETURN(const float* const* p, ParamsAsFp32(local, view));
    std::vector<float> out(p[0], p[0] + unit_sizes_[local][0]);
    ZS_RETURN_IF_ERROR(engine_.Release(local));
    ZS_RETURN_IF_ERROR(engine_.SetEvalMode(false));
    return out;
  };
  const int last = grid_.shape().pp - 1;
  if (first_stage_) {
    ZS_ASSIGN_OR_RETURN(std::vector<float> wte, view_of(0));
    CommHandle send = grid_.pp().Send(wte.data(), static_cast<int64_t>(wte.size()), DType::kFloat32,
                                      last, kTieCheckTag);
    ZS_RETURN_IF_ERROR(send.Wait());
  } else if (last_stage_) {
    ZS_ASSIGN_OR_RETURN(std::vector<float> head, view_of(num_units_ - 1));
    std::vector<float> wte(head.size());
    CommHandle recv = grid_.pp().Recv(wte.data(), static_cast<int64_t>(wte.size()), DType::kFloat32,
                                      0, kTieCheckTag);
    ZS_RETURN_IF_ERROR(recv.Wait());
    for (size_t i = 0; i < head.size(); ++i) {
      mismatches += std::memcmp(&head[i], &wte[i], sizeof(float)) != 0 ? 1 : 0;
    }
  }
  int64_t total = 0;
  ZS_RETURN_IF_ERROR(grid_.world().AllReduceSync(&mismatches, &total, 1, DType::kInt64));
  return total == 0;
}

}  // namespace gpt
}  // namespace zeroshard
