#include "tests/runtime/synthetic_trainer.h"

#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "examples/common/rng.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

using ::zeroshard::examples::SplitMix64;

// In [-1, 1), a pure function of the run seed and (a, b, c, d).
float Uniform(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(SplitMix64(a ^ Seed()) ^ b) ^ c) ^ d);
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0);
}

void Store(const TensorView& t, int64_t i, float value) {
  switch (t.dtype) {
    case DType::kFloat32:
      t.as<float>()[i] = value;
      break;
    case DType::kBFloat16:
      t.as<uint16_t>()[i] = Fp32ToBf16(value);
      break;
    default:
      t.as<uint16_t>()[i] = Fp32ToFp16(value);
      break;
  }
}

float Load(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kFloat32:
      return t.as<float>()[i];
    case DType::kBFloat16:
      return Bf16ToFp32(t.as<uint16_t>()[i]);
    default:
      return Fp16ToFp32(t.as<uint16_t>()[i]);
  }
}

// Element access to the engine's views: direct on host memory, through a
// host copy of the view's bytes otherwise.
class ViewIo {
 public:
  explicit ViewIo(Device* device) : device_(device) {}

  absl::StatusOr<std::vector<float>> Read(const TensorView& t) {
    std::vector<float> out(static_cast<size_t>(t.numel));
    if (device_ == nullptr || device_->host_accessible()) {
      for (int64_t i = 0; i < t.numel; ++i) out[i] = Load(t, i);
      return out;
    }
    const int64_t bytes = t.numel * static_cast<int64_t>(DTypeSize(t.dtype));
    std::vector<unsigned char> raw(static_cast<size_t>(bytes));
    ZS_RETURN_IF_ERROR(EnsureStream());
    ZS_RETURN_IF_ERROR(device_->CopyAsync(raw.data(), t.data, bytes, *stream_));
    ZS_RETURN_IF_ERROR(stream_->Synchronize());
    const TensorView host{raw.data(), t.dtype, t.numel, t.shape};
    for (int64_t i = 0; i < t.numel; ++i) out[i] = Load(host, i);
    return out;
  }

  absl::Status Write(const TensorView& t, const std::vector<float>& values) {
    if (device_ == nullptr || device_->host_accessible()) {
      for (int64_t i = 0; i < t.numel; ++i) Store(t, i, values[i]);
      return absl::OkStatus();
    }
    const int64_t bytes = t.numel * static_cast<int64_t>(DTypeSize(t.dtype));
    std::vector<unsigned char> raw(static_cast<size_t>(bytes));
    const TensorView host{raw.data(), t.dtype, t.numel, t.shape};
    for (int64_t i = 0; i < t.numel; ++i) Store(host, i, values[i]);
    ZS_RETURN_IF_ERROR(EnsureStream());
    ZS_RETURN_IF_ERROR(device_->CopyAsync(t.data, raw.data(), bytes, *stream_));
    // The engine reads the gradient after ReduceGrads: the copy must be done.
    return stream_->Synchronize();
  }

 private:
  absl::Status EnsureStream() {
    if (stream_ != nullptr) return absl::OkStatus();
    ZS_ASSIGN_OR_RETURN(stream_, device_->CreateStream());
    return absl::OkStatus();
  }

  Device* device_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace

ModelSpec SyntheticSpec() {
  ModelSpec spec;
  spec.units.push_back({"block.0", {{"w", {40, 30}, false}, {"b", {30}, true}}});
  spec.units.push_back({"block.1", {{"w", {50, 20}, false}}});
  spec.units.push_back({"norm", {{"scale", {7}, true}}});
  spec.units.push_back({"block.3", {{"w", {50, 20}, false}}});
  return spec;
}

std::vector<float> SyntheticInit(const ModelSpec& spec, int unit, int param) {
  std::vector<float> v(spec.units[unit].params[param].NumElements());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * Uniform(7, unit, param, i);
  return v;
}

absl::Status SyntheticStart(Engine& engine, const ModelSpec& spec) {
  for (size_t u = 0; u < spec.units.size(); ++u) {
    for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
      ZS_RETURN_IF_ERROR(engine.SetParam(u, p, SyntheticInit(spec, u, p)));
    }
  }
  return engine.Start();
}

