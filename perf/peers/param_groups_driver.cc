// The zeroshard side of perf/peers/param_groups.sh: the engine's AdamW with
// two param groups (or, with --ungrouped, one) on fixed random params and
// per-step gradients, one rank, stage 0, fp32, no clipping, warm-up +
// cosine schedule. It writes what the PyTorch side needs to repeat the run
// (param_groups_torch.py) into --out DIR:
//   meta.json   the params (unit.param, element count, group), the groups'
//               lr_scale and weight decay, the optimizer, the schedule and
//               the learning rate the engine applied at each step;
//   init.f32    every param's initial values, in model order (raw fp32);
//   grads.f32   step by step, every param's gradient, in model order;
//   final.f32   every param after the last step (Engine::GetParam).
// The gradient the trainer writes is the gradient Adam sees: one rank, one
// micro-batch, loss scale 1, so the engine's mean is the value itself.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "cli/output_file.h"
#include "examples/common/rng.h"
#include "nlohmann/json.hpp"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

using examples::DeriveKey;
using examples::SplitMix64At;

struct Options {
  std::string out;
  int64_t steps = 300;
  uint64_t seed = 19;
  bool grouped = true;
};

// In [-1, 1): element `i` of stream `key`.
float Uniform(uint64_t key, uint64_t i) {
  return static_cast<float>(static_cast<double>(SplitMix64At(key, i) >> 11) * 0x1.0p-52 - 1.0);
}

// Two groups as trainers set them: "decay" (the optimizer's lr and weight
// decay: the big matrices) and "scaled" (a quarter of the rate, a weight
// decay of its own: the embedding and the bias).
ModelSpec GroupsModel(bool grouped) {
  ModelSpec spec;
  spec.units.push_back({"embed", {{"w", {64, 48}, false}}});
  spec.units.push_back({"block", {{"w", {48, 48}, false}, {"b", {48}, false}}});
  spec.units.push_back({"head", {{"w", {48, 32}, false}}});
  if (grouped) {
    for (ParamSpec* p : {&spec.units[0].params[0], &spec.units[1].params[1]}) {
      p->lr_scale = 0.25;
      p->weight_decay = 0.01;
    }
  }
  return spec;
}

TrainSpec GroupsTrain(int64_t steps) {
  TrainSpec t;
  t.zero_stage = 0;
  t.precision = Precision::kFp32;
  t.optimizer.kind = OptimizerKind::kAdamW;
  t.optimizer.lr = 1e-2;
  t.optimizer.weight_decay = 0.1;
  t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
  t.schedule.warmup_steps = steps / 10;
  t.schedule.total_steps = steps;
  t.schedule.min_lr_ratio = 0.1;
  return t;
}

absl::Status Write(const std::string& path, const std::vector<float>& values) {
  return cli::WriteOutputFile("--out", path,
                              absl::string_view(reinterpret_cast<const char*>(values.data()),
                                                values.size() * sizeof(float)));
}

