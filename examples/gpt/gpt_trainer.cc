#include "examples/gpt/gpt_trainer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "examples/common/cpu_blas.h"
#include "examples/mlp/internal/unit_loop.h"
#include "examples/mlp/internal/view_convert.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace {

constexpr char kWho[] = "GptTrainer";
using mlp::internal::UnitParamsAsFp32;
using mlp::internal::WriteUnitFromFp32;

}  // namespace

GptTrainer::GptTrainer(const GptConfig& cfg, const GptRunOptions& run, Engine& engine,
                       Communicator& comm, Device& device, const WindowSampler* train)
    : cfg_(cfg),
      run_(run),
      d_(Dims(cfg, run.micro_batch, run.seq)),
      engine_(engine),
      comm_(comm),
      device_(device),
      train_(train) {}

GptTrainer::~GptTrainer() = default;

absl::StatusOr<std::unique_ptr<GptTrainer>> GptTrainer::Create(const GptConfig& cfg,
                                                               const GptRunOptions& run,
                                                               Engine& engine, Communicator& comm,
                                                               Device& device,
                                                               const WindowSampler* train) {
  if (!device.host_accessible()) {
    return absl::UnimplementedError(
        absl::StrFormat("%s: device %s is not host-accessible; the GPT example computes on the "
                        "CPU (run it with a CPU device)",
                        kWho, device.name()));
  }
  if (run.seq < 1 || run.seq > cfg.positions) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: sequence length %d is outside [1, n_positions = %d]; give a --seq in that range", kWho,
        run.seq, cfg.positions));
  }
  if (run.micro_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: micro-batch %d; give at least 1", kWho, run.micro_batch));
  }
  if (engine.model().units.size() != static_cast<size_t>(cfg.num_units())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the engine's model has %d units; BuildGptModelSpec gives %d for this config", kWho,
        engine.model().units.size(), cfg.num_units()));
  }
  // One BLAS thread per rank, on the kernel path chosen for the CPU. The
  // choice ran as the program loaded (cpu_blas.h): referencing it here links
  // it into every program that trains, and this call returns that result.
  examples::SetUpCpuBlas();
  std::unique_ptr<GptTrainer> t(new GptTrainer(cfg, run, engine, comm, device, train));
  ZS_RETURN_IF_ERROR(t->Allocate());
  return t;
}

absl::StatusOr<GptTrainerBytes> GptTrainer::PlanBytes(const GptConfig& cfg,
                                                      const GptRunOptions& run,
                                                      const ModelSpec& model, Precision precision) {
  const internal::GptDims d = Dims(cfg, run.micro_batch, run.seq);
  const int64_t n = d.rows(), c = d.width, l = cfg.layers;
  // The largest terms, in double first: past 2^62 bytes the int64 products
  // below could overflow, and such a run is refused anyway.
  const double nd = static_cast<double>(run.micro_batch) * static_cast<double>(run.seq);
  const double largest =
      4 * (nd * (static_cast<double>(l) + 1) * (15 * static_cast<double>(c) + 4) +
           static_cast<double>(l) * static_cast<double>(run.micro_batch) *
               static_cast<double>(cfg.heads) * static_cast<double>(run.seq) *
               static_cast<double>(run.seq) +
           nd * static_cast<double>(d.vocab));
  if (!(largest < static_cast<double>(int64_t{1} << 62))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: micro-batch %d x seq %d on %d layers of width %d, %d heads, vocab %d: the "
        "activations pass 2^62 bytes",
        kWho, run.micro_batch, run.seq, l, c, cfg.heads, d.vocab));
  }
  int64_t max_unit = 0;
  for (const UnitSpec& unit : model.units) {
    int64_t all = 0;
    for (const ParamSpec& p : unit.params) all += p.NumElements();
    max_unit = std::max(max_unit, all);
  }
  const int64_t kF = sizeof(float);
  const int64_t act_blocks = run.recompute ? std::min<int64_t>(1, l) : l;
  GptTrainerBytes b;
  b.tokens = 2 * n * int64_t{sizeof(int32_t)};
  b.block_inputs = (l + 1) * n * c * kF;
  b.block_acts = act_blocks * internal::BlockActsFloats(d) * kF;
  b.final_norm = (n * c + 2 * n) * kF;
  b.logits = n * d.vocab * kF;
  b.grad_io = 2 * n * c * kF;
  b.block_scratch = internal::BlockScratchFloats(d) * kF;
  b.unit_grads = max_unit * kF;  // every param of the example trains
  b.unit_params = precision != Precision::kFp32 ? max_unit * kF : 0;
  return b;
}

