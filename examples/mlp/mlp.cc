// Model spec, deterministic initialisation and the distributed sampler of the
// residual-MLP example.
#include "examples/mlp/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "examples/common/cpu_blas.h"
#include "examples/common/rng.h"
#include "examples/mlp/internal/lm_math.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace mlp {
namespace {

// Domain separators so params and inputs never share a random stream even
// when their seeds are equal.
constexpr uint64_t kParamDomain = 0x706172616d73ull;  // "params"
constexpr uint64_t kInputDomain = 0x696e70757473ull;  // "inputs"
constexpr uint64_t kTokenDomain = 0x746f6b656e73ull;  // "tokens"
constexpr uint64_t kEmbedDomain = 0x656d626564ull;    // "embed"
constexpr uint64_t kHeadDomain = 0x68656164ull;       // "head"
constexpr uint64_t kLoraDomain = 0x6c6f7261ull;       // "lora"
constexpr double kBiasStd = 0.02;
// Below 2^24 every token id is exact in a float and V x V teacher logits
// stay an int64 count; the teacher's table is made in chunks of this many
// tokens, so its memory does not grow with V^2.
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kTeacherChunk = 256;

const char* const kParamNames[kNumLoraBlockParams] = {"w1",      "b1",      "w2",      "b2",
                                                      "lora_a1", "lora_b1", "lora_a2", "lora_b2"};

std::vector<float> NormalValues(uint64_t key, int64_t numel, double std_dev) {
  std::vector<float> values(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    values[i] = static_cast<float>(std_dev * examples::NormalAt(key, static_cast<uint64_t>(i)));
  }
  return values;
}

// A param by field (aggregate initialization would have to list every
// later field of ParamSpec).
ParamSpec Param(std::string name, std::vector<int64_t> shape, bool no_decay,
                int tp_split_dim = -1) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.no_decay = no_decay;
  p.tp_split_dim = tp_split_dim;
  return p;
}

absl::Status CheckNonNegative(const char* field, double value) {
  if (!(value >= 0.0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpConfig.", field, " must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

float MlpConfig::LoraScale() const {
  if (lora_rank <= 0) return 1.0f;
  const double alpha = lora_alpha > 0.0 ? lora_alpha : static_cast<double>(lora_rank);
  return static_cast<float>(alpha / lora_rank);
}

absl::Status MlpConfig::Validate() const {
  if (hidden <= 0)
    return absl::InvalidArgumentError(absl::StrCat("MlpConfig.hidden must be > 0, got ", hidden));
  if (blocks <= 0)
    return absl::InvalidArgumentError(absl::StrCat("MlpConfig.blocks must be > 0, got ", blocks));
  if (micro_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpConfig.micro_batch must be > 0, got ", micro_batch));
  }
  if (vocab < 0 || vocab >= kMaxVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpConfig.vocab must be in [0, ", kMaxVocab, "), got ", vocab));
  }
  if (lora_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpConfig.lora_rank must be >= 0, got ", lora_rank));
  }
  // The adapted matrices are W1 [4h, h] and W2 [h, 4h]: a product B A of
  // rank above min(in, out) = h adds nothing but memory (B [4h, R] and
  // A [R, 4h] grow with R).
  if (lora_rank > hidden) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpConfig.lora_rank (--lora) ", lora_rank, " exceeds the hidden width ", hidden,
        ": the adapted W1 [", internal::InnerSize(hidden), ", ", hidden, "] and W2 [", hidden, ", ",
        internal::InnerSize(hidden), "] have rank at most ", hidden, "; give --lora at most ",
        hidden, " (or a larger --hidden)"));
  }
  ZS_RETURN_IF_ERROR(CheckNonNegative("lora_alpha", lora_alpha));
  ZS_RETURN_IF_ERROR(CheckNonNegative("adapter_lr_scale", adapter_lr_scale));
  if (adapter_weight_decay.has_value()) {
    ZS_RETURN_IF_ERROR(CheckNonNegative("adapter_weight_decay", *adapter_weight_decay));
  }
  return absl::OkStatus();
}

absl::Status CheckRegressionModelOnly(const MlpConfig& cfg, const char* who) {
  const char* variant = cfg.lm()        ? "the language model (vocab > 0, --vocab)"
                        : cfg.lora()    ? "LoRA (lora_rank > 0, --lora)"
                        : cfg.recompute ? "recompute (--recompute)"
                                        : nullptr;
  if (variant == nullptr) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(who, " trains the regression MLP only, not ",
                                               variant,
                                               "; use MlpTrainer (the CPU "
                                               "data-parallel trainer)"));
}

