// Model spec, deterministic initialisation and the distributed sampler of the
// residual-MLP example.
#include "examples/mlp/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "examples/common/rng.h"
#include "zeroshard/status.h"

// OpenBLAS's own queries (not in every cblas.h).
extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);

namespace zeroshard {
namespace mlp {
namespace {

// Domain separators so params and inputs never share a random stream even
// when their seeds are equal.
constexpr uint64_t kParamDomain = 0x706172616d73ull;  // "params"
constexpr uint64_t kInputDomain = 0x696e70757473ull;  // "inputs"
constexpr double kBiasStd = 0.02;

const char* const kParamNames[kNumBlockParams] = {"w1", "b1", "w2", "b2"};

}  // namespace

absl::Status MlpConfig::Validate() const {
  if (hidden <= 0)
    return absl::InvalidArgumentError(absl::StrCat("MlpConfig.hidden must be > 0, got ", hidden));
  if (blocks <= 0)
    return absl::InvalidArgumentError(absl::StrCat("MlpConfig.blocks must be > 0, got ", blocks));
  if (micro_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpConfig.micro_batch must be > 0, got ", micro_batch));
  }
  return absl::OkStatus();
}

ModelSpec BuildModelSpec(const MlpConfig& cfg) {
  const int64_t h = cfg.hidden;
  const int64_t inner = internal::InnerSize(h);
  ModelSpec spec;
  for (int i = 0; i < cfg.blocks; ++i) {
    UnitSpec unit;
    unit.name = absl::StrCat("block.", i);
    // Megatron's split: W1 and b1 column-parallel (rows of W1), W2
    // row-parallel (its columns), b2 replicated (added once, after the g
    // all-reduce).
    unit.params = {
        ParamSpec{kParamNames[kW1], {inner, h}, /*no_decay=*/false, /*tp_split_dim=*/0},
        ParamSpec{kParamNames[kB1], {inner}, /*no_decay=*/true, /*tp_split_dim=*/0},
        ParamSpec{kParamNames[kW2], {h, inner}, /*no_decay=*/false, /*tp_split_dim=*/1},
        ParamSpec{kParamNames[kB2], {h}, /*no_decay=*/true, /*tp_split_dim=*/-1},
    };
    spec.units.push_back(std::move(unit));
  }
  return spec;
}

std::vector<float> RandomParam(const MlpConfig& cfg, uint64_t seed, int unit, int param) {
  if (unit < 0 || unit >= cfg.blocks || param < 0 || param >= kNumBlockParams) return {};
  const int64_t h = cfg.hidden;
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
  return {TrainerSetting::Int("micro_batch", cfg.micro_batch),
          TrainerSetting::Int("init_seed", static_cast<int64_t>(cfg.init_seed)),
          TrainerSetting::Int("teacher_seed", static_cast<int64_t>(cfg.teacher_seed)),
          TrainerSetting::Int("data_seed", static_cast<int64_t>(cfg.data_seed))};
}

absl::Status InitEngineParams(Engine& engine, const MlpConfig& cfg) {
  const ModelSpec& spec = engine.model();
  if (static_cast<int>(spec.units.size()) != cfg.blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("InitEngineParams: the engine's model has ", spec.units.size(),
                     " units but the MLP config has ", cfg.blocks,
                     " blocks; create the engine with BuildModelSpec(cfg)"));
  }
  for (int u = 0; u < cfg.blocks; ++u) {
    for (int p = 0; p < kNumBlockParams; ++p) {
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
  for (int u = 0; u < cfg.blocks; ++u) {
    for (int p = 0; p < kNumBlockParams; ++p) {
      teacher_params_.push_back(RandomParam(cfg, cfg.teacher_seed, u, p));
    }
  }
  for (int u = 0; u < cfg.blocks; ++u) {
    const std::vector<float>* p = &teacher_params_[static_cast<size_t>(u) * kNumBlockParams];
    teacher_.push_back({p[kW1].data(), p[kB1].data(), p[kW2].data(), p[kB2].data()});
  }
  teacher_state_.Resize(cfg.blocks, cfg.micro_batch, cfg.hidden);
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

std::string BlasDescription() {
  std::string out = absl::StrCat(openblas_get_config(), ", core ", openblas_get_corename());
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced != nullptr && *forced != '\0') {
    absl::StrAppend(&out, " (OPENBLAS_CORETYPE=", forced, " in the environment)");
  } else {
    absl::StrAppend(&out, " (detected)");
  }
  return out;
}

}  // namespace mlp
}  // namespace zeroshard
