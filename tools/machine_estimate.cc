#include "tools/machine_estimate.h"

#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/flags.h"
#include "nlohmann/json.hpp"
#include "tools/estimate_command.h"
#include "tools/machine_profile.h"
#include "tools/mlp_step_model.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/status.h"

namespace zeroshard::tools {
namespace {

struct MachineRequest {
  MachineProfile profile;
  MlpWorkload workload;
  int ranks = 1;
  std::vector<int> stages = {0, 1, 2, 3};
  std::string backend = "local";
  int cpus_per_rank = 0;  // 0: not bound
  bool json = false;
};

absl::StatusOr<MachineRequest> Build(const std::map<std::string, std::string>& flags) {
  static const std::set<std::string> kAllowed = {
      "--machine", "--model", "--hidden", "--blocks",        "--backend",  "--micro-batch",
      "--gpus",    "--stage", "--json",   "--cpus-per-rank", "--precision"};
  for (const auto& [name, value] : flags) {
    if (!kAllowed.count(name)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s does not apply with --machine (the calibrated model of an engine run takes "
          "--model mlp, --hidden, --blocks, --micro-batch, --gpus, --stage, --backend, "
          "--cpus-per-rank, --json)",
          name));
    }
  }
  MachineRequest r;
  auto get = [&](const char* f) -> const std::string* {
    auto it = flags.find(f);
    return it == flags.end() ? nullptr : &it->second;
  };
  const std::string* model = get("--model");
  if (model == nullptr || *model != "mlp") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--model: %s; with --machine give --model mlp (the example residual "
                        "MLP, whose FLOPs the model counts exactly)",
                        model == nullptr ? "missing" : absl::StrCat("'", *model, "' is not mlp")));
  }
  if (auto* v = get("--precision"); v != nullptr && *v != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--precision: '%s'; the calibrated model covers fp32 runs only", *v));
  }
  if (auto* v = get("--hidden")) {
    ZS_ASSIGN_OR_RETURN(r.workload.hidden, cli::ParseIntFlag("--hidden", *v, 1, 65536));
  }
  if (auto* v = get("--blocks")) {
    ZS_ASSIGN_OR_RETURN(const int64_t n, cli::ParseIntFlag("--blocks", *v, 1, kMaxUnits));
    r.workload.blocks = static_cast<int>(n);
  }
  if (auto* v = get("--micro-batch")) {
    ZS_ASSIGN_OR_RETURN(r.workload.micro_batch, cli::ParseIntFlag("--micro-batch", *v, 1, 1 << 20));
  }
  if (auto* v = get("--gpus")) {
    ZS_ASSIGN_OR_RETURN(const int64_t n, cli::ParseIntFlag("--gpus", *v, 1, 1 << 20));
    r.ranks = static_cast<int>(n);
  }
  if (auto* v = get("--stage"); v != nullptr && *v != "auto") {
    if (*v != "0" && *v != "1" && *v != "2" && *v != "3") {
      return absl::InvalidArgumentError(
          absl::StrFormat("--stage: '%s' is not one of auto, 0, 1, 2, 3", *v));
    }
    r.stages = {(*v)[0] - '0'};
  }
  if (auto* v = get("--backend")) {
    ZS_RETURN_IF_ERROR(cli::ParseChoiceFlag("--backend", *v, {"local", "mpi"}).status());
    r.backend = *v;
  }
  if (auto* v = get("--cpus-per-rank")) {
    ZS_ASSIGN_OR_RETURN(
        const int64_t n,
        cli::ParseIntFlag("--cpus-per-rank", *v, 0, 1 << 20,
                          " (0: the ranks are not bound to CPUs; K: each rank's threads may "
                          "run on K CPUs)"));
    r.cpus_per_rank = static_cast<int>(n);
  }
  r.json = get("--json") != nullptr;
  const std::string& path = flags.at("--machine");
  ZS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "the --machine profile"));
  ZS_ASSIGN_OR_RETURN(r.profile, ParseMachineProfile(text, path));
  return r;
}

int64_t MlpParams(const MlpWorkload& w) {
  return w.blocks * (8 * w.hidden * w.hidden + 5 * w.hidden);
}

nlohmann::json PredictionJson(const EngineStepPrediction& p) {
  return {{"gemm", p.gemm * 1e3},
          {"elementwise", p.elementwise * 1e3},
          {"compute", p.compute * 1e3},
          {"optimizer", p.optimizer * 1e3},
          {"comm_total", p.comm_total * 1e3},
          {"exposed_comm", p.exposed_comm * 1e3},
          {"loader", p.loader * 1e3},
          {"critical_path", p.critical_path * 1e3},
          {"cpu_work", p.cpu_work * 1e3},
          {"contention", p.contention * 1e3},
          {"total", p.total * 1e3}};
}

}  // namespace