absl::Status Run(const Options& o) {
  const ModelSpec spec = GroupsModel(o.grouped);
  const TrainSpec train = GroupsTrain(o.steps);
  std::unique_ptr<Device> device = CreateCpuDevice();
  nlohmann::json meta;
  std::vector<float> init, grads, final_params;
  ZS_RETURN_IF_ERROR(RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
    const int units = static_cast<int>(spec.units.size());
    uint64_t stream = 0;
    for (int u = 0; u < units; ++u) {
      for (size_t p = 0; p < spec.units[u].params.size(); ++p, ++stream) {
        const int64_t n = spec.units[u].params[p].NumElements();
        std::vector<float> w(static_cast<size_t>(n));
        const uint64_t key = DeriveKey(DeriveKey(o.seed, 0), stream);
        for (int64_t i = 0; i < n; ++i) w[i] = 0.5f * Uniform(key, i);
        init.insert(init.end(), w.begin(), w.end());
        ZS_RETURN_IF_ERROR(engine->SetParam(u, static_cast<int>(p), w));
      }
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    std::vector<double> lrs;
    for (int64_t step = 0; step < o.steps; ++step) {
      stream = 0;
      for (int u = 0; u < units; ++u) {
        ZS_RETURN_IF_ERROR(engine->Gather(u).status());
        ZS_ASSIGN_OR_RETURN(UnitView g, engine->GradView(u));
        for (size_t p = 0; p < g.params.size(); ++p, ++stream) {
          const uint64_t key = DeriveKey(DeriveKey(o.seed, 1 + step), stream);
          float* out = g.params[p].as<float>();
          for (int64_t i = 0; i < g.params[p].numel; ++i) {
            out[i] = Uniform(key, i);
            grads.push_back(out[i]);
          }
        }
        ZS_RETURN_IF_ERROR(engine->ReduceGrads(u));
        ZS_RETURN_IF_ERROR(engine->Release(u));
      }
      ZS_ASSIGN_OR_RETURN(StepResult r, engine->Step());
      lrs.push_back(r.lr);
    }
    nlohmann::json params = nlohmann::json::array();
    for (int u = 0; u < units; ++u) {
      for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
        const ParamSpec& param = spec.units[u].params[p];
        ZS_ASSIGN_OR_RETURN(std::vector<float> v, engine->GetParam(u, static_cast<int>(p)));
        final_params.insert(final_params.end(), v.begin(), v.end());
        const bool scaled = param.lr_scale != 1.0;
        params.push_back({{"name", spec.units[u].name + "." + param.name},
                          {"numel", param.NumElements()},
                          {"group", scaled ? "scaled" : "decay"}});
      }
    }
    nlohmann::json groups = {{"decay", {{"lr_scale", 1.0}, {"weight_decay", 0.1}}}};
    if (o.grouped) groups["scaled"] = {{"lr_scale", 0.25}, {"weight_decay", 0.01}};
    meta = {{"steps", o.steps},
            {"seed", o.seed},
            {"grouped", o.grouped},
            {"params", params},
            {"groups", groups},
            {"optimizer",
             {{"kind", "AdamW"},
              {"lr", train.optimizer.lr},
              {"beta1", train.optimizer.beta1},
              {"beta2", train.optimizer.beta2},
              {"eps", train.optimizer.eps},
              {"weight_decay", train.optimizer.weight_decay}}},
            {"schedule",
             {{"kind", "warmup_cosine"},
              {"warmup_steps", train.schedule.warmup_steps},
              {"total_steps", train.schedule.total_steps},
              {"min_lr_ratio", train.schedule.min_lr_ratio}}},
            {"lr", lrs}};
    return absl::OkStatus();
  }));
  ZS_RETURN_IF_ERROR(Write(o.out + "/init.f32", init));
  ZS_RETURN_IF_ERROR(Write(o.out + "/grads.f32", grads));
  ZS_RETURN_IF_ERROR(Write(o.out + "/final.f32", final_params));
  return cli::WriteOutputFile("--out", o.out + "/meta.json", meta.dump(1) + "\n");
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  zeroshard::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--out" && has_value) {
      o.out = argv[++i];
    } else if (arg == "--steps" && has_value && absl::SimpleAtoi(argv[i + 1], &o.steps) &&
               o.steps >= 10) {
      ++i;
    } else if (arg == "--seed" && has_value && absl::SimpleAtoi(argv[i + 1], &o.seed)) {
      ++i;
    } else if (arg == "--ungrouped") {
      o.grouped = false;
    } else {
      std::fprintf(stderr,
                   "param_groups_driver: bad argument '%s'; usage: param_groups_driver --out DIR "
                   "[--steps N (>= 10, default 300)] [--seed S] [--ungrouped]\n",
                   arg.c_str());
      return 2;
    }
  }
  if (o.out.empty()) {
    std::fprintf(stderr, "param_groups_driver: --out DIR is required (an existing directory)\n");
    return 2;
  }
  const absl::Status status = zeroshard::Run(o);
  if (!status.ok()) {
    std::fprintf(stderr, "param_groups_driver: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