absl::StatusOr<StepResult> SyntheticStep(Engine& engine, const ModelSpec& spec,
                                         const SyntheticHooks& hooks, Device* device) {
  ViewIo io(device);
  const int64_t step = engine.steps();
  const int rank = engine.rank();
  const int units = static_cast<int>(spec.units.size());
  const float scale = static_cast<float>(engine.loss_scale());
  for (int micro = 0; micro < engine.train().grad_accum_steps; ++micro) {
    // Forward: read every unit once; the "activation" is a checksum that
    // makes the gradient depend on the weights.
    std::vector<double> checksum(units, 0.0);
    for (int u = 0; u < units; ++u) {
      const int gather = hooks.forward_unit ? hooks.forward_unit(step, rank, u) : u;
      ZS_ASSIGN_OR_RETURN(UnitView w, engine.Gather(gather));
      for (const TensorView& t : w.params) {
        ZS_ASSIGN_OR_RETURN(const std::vector<float> values, io.Read(t));
        for (float v : values) checksum[u] += v;
      }
      ZS_RETURN_IF_ERROR(engine.Release(gather));
    }
    for (int u = units - 1; u >= 0; --u) {
      ZS_ASSIGN_OR_RETURN(UnitView w, engine.Gather(u));
      ZS_ASSIGN_OR_RETURN(UnitView g, engine.GradView(u));
      const double c = std::tanh(checksum[u]);
      for (size_t p = 0; p < g.params.size(); ++p) {
        ZS_ASSIGN_OR_RETURN(const std::vector<float> weights, io.Read(w.params[p]));
        std::vector<float> grads(static_cast<size_t>(g.params[p].numel));
        for (int64_t i = 0; i < g.params[p].numel; ++i) {
          const float noise = Uniform(step * 131 + micro, rank, u * 16 + p, i);
          grads[i] = scale * (noise + 0.1f * weights[i] + 0.01f * float(c));
        }
        ZS_RETURN_IF_ERROR(io.Write(g.params[p], grads));
      }
      if (hooks.after_grads) hooks.after_grads(step, rank, u, g);
      ZS_RETURN_IF_ERROR(engine.ReduceGrads(u));
      ZS_RETURN_IF_ERROR(engine.Release(u));
    }
  }
  return engine.Step();
}

absl::StatusOr<std::vector<std::vector<float>>> AllParams(Engine& engine, const ModelSpec& spec) {
  std::vector<std::vector<float>> out;
  for (size_t u = 0; u < spec.units.size(); ++u) {
    for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
      ZS_ASSIGN_OR_RETURN(auto v, engine.GetParam(u, p));
      out.push_back(std::move(v));
    }
  }
  return out;
}

TrainSpec SyntheticTrain(int stage, Precision precision, int accum) {
  TrainSpec t;
  t.zero_stage = stage;
  t.precision = precision;
  t.grad_accum_steps = accum;
  t.optimizer.lr = 1e-2;
  t.optimizer.weight_decay = 0.05;
  t.max_grad_norm = 5.0;
  return t;
}

absl::StatusOr<SyntheticRunResult> RunSyntheticRanks(const SyntheticRunSpec& run) {
  const ModelSpec spec = SyntheticSpec();
  SyntheticRunResult result;
  std::mutex mu;
  ZS_RETURN_IF_ERROR(RunLocalRanks(
      run.world,
      [&](int rank, Communicator& comm) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, run.make_device(rank));
        ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, run.train, *device, comm));
        if (run.load_dir.empty()) {
          ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
        } else {
          ZS_RETURN_IF_ERROR(engine->Load(run.load_dir).status());
          ZS_RETURN_IF_ERROR(engine->Start());
        }
        std::vector<StepResult> steps;
        for (int s = 0; s < run.steps; ++s) {
          ZS_ASSIGN_OR_RETURN(StepResult r, SyntheticStep(*engine, spec, run.hooks, device.get()));
          steps.push_back(r);
          if (run.after_step) run.after_step(r.step, rank, *engine);
        }
        // The ledgers of every tier against the plan.
        ZS_ASSIGN_OR_RETURN(const BufferPlan plan, PlanEngineBuffers(spec, run.train, run.world));
        std::vector<std::string> mismatches;
        for (int t = 0; t < kNumMemoryTiers; ++t) {
          const MemoryTier tier = static_cast<MemoryTier>(t);
          for (int c = 0; c < kNumMemoryCategories; ++c) {
            const MemoryCategory category = static_cast<MemoryCategory>(c);
            // The device also holds the engine's small record exchange
            // (workspace, outside the plan) and the trainer's views.
            if (tier == MemoryTier::kDevice && !IsModelState(category) &&
                category != MemoryCategory::kCommBuffers) {
              continue;
            }
            const int64_t have = engine->tier_ledger(tier).current(category);
            const int64_t want = plan.BytesIn(category, tier);
            if (have != want) {
              mismatches.push_back(absl::StrFormat("rank %d, %s tier, %s: ledger %d, plan %d", rank,
                                                   MemoryTierName(tier),
                                                   MemoryCategoryName(category), have, want));
            }
          }
        }
        if (!run.save_dir.empty()) {
          ZS_RETURN_IF_ERROR(engine->Save(run.save_dir, "{}", CheckpointOptions{}));
          ZS_RETURN_IF_ERROR(engine->WaitForCheckpoint());
        }
        ZS_ASSIGN_OR_RETURN(auto params, AllParams(*engine, spec));
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(mu);
          result.params = std::move(params);
          result.steps = std::move(steps);
          result.model_state_bytes = device->ledger().current_model_states();
          for (int t = 0; t < kNumMemoryTiers; ++t) {
            result.tier_bytes[t] = engine->tier_ledger(static_cast<MemoryTier>(t)).current_total();
          }
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          for (std::string& m : mismatches) result.ledger_vs_plan.push_back(std::move(m));
        }
        return absl::OkStatus();
      },
      run.comm));
  return result;
}

