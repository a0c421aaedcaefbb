#include "tests/runtime/engine_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "engine/src/runtime/engine_impl.h"
#include "tests/test_seed.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {

mlp::MlpConfig SmallMlp() {
  // Fresh weights, teacher and data every run: the equalities hold for any.
  mlp::MlpConfig cfg;
  cfg.init_seed = Seed();
  cfg.teacher_seed = Seed() ^ 0x9e3779b97f4a7c15ull;
  cfg.data_seed = Seed() + 1;
  cfg.hidden = 32;
  cfg.blocks = 3;
  cfg.micro_batch = 8;
  return cfg;
}

TrainSpec MakeTrainSpec(const RunConfig& run) {
  TrainSpec t;
  t.zero_stage = run.stage;
  t.precision = run.precision;
  t.grad_accum_steps = run.accum;
  t.optimizer.lr = 3e-3;
  t.optimizer.weight_decay = run.weight_decay;
  t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
  t.schedule.warmup_steps = std::min(4, run.steps - 1);
  t.schedule.total_steps = run.steps;
  t.schedule.min_lr_ratio = 0.1;
  t.max_grad_norm = run.max_grad_norm;
  t.prefetch_units = run.prefetch_units;
  t.zeropp.quantized_weights = run.quantized_weights;
  t.zeropp.secondary_partition_size = run.secondary_partition_size;
  t.zeropp.quantized_grad_bits = run.quantized_grad_bits;
  return t;
}

absl::StatusOr<RunResult> TrainMlp(const mlp::MlpConfig& cfg, const RunConfig& run) {
  RunResult result;
  result.model_state_bytes.assign(run.world, 0);
  result.peak_bytes.assign(run.world, 0);
  std::mutex mu;
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  absl::Status status = RunLocalRanks(run.world, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, MakeTrainSpec(run), *device, comm));
    ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, cfg));
    ZS_RETURN_IF_ERROR(engine->Start(mlp::TrainerSettings(cfg)));
    mlp::MlpTrainer trainer(cfg, *engine, comm);
    for (int s = 0; s < run.steps; ++s) {
      ZS_ASSIGN_OR_RETURN(double loss, trainer.TrainStep());
      if (rank == 0) {
        result.losses.push_back(loss);
        result.steps.push_back(trainer.last_step());
      }
    }
    std::vector<std::vector<std::vector<float>>> params(spec.units.size());
    for (size_t u = 0; u < spec.units.size(); ++u) {
      for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
        ZS_ASSIGN_OR_RETURN(auto values,
                            engine->GetParam(static_cast<int>(u), static_cast<int>(p)));
        params[u].push_back(std::move(values));
      }
    }
    const auto* impl = dynamic_cast<const internal::EngineImpl*>(engine.get());
    if (impl == nullptr) return absl::InternalError("engine is not an EngineImpl");
    ZS_RETURN_IF_ERROR(impl->CheckPaddingIsZero());
    std::lock_guard<std::mutex> lock(mu);
    if (rank == 0) {
      result.params = std::move(params);
      result.stats = engine->Stats();
    }
    result.model_state_bytes[rank] = device->ledger().current_model_states();
    result.peak_bytes[rank] = device->ledger().peak_total();
    return absl::OkStatus();
  });
  ZS_RETURN_IF_ERROR(status);
  return result;
}

double MaxRelativeDifference(const RunResult& a, const RunResult& b) {
  double worst = 0.0;
  for (size_t u = 0; u < a.params.size(); ++u) {
    for (size_t p = 0; p < a.params[u].size(); ++p) {
      double max_diff = 0.0, max_ref = 0.0;
      for (size_t i = 0; i < a.params[u][p].size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(double(a.params[u][p][i]) - b.params[u][p][i]));
        max_ref = std::max(max_ref, std::fabs(double(b.params[u][p][i])));
      }
      worst = std::max(worst, max_diff / std::max(max_ref, 1e-30));
    }
  }
  return worst;
}

double RelativeL2Difference(const RunResult& a, const RunResult& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t u = 0; u < a.params.size(); ++u) {
    for (size_t p = 0; p < a.params[u].size(); ++p) {
      for (size_t i = 0; i < a.params[u][p].size(); ++i) {
        const double d = double(a.params[u][p][i]) - b.params[u][p][i];
        diff += d * d;
        ref += double(b.params[u][p][i]) * b.params[u][p][i];
      }
    }
  }
  return std::sqrt(diff / std::max(ref, 1e-300));
}

bool BitwiseEqual(const RunResult& a, const RunResult& b) {
  if (a.params.size() != b.params.size()) return false;
  for (size_t u = 0; u < a.params.size(); ++u) {
    for (size_t p = 0; p < a.params[u].size(); ++p) {
      const auto& x = a.params[u][p];
      const auto& y = b.params[u][p];
      if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace zeroshard::testing