ModelSpec BuildModelSpec(const MlpConfig& cfg) {
  const int64_t h = cfg.hidden;
  const int64_t inner = internal::InnerSize(h);
  const int64_t r = cfg.lora_rank;
  // LoRA trains the adapters only: the base model (embedding and head
  // included) is frozen.
  const bool base_trainable = !cfg.lora();
  ModelSpec spec;
  if (cfg.lm()) {
    // nanoGPT's groups: embeddings are not decayed.
    ParamSpec weight = Param("weight", {cfg.vocab, h}, /*no_decay=*/true);
    weight.trainable = base_trainable;
    spec.units.push_back(UnitSpec{"embed", {weight}});
  }
  for (int i = 0; i < cfg.blocks; ++i) {
    UnitSpec unit;
    unit.name = absl::StrCat("block.", i);
    // Megatron's split: W1 and b1 column-parallel (rows of W1), W2
    // row-parallel (its columns), b2 replicated (added once, after the g
    // all-reduce).
    unit.params = {
        Param(kParamNames[kW1], {inner, h}, /*no_decay=*/false, /*tp_split_dim=*/0),
        Param(kParamNames[kB1], {inner}, /*no_decay=*/true, /*tp_split_dim=*/0),
        Param(kParamNames[kW2], {h, inner}, /*no_decay=*/false, /*tp_split_dim=*/1),
        Param(kParamNames[kB2], {h}, /*no_decay=*/true, /*tp_split_dim=*/-1),
    };
    if (cfg.lora()) {
      for (ParamSpec& p : unit.params) p.trainable = false;
      const std::vector<int64_t> shapes[4] = {{r, h}, {inner, r}, {r, inner}, {h, r}};
      for (int a = 0; a < 4; ++a) {
        ParamSpec adapter = Param(kParamNames[kLoraA1 + a], shapes[a], /*no_decay=*/false);
        adapter.lr_scale = cfg.adapter_lr_scale;
        adapter.weight_decay = cfg.adapter_weight_decay;
        unit.params.push_back(std::move(adapter));
      }
    }
    spec.units.push_back(std::move(unit));
  }
  if (cfg.lm()) {
    // The head's weight is the embedding (tied_to): same shape and group.
    ParamSpec weight = Param("weight", {cfg.vocab, h}, /*no_decay=*/true);
    weight.trainable = base_trainable;
    weight.tied_to = ParamRef{"embed", "weight"};
    ParamSpec bias = Param("bias", {cfg.vocab}, /*no_decay=*/true);
    bias.trainable = base_trainable;
    spec.units.push_back(UnitSpec{"head", {weight, bias}});
  }
  return spec;
}

std::vector<float> RandomParam(const MlpConfig& cfg, uint64_t seed, int unit, int param) {
  if (unit < 0 || unit >= NumUnits(cfg) || param < 0) return {};
  const int64_t h = cfg.hidden;
  if (cfg.lm() && unit == EmbedUnit()) {
    if (param != kEmbedWeight) return {};
    return NormalValues(examples::DeriveKey(seed, kEmbedDomain), cfg.vocab * h,
                        1.0 / std::sqrt(static_cast<double>(h)));
  }
  if (cfg.lm() && unit == HeadUnit(cfg)) {
    if (param == kHeadWeight) return RandomParam(cfg, seed, EmbedUnit(), kEmbedWeight);
    if (param != kHeadBias) return {};
    return NormalValues(examples::DeriveKey(seed, kHeadDomain), cfg.vocab, kBiasStd);
  }
  const int block = unit - BlockUnit(cfg, 0);
  if (param >= kNumBlockParams) {
    if (!cfg.lora() || param >= kNumLoraBlockParams) return {};
    const int64_t r = cfg.lora_rank;
    const int64_t inner = internal::InnerSize(h);
    switch (param) {
      case kLoraB1:
        return std::vector<float>(static_cast<size_t>(inner * r), 0.0f);
      case kLoraB2:
        return std::vector<float>(static_cast<size_t>(h * r), 0.0f);
      default: {
        const int64_t in = param == kLoraA1 ? h : inner;
        const uint64_t key =
            examples::DeriveKey(examples::DeriveKey(examples::DeriveKey(seed, kLoraDomain),
                                                    static_cast<uint64_t>(block)),
                                static_cast<uint64_t>(param));
        return NormalValues(key, r * in, 1.0 / std::sqrt(static_cast<double>(in)));
      }
    }
  }
  unit = block;  // block params are keyed by the block's index
  const int64_t inner = internal::InnerSize(h);
  int64_t numel = 0;
  double std_dev = kBiasStd;
  switch (param) {
    case kW1:
      numel = inner * h;
      std_dev = 1.0 / std::sqrt(static_cast<double>(h));
      break;
    case kB1:
      numel = inner;
      break;
    case kW2:
      numel = h * inner;
      std_dev = 1.0 / std::sqrt(static_cast<double>(inner));
      break;
    case kB2:
      numel = h;
      break;
  }
  const uint64_t key = examples::DeriveKey(
      examples::DeriveKey(examples::DeriveKey(seed, kParamDomain), static_cast<uint64_t>(unit)),
      static_cast<uint64_t>(param));
  std::vector<float> values(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    values[i] = static_cast<float>(std_dev * examples::NormalAt(key, static_cast<uint64_t>(i)));
  }
  return values;
}