absl::Status GptTrainer::Allocate() {
  size_t max_params = 0;
  for (const UnitSpec& unit : engine_.model().units) {
    std::vector<int64_t> sizes;
    for (const ParamSpec& p : unit.params) sizes.push_back(p.NumElements());
    max_params = std::max(max_params, sizes.size());
    unit_sizes_.push_back(std::move(sizes));
  }
  param_ptrs_.assign(max_params, nullptr);
  grad_ptrs_.assign(max_params, nullptr);
  ZS_ASSIGN_OR_RETURN(const GptTrainerBytes b,
                      PlanBytes(cfg_, run_, engine_.model(), engine_.train().precision));
  auto alloc = [&](DeviceBuffer* buffer, int64_t bytes, MemoryCategory cat, const char* name) {
    ZS_ASSIGN_OR_RETURN(*buffer, device_.Allocate(bytes, cat, name));
    return absl::OkStatus();
  };
  using MC = MemoryCategory;
  ZS_RETURN_IF_ERROR(alloc(&tokens_, b.tokens, MC::kActivations, "gpt.tokens"));
  ZS_RETURN_IF_ERROR(alloc(&inputs_, b.block_inputs, MC::kActivations, "gpt.block_inputs"));
  ZS_RETURN_IF_ERROR(alloc(&acts_, b.block_acts, MC::kActivations, "gpt.block_acts"));
  ZS_RETURN_IF_ERROR(alloc(&final_norm_, b.final_norm, MC::kActivations, "gpt.final_norm"));
  ZS_RETURN_IF_ERROR(alloc(&logits_, b.logits, MC::kActivations, "gpt.logits"));
  ZS_RETURN_IF_ERROR(alloc(&grad_io_, b.grad_io, MC::kWorkspace, "gpt.grad_io"));
  ZS_RETURN_IF_ERROR(alloc(&scratch_, b.block_scratch, MC::kWorkspace, "gpt.block_scratch"));
  ZS_RETURN_IF_ERROR(alloc(&unit_grads_, b.unit_grads, MC::kWorkspace, "gpt.unit_grads"));
  if (b.unit_params > 0) {
    ZS_RETURN_IF_ERROR(alloc(&unit_params_, b.unit_params, MC::kWorkspace, "gpt.unit_params"));
  }
  return absl::OkStatus();
}

float* GptTrainer::acts_base(int64_t block) const {
  const int64_t slot = run_.recompute ? 0 : block;
  return acts_.as<float>() + slot * internal::BlockActsFloats(d_);
}

absl::StatusOr<const float* const*> GptTrainer::ParamsAsFp32(int u, const UnitView& view) {
  ZS_RETURN_IF_ERROR(UnitParamsAsFp32(view, u, unit_sizes_[static_cast<size_t>(u)], kWho,
                                      unit_params_.as<float>(), param_ptrs_.data()));
  return param_ptrs_.data();
}

absl::Status GptTrainer::Forward(int u, const UnitView& view, bool with_loss, double* loss) {
  ZS_ASSIGN_OR_RETURN(const float* const* p, ParamsAsFp32(u, view));
  const int64_t n = d_.rows(), c = d_.width, l = cfg_.layers;
  const int32_t* tokens = tokens_.as<int32_t>();
  float* x = inputs_.as<float>();
  float* lnf = final_norm_.as<float>();
  if (u == cfg_.embed_unit()) {
    internal::EmbedForward(p[0], p[1], tokens, d_, x);
  } else if (u == cfg_.final_norm_unit()) {
    internal::LayerNormForward(x + l * n * c, p[0], p[1], n, c, d_.eps, lnf, lnf + n * c,
                               lnf + n * c + n);
  } else if (u == cfg_.head_unit()) {
    internal::HeadForward(p[0], lnf, d_, logits_.as<float>());
    if (with_loss) {
      *loss = internal::CrossEntropy(logits_.as<float>(), tokens + n, d_,
                                     static_cast<float>(engine_.loss_scale()));
    }
  } else {
    const int64_t i = u - cfg_.block_unit(0);
    const internal::BlockActs acts = internal::BlockActsView(d_, acts_base(i));
    internal::BlockForward(p, d_, x + i * n * c, acts, x + (i + 1) * n * c, scratch_.as<float>());
  }
  return absl::OkStatus();
}