std::string FirstDifference(const SyntheticRunResult& a, const SyntheticRunResult& b) {
  if (a.params.size() != b.params.size() || a.steps.size() != b.steps.size()) {
    return "a different number of params or steps";
  }
  for (size_t p = 0; p < a.params.size(); ++p) {
    if (a.params[p].size() != b.params[p].size()) return absl::StrFormat("param %d's size", p);
    for (size_t i = 0; i < a.params[p].size(); ++i) {
      if (std::memcmp(&a.params[p][i], &b.params[p][i], sizeof(float)) != 0) {
        return absl::StrFormat("param %d element %d: %.9g vs %.9g", p, i, a.params[p][i],
                               b.params[p][i]);
      }
    }
  }
  for (size_t s = 0; s < a.steps.size(); ++s) {
    if (std::memcmp(&a.steps[s].grad_norm, &b.steps[s].grad_norm, sizeof(double)) != 0 ||
        a.steps[s].loss_scale != b.steps[s].loss_scale ||
        a.steps[s].skipped != b.steps[s].skipped) {
      return absl::StrFormat("step %d: norm %.17g vs %.17g, loss scale %g vs %g", s + 1,
                             a.steps[s].grad_norm, b.steps[s].grad_norm, a.steps[s].loss_scale,
                             b.steps[s].loss_scale);
    }
  }
  return "";
}

void ExpectCheckpointsMoveBitForBit(const RunOnDevice& run, const std::string& other_name) {
  char pattern[] = "/tmp/zs_ckpt_move_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  for (Precision precision : {Precision::kFp32, Precision::kFp16Mixed}) {
    const std::string what = absl::StrFormat("%s, %s", PrecisionName(precision), SeedTrace());
    const TrainSpec train = SyntheticTrain(2, precision);
    auto whole = run(false, 2, train, 6, "", "");
    ASSERT_TRUE(whole.ok()) << whole.status() << " " << what;
    const std::string from_other = dir + "/" + PrecisionName(precision) + "_from_other";
    const std::string from_host = dir + "/" + PrecisionName(precision) + "_from_host";
    ASSERT_TRUE(run(true, 2, train, 3, "", from_other).ok()) << what;
    auto host_rest = run(false, 2, train, 3, from_other, "");
    ASSERT_TRUE(host_rest.ok()) << host_rest.status() << " " << what;
    ASSERT_TRUE(run(false, 2, train, 3, "", from_host).ok()) << what;
    auto other_rest = run(true, 2, train, 3, from_host, "");
    ASSERT_TRUE(other_rest.ok()) << other_rest.status() << " " << what;
    EXPECT_EQ(host_rest->params, whole->params) << other_name << " -> host: " << what;
    EXPECT_EQ(other_rest->params, whole->params) << "host -> " << other_name << ": " << what;
  }
  std::system(("rm -rf '" + dir + "'").c_str());
}

}  // namespace zeroshard::testing