int RunMachineEstimate(const std::map<std::string, std::string>& flags, std::ostream& out,
                       std::ostream& err) {
  absl::StatusOr<MachineRequest> r = Build(flags);
  if (!r.ok()) {
    err << "zeroshard estimate: " << r.status().message() << "\n";
    return kExitBadInput;
  }
  std::vector<EngineStepPrediction> predictions;
  for (int stage : r->stages) {
    absl::StatusOr<EngineStepPrediction> p = PredictMlpEngineStep(
        r->workload, stage, r->ranks, r->backend, r->profile, r->cpus_per_rank);
    if (!p.ok()) {
      err << "zeroshard estimate: --machine " << flags.at("--machine") << ": "
          << p.status().message() << "\n";
      return kExitBadInput;
    }
    predictions.push_back(*p);
  }
  const MachineProfile& m = r->profile;
  const MlpWorkload& w = r->workload;
  if (r->json) {
    nlohmann::json j;
    j["schema"] = "zeroshard.step_prediction.v1";
    j["units"] = {{"time", "milliseconds per optimizer step"}};
    j["machine"] = {{"name", m.machine}, {"cpu", m.cpu}, {"cores", m.cores}, {"date", m.date}};
    j["workload"] = {{"model", "mlp"},
                     {"hidden", w.hidden},
                     {"blocks", w.blocks},
                     {"micro_batch", w.micro_batch},
                     {"params", MlpParams(w)},
                     {"ranks", r->ranks},
                     {"backend", r->backend},
                     {"cpus_per_rank", r->cpus_per_rank},
                     {"usable_cores", predictions[0].usable_cores},
                     {"precision", "fp32"}};
    nlohmann::json rows = nlohmann::json::array();
    for (size_t k = 0; k < predictions.size(); ++k) {
      rows.push_back({{"stage", r->stages[k]},
                      {"ms", PredictionJson(predictions[k])},
                      {"gemm_flops", predictions[k].flops},
                      {"collectives", predictions[k].collectives},
                      {"comm_bytes", predictions[k].comm_bytes}});
    }
    j["predictions"] = rows;
    out << j.dump(1) << "\n";
    return kExitOk;
  }
  out << absl::StrFormat("machine   %s (%s, %d cores), calibrated %s\n", m.machine, m.cpu, m.cores,
                         m.date);
  out << absl::StrFormat(
      "rates     sgemm %.1f GFLOP/s, GELU %.2f ns, GELU' %.2f ns, copy %.1f GB/s, optimizer %.3f "
      "ns/param\n",
      m.sgemm_flops_per_s / 1e9, m.gelu_s_per_element * 1e9, m.gelu_grad_s_per_element * 1e9,
      m.copy_bytes_per_s / 1e9, m.optimizer_s_per_param * 1e9);
  out << absl::StrFormat(
      "workload  residual MLP %d blocks x hidden %d (%d params), micro-batch %d per rank, fp32 "
      "AdamW, %d rank%s, backend %s\n",
      w.blocks, w.hidden, MlpParams(w), w.micro_batch, r->ranks, r->ranks == 1 ? "" : "s",
      r->backend);
  out << (r->cpus_per_rank == 0
              ? absl::StrFormat("cpus      not bound: the ranks' threads share all %d cores\n",
                                m.cores)
              : absl::StrFormat("cpus      %d per rank (bound): %d of %d cores usable\n",
                                r->cpus_per_rank, predictions[0].usable_cores, m.cores));
  if (w.hidden != m.calibrated_hidden || w.micro_batch != m.calibrated_micro_batch) {
    out << absl::StrFormat(
        "note:     sgemm was calibrated at hidden %d, micro-batch %d; other shapes run at "
        "other rates (calibrate with --hidden %d --micro-batch %d)\n",
        m.calibrated_hidden, m.calibrated_micro_batch, w.hidden, w.micro_batch);
  }
  out << "ms per step\n";
  out << absl::StrFormat("  %5s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "stage", "gemm", "elemw",
                         "compute", "optim", "comm", "exposed", "loader", "content.", "total");
  for (size_t k = 0; k < predictions.size(); ++k) {
    const EngineStepPrediction& p = predictions[k];
    out << absl::StrFormat("  %5d %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n",
                           r->stages[k], p.gemm * 1e3, p.elementwise * 1e3, p.compute * 1e3,
                           p.optimizer * 1e3, p.comm_total * 1e3, p.exposed_comm * 1e3,
                           p.loader * 1e3, p.contention * 1e3, p.total * 1e3);
  }
  out << "total = max(compute + optimizer + exposed, ranks x (compute + loader + optimizer + comm"
         " x min(1, cores/ranks)) / usable cores); docs/estimator.md\n";
  return kExitOk;
}

}  // namespace zeroshard::tools