absl::Status GptTrainer::Backward(int u, const UnitView& view) {
  ZS_ASSIGN_OR_RETURN(const float* const* p, ParamsAsFp32(u, view));
  const int64_t n = d_.rows(), c = d_.width, l = cfg_.layers;
  float* x = inputs_.as<float>();
  float* lnf = final_norm_.as<float>();
  // dy: the gradient flowing back into this unit's output; dx: out.
  float* dy = grad_io_.as<float>();
  float* dx = dy + n * c;
  float* g = unit_grads_.as<float>();
  const std::vector<int64_t>& sizes = unit_sizes_[static_cast<size_t>(u)];
  int64_t offset = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    grad_ptrs_[k] = g + offset;
    offset += sizes[k];
  }
  if (u == cfg_.head_unit()) {
    // dlogits (in logits_) -> the head's use of wte, and dL/d ln_f(x) in dy.
    internal::HeadBackward(p[0], lnf, logits_.as<float>(), d_, grad_ptrs_[0], dy);
  } else if (u == cfg_.final_norm_unit()) {
    internal::LayerNormBackward(x + l * n * c, p[0], lnf + n * c, lnf + n * c + n, dy, n, c, dx,
                                grad_ptrs_[0], grad_ptrs_[1]);
    std::swap_ranges(dx, dx + n * c, dy);
  } else if (u == cfg_.embed_unit()) {
    internal::EmbedBackward(tokens_.as<int32_t>(), dy, d_, grad_ptrs_[0], grad_ptrs_[1]);
  } else {
    const int64_t i = u - cfg_.block_unit(0);
    const internal::BlockActs acts = internal::BlockActsView(d_, acts_base(i));
    if (run_.recompute) {
      // The block's forward again, from its kept input; its output x_{i+1}
      // is rewritten with the same bits (only later blocks read it, and
      // their backward is done).
      internal::BlockForward(p, d_, x + i * n * c, acts, x + (i + 1) * n * c, scratch_.as<float>());
    }
    internal::BlockBackward(p, d_, x + i * n * c, acts, dy, dx, grad_ptrs_.data(),
                            scratch_.as<float>());
    std::swap_ranges(dx, dx + n * c, dy);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GptTrainer::MicroBatch(int micro, float /*loss_scale*/) {
  const int64_t b = run_.micro_batch, n = d_.rows();
  const int accum = engine_.train().grad_accum_steps;
  const int64_t first = FirstWindow(consumed_, comm_.rank(), micro, accum, b);
  int32_t* tokens = tokens_.as<int32_t>();
  train_->Fill(first, b, tokens, tokens + n);
  double loss = 0.0;
  const int units = cfg_.num_units();
  ZS_RETURN_IF_ERROR(
      mlp::internal::ForwardUnits(engine_, units, [&](int u, const UnitView& params) {
        return Forward(u, params, /*with_loss=*/true, &loss);
      }));
  ZS_RETURN_IF_ERROR(mlp::internal::BackwardUnits(
      engine_, units, [&](int u, const UnitView& params) { return Backward(u, params); },
      [&](int u, const UnitView& grads) {
        return WriteUnitFromFp32(unit_grads_.as<float>(), grads, u,
                                 unit_sizes_[static_cast<size_t>(u)], kWho);
      }));
  return loss;
}

absl::StatusOr<double> GptTrainer::TrainStep() {
  ZS_ASSIGN_OR_RETURN(
      const double local,
      mlp::internal::AccumulateAndStep(
          engine_, [&](int m, float scale) { return MicroBatch(m, scale); }, &last_step_));
  const int accum = engine_.train().grad_accum_steps;
  consumed_ += WindowsPerStep(comm_.size(), accum, run_.micro_batch);
  double sum = 0.0;
  ZS_RETURN_IF_ERROR(comm_.AllReduceSync(&local, &sum, 1, DType::kFloat64));
  return sum / (static_cast<double>(comm_.size()) * accum);
}

std::vector<std::vector<int32_t>> WindowRows(const WindowSampler& sampler, int64_t first,
                                             int64_t count) {
  const int64_t t = sampler.seq();
  std::vector<int32_t> tokens(static_cast<size_t>(t)), targets(static_cast<size_t>(t));
  std::vector<std::vector<int32_t>> rows;
  for (int64_t w = 0; w < count; ++w) {
    sampler.Fill(first + w, 1, tokens.data(), targets.data());
    std::vector<int32_t> row(tokens);
    row.push_back(targets.back());
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<std::vector<int32_t>> GptTrainer::NextGlobalBatch() const {
  return WindowRows(
      *train_, consumed_,
      WindowsPerStep(comm_.size(), engine_.train().grad_accum_steps, run_.micro_batch));
}

absl::StatusOr<double> GptTrainer::ValLoss(const std::vector<uint8_t>& val, int64_t max_windows) {
  const int64_t b = run_.micro_batch, n = d_.rows();
  const int64_t world = comm_.size();
  const int64_t available = std::min(max_windows, ValWindows(val, run_.seq));
  const int64_t batches = available / (world * b);  // per rank
  if (batches < 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the validation split has %d windows of %d tokens; %d ranks x micro-batch %d need "
        "at least %d (use a larger corpus or a smaller --val-fraction's complement)",
        kWho, ValWindows(val, run_.seq), run_.seq + 1, world, b, world * b));
  }
  int32_t* tokens = tokens_.as<int32_t>();
  double local = 0.0;
  // Forward-only gathers, outside the steps' recorded order.
  ZS_RETURN_IF_ERROR(engine_.SetEvalMode(true));
  for (int64_t k = 0; k < batches; ++k) {
    for (int64_t s = 0; s < b; ++s) {
      const int64_t w = (comm_.rank() * batches + k) * b + s;
      FillValWindow(val, run_.seq, w, tokens + s * run_.seq, tokens + n + s * run_.seq);
    }
    double loss = 0.0;
    ZS_RETURN_IF_ERROR(
        mlp::internal::ForwardUnits(engine_, cfg_.num_units(), [&](int u, const UnitView& params) {
          return Forward(u, params, /*with_loss=*/true, &loss);
        }));
    local += loss;
  }
  ZS_RETURN_IF_ERROR(engine_.SetEvalMode(false));
  double sum = 0.0;
  ZS_RETURN_IF_ERROR(comm_.AllReduceSync(&local, &sum, 1, DType::kFloat64));
  return sum / static_cast<double>(world * batches);
}

absl::StatusOr<std::vector<float>> GptTrainer::Logits(const std::vector<int32_t>& tokens) {
  const int64_t n = d_.rows();
  if (static_cast<int64_t>(tokens.size()) != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: Logits of %d tokens; give micro-batch x seq = %d", kWho, tokens.size(), n));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= d_.vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: token %d is outside [0, vocab_size = %d)", kWho, t, d_.vocab));
    }
  }
  std::copy(tokens.begin(), tokens.end(), tokens_.as<int32_t>());
  ZS_RETURN_IF_ERROR(engine_.SetEvalMode(true));
  ZS_RETURN_IF_ERROR(
      mlp::internal::ForwardUnits(engine_, cfg_.num_units(), [&](int u, const UnitView& params) {
        return Forward(u, params, /*with_loss=*/false, nullptr);
      }));
  ZS_RETURN_IF_ERROR(engine_.SetEvalMode(false));
  const float* logits = logits_.as<float>();
  return std::vector<float>(logits, logits + n * d_.vocab);
}

}  // namespace gpt
}  // namespace zeroshard