std::vector<float> InitialParam(const MlpConfig& cfg, int unit, int param) {
  return RandomParam(cfg, cfg.init_seed, unit, param);
}

std::vector<TrainerSetting> TrainerSettings(const MlpConfig& cfg) {
  // Seeds are compared bit for bit; int64 holds every uint64 pattern.
  std::vector<TrainerSetting> settings = {
      TrainerSetting::Int("micro_batch", cfg.micro_batch),
      TrainerSetting::Int("init_seed", static_cast<int64_t>(cfg.init_seed)),
      TrainerSetting::Int("teacher_seed", static_cast<int64_t>(cfg.teacher_seed)),
      TrainerSetting::Int("data_seed", static_cast<int64_t>(cfg.data_seed))};
  // The LoRA scale is not in the ModelSpec (vocab and rank are, in the
  // shapes); the regression model's settings stay as they were.
  if (cfg.lora()) settings.push_back(TrainerSetting::Real("lora_scale", cfg.LoraScale()));
  return settings;
}

absl::Status InitEngineParams(Engine& engine, const MlpConfig& cfg) {
  const ModelSpec& spec = engine.model();
  if (static_cast<int>(spec.units.size()) != NumUnits(cfg)) {
    return absl::InvalidArgumentError(absl::StrCat("InitEngineParams: the engine's model has ",
                                                   spec.units.size(),
                                                   " units but the MLP config has ", NumUnits(cfg),
                                                   "; create the engine with BuildModelSpec(cfg)"));
  }
  for (int u = 0; u < NumUnits(cfg); ++u) {
    const std::vector<ParamSpec>& params = spec.units[static_cast<size_t>(u)].params;
    for (int p = 0; p < static_cast<int>(params.size()); ++p) {
      if (params[static_cast<size_t>(p)].tied_to.has_value()) continue;  // set as its owner
      ZS_RETURN_IF_ERROR(engine.SetParam(u, p, InitialParam(cfg, u, p)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> CreateMlpEngine(const MlpConfig& cfg,
                                                        const TrainSpec& train, Device& device,
                                                        Communicator& comm) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                      Engine::Create(BuildModelSpec(cfg), train, device, comm));
  ZS_RETURN_IF_ERROR(InitEngineParams(*engine, cfg));
  return engine;
}

DistributedSampler::DistributedSampler(const MlpConfig& cfg, int world, int rank, int accum)
    : cfg_(cfg), world_(world), rank_(rank), accum_(accum) {
  // The teacher is the base model (no adapters) under its own seed.
  for (int i = 0; i < cfg.blocks; ++i) {
    for (int p = 0; p < kNumBlockParams; ++p) {
      teacher_params_.push_back(RandomParam(cfg, cfg.teacher_seed, BlockUnit(cfg, i), p));
    }
  }
  for (int i = 0; i < cfg.blocks; ++i) {
    const std::vector<float>* p = &teacher_params_[static_cast<size_t>(i) * kNumBlockParams];
    teacher_.push_back({p[kW1].data(), p[kB1].data(), p[kW2].data(), p[kB2].data()});
  }
  if (!cfg.lm()) {
    teacher_state_.Resize(cfg.blocks, cfg.micro_batch, cfg.hidden);
    return;
  }
  // The teacher LM's next token for every token, once: its logits for the
  // vocabulary in chunks, then the argmax of each row.
  const int64_t v = cfg.vocab, h = cfg.hidden;
  const std::vector<float> embed = RandomParam(cfg, cfg.teacher_seed, EmbedUnit(), kEmbedWeight);
  const std::vector<float> bias = RandomParam(cfg, cfg.teacher_seed, HeadUnit(cfg), kHeadBias);
  const int64_t chunk = std::min(v, kTeacherChunk);
  teacher_state_.Resize(cfg.blocks, chunk, h);
  std::vector<float> logits(static_cast<size_t>(chunk * v));
  std::vector<int32_t> tokens(static_cast<size_t>(chunk));
  teacher_next_.resize(static_cast<size_t>(v));
  for (int64_t first = 0; first < v; first += chunk) {
    const int64_t n = std::min(chunk, v - first);
    for (int64_t k = 0; k < n; ++k) tokens[k] = static_cast<int32_t>(first + k);
    std::vector<float> x(static_cast<size_t>(chunk * h), 0.0f);
    internal::EmbedForward(embed.data(), tokens.data(), n, h, x.data());
    internal::NetworkForward(teacher_, chunk, h, x.data(), &teacher_state_);
    internal::HeadForward(embed.data(), bias.data(), teacher_state_.output().data(), n, h, v,
                          logits.data());
    // The token itself is excluded: the residual path makes it the teacher's
    // argmax for most tokens (x E^T peaks at the token's own row), which a
    // student learns by scaling its embedding. The rule is then a fixed
    // random-looking map to another token, which the student must learn.
    for (int64_t k = 0; k < n; ++k) logits[k * v + first + k] = -INFINITY;
    internal::ArgmaxRows(logits.data(), n, v, teacher_next_.data() + first);
  }
}

std::vector<int64_t> DistributedSampler::SampleIds(int64_t step, int micro) const {
  const int64_t b = cfg_.micro_batch;
  const int64_t global_batch = static_cast<int64_t>(world_) * accum_ * b;
  const int64_t global_micro = static_cast<int64_t>(rank_) * accum_ + micro;
  std::vector<int64_t> ids(static_cast<size_t>(b));
  for (int64_t k = 0; k < b; ++k) ids[k] = step * global_batch + global_micro * b + k;
  return ids;
}

float DistributedSampler::InputAt(int64_t sample_id, int64_t j) const {
  const uint64_t key = examples::DeriveKey(examples::DeriveKey(cfg_.data_seed, kInputDomain),
                                           static_cast<uint64_t>(sample_id));
  return static_cast<float>(examples::NormalAt(key, static_cast<uint64_t>(j)));
}

int32_t DistributedSampler::TokenAt(int64_t sample_id) const {
  const uint64_t key = examples::DeriveKey(examples::DeriveKey(cfg_.data_seed, kTokenDomain),
                                           static_cast<uint64_t>(sample_id));
  return static_cast<int32_t>(key % static_cast<uint64_t>(cfg_.vocab));
}

void DistributedSampler::FillTokens(int64_t step, int micro, int32_t* tokens,
                                    int32_t* targets) const {
  const std::vector<int64_t> ids = SampleIds(step, micro);
  for (size_t k = 0; k < ids.size(); ++k) {
    tokens[k] = TokenAt(ids[k]);
    targets[k] = TargetOf(tokens[k]);
  }
}

void DistributedSampler::Fill(int64_t step, int micro, float* x, float* y) const {
  const int64_t h = cfg_.hidden;
  const std::vector<int64_t> ids = SampleIds(step, micro);
  for (size_t k = 0; k < ids.size(); ++k) {
    for (int64_t j = 0; j < h; ++j) x[k * h + j] = InputAt(ids[k], j);
  }
  internal::NetworkForward(teacher_, cfg_.micro_batch, h, x, &teacher_state_);
  const std::vector<float>& out = teacher_state_.output();
  std::copy(out.begin(), out.end(), y);
}

std::string BlasDescription() { return examples::CpuBlasDescription(); }

}  // namespace mlp
}  // namespace zeroshard
