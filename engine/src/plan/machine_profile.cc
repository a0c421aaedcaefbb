#include "zeroshard/machine_profile.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

using Json = nlohmann::json;

constexpr const char* kOpNames[] = {"all_reduce", "reduce_scatter", "all_gather"};

// Reads profile fields, naming the file and the dotted field in every error.
class FieldReader {
 public:
  explicit FieldReader(absl::string_view source) : source_(source) {}

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: field '%s' %s; write the profile with `zeroshard calibrate` or fix the field", source_,
        field, what));
  }

  absl::StatusOr<const Json*> Object(const Json& parent, const std::string& name,
                                     const std::string& path) const {
    auto it = parent.find(name);
    if (it == parent.end()) return Error(path, "is missing");
    if (!it->is_object()) return Error(path, "must be an object");
    return &*it;
  }

  absl::StatusOr<double> Positive(const Json& parent, const std::string& name,
                                  const std::string& path) const {
    auto it = parent.find(name);
    if (it == parent.end()) return Error(path, "is missing");
    if (!it->is_number())
      return Error(path, absl::StrCat("must be a number (got ", it->dump(), ")"));
    const double v = it->get<double>();
    if (!(v > 0) || !std::isfinite(v)) {
      return Error(path, absl::StrCat("must be a positive number (got ", it->dump(), ")"));
    }
    return v;
  }

  absl::StatusOr<double> NonNegative(const Json& parent, const std::string& name,
                                     const std::string& path) const {
    auto it = parent.find(name);
    if (it == parent.end()) return Error(path, "is missing");
    if (!it->is_number() || !(it->get<double>() >= 0) || !std::isfinite(it->get<double>())) {
      return Error(path, absl::StrCat("must be a number >= 0 (got ", it->dump(), ")"));
    }
    return it->get<double>();
  }

  std::string String(const Json& parent, const std::string& name) const {
    auto it = parent.find(name);
    return it != parent.end() && it->is_string() ? it->get<std::string>() : "unknown";
  }

 private:
  std::string source_;
};

absl::StatusOr<CollectiveFit> ReadFit(const FieldReader& r, const Json& op,
                                      const std::string& path) {
  CollectiveFit fit;
  ZS_ASSIGN_OR_RETURN(const double alpha_us, r.NonNegative(op, "alpha_us", path + ".alpha_us"));
  ZS_ASSIGN_OR_RETURN(const double beta_gbps, r.Positive(op, "beta_gbps", path + ".beta_gbps"));
  fit.alpha_s = alpha_us * 1e-6;
  fit.beta_bytes_per_s = beta_gbps * 1e9;
  auto sizes = op.find("sizes_bytes");
  auto seconds = op.find("seconds");
  if (sizes != op.end() && seconds != op.end() && sizes->is_array() && seconds->is_array()) {
    for (const Json& v : *sizes) fit.sizes_bytes.push_back(v.is_number() ? v.get<double>() : 0.0);
    for (const Json& v : *seconds) fit.seconds.push_back(v.is_number() ? v.get<double>() : 0.0);
  }
  return fit;
}

Json FitJson(const CollectiveFit& fit) {
  return {{"alpha_us", fit.alpha_s * 1e6},
          {"beta_gbps", fit.beta_bytes_per_s / 1e9},
          {"sizes_bytes", fit.sizes_bytes},
          {"seconds", fit.seconds}};
}

}  // namespace

absl::StatusOr<MachineProfile> ParseMachineProfile(absl::string_view json,
                                                   absl::string_view source) {
  const Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not a JSON object; write a machine profile with `zeroshard calibrate --out %s`",
        source, source));
  }
  const FieldReader r(source);
  if (!j.contains("schema") || !j["schema"].is_string() ||
      j["schema"].get<std::string>() != kMachineProfileSchema) {
    return r.Error("schema",
                   absl::StrCat("must be \"", kMachineProfileSchema, "\" (got ",
                                j.contains("schema") ? j["schema"].dump() : "nothing", ")"));
  }
  MachineProfile p;
  p.machine = r.String(j, "machine");
  p.cpu = r.String(j, "cpu");
  p.date = r.String(j, "date");
  p.blas = r.String(j, "blas");
  ZS_ASSIGN_OR_RETURN(const double cores, r.Positive(j, "cores", "cores"));
  if (cores != std::floor(cores) || cores > 1 << 20) return r.Error("cores", "must be an integer");
  p.cores = static_cast<int>(cores);
  if (j.contains("threads_per_rank")) {
    ZS_ASSIGN_OR_RETURN(const double t, r.Positive(j, "threads_per_rank", "threads_per_rank"));
    p.threads_per_rank = static_cast<int>(t);
  }
  ZS_ASSIGN_OR_RETURN(const Json* shapes, r.Object(j, "calibrated_shapes", "calibrated_shapes"));
  ZS_ASSIGN_OR_RETURN(const double hidden,
                      r.Positive(*shapes, "hidden", "calibrated_shapes.hidden"));
  ZS_ASSIGN_OR_RETURN(const double micro,
                      r.Positive(*shapes, "micro_batch", "calibrated_shapes.micro_batch"));
  p.calibrated_hidden = static_cast<int64_t>(hidden);
  p.calibrated_micro_batch = static_cast<int64_t>(micro);

  ZS_ASSIGN_OR_RETURN(const Json* sgemm, r.Object(j, "sgemm", "sgemm"));
  ZS_ASSIGN_OR_RETURN(const double gflops, r.Positive(*sgemm, "gflops", "sgemm.gflops"));
  p.sgemm_flops_per_s = gflops * 1e9;

  ZS_ASSIGN_OR_RETURN(const Json* elem, r.Object(j, "elementwise", "elementwise"));
  ZS_ASSIGN_OR_RETURN(const double gelu_ns, r.Positive(*elem, "gelu_ns", "elementwise.gelu_ns"));
  ZS_ASSIGN_OR_RETURN(const double grad_ns,
                      r.Positive(*elem, "gelu_grad_ns", "elementwise.gelu_grad_ns"));
  ZS_ASSIGN_OR_RETURN(const double copy_gbps,
                      r.Positive(*elem, "copy_gbps", "elementwise.copy_gbps"));
  p.gelu_s_per_element = gelu_ns * 1e-9;
  p.gelu_grad_s_per_element = grad_ns * 1e-9;
  p.copy_bytes_per_s = copy_gbps * 1e9;

  ZS_ASSIGN_OR_RETURN(const Json* opt, r.Object(j, "optimizer", "optimizer"));
  ZS_ASSIGN_OR_RETURN(const double opt_ns,
                      r.Positive(*opt, "ns_per_param", "optimizer.ns_per_param"));
  p.optimizer_s_per_param = opt_ns * 1e-9;

  ZS_ASSIGN_OR_RETURN(const Json* colls, r.Object(j, "collectives", "collectives"));
  for (const auto& [backend, by_ranks] : colls->items()) {
    const std::string bpath = absl::StrCat("collectives.", backend);
    if (!by_ranks.is_object()) return r.Error(bpath, "must be an object keyed by rank count");
    for (const auto& [ranks_text, ops] : by_ranks.items()) {
      const std::string rpath = absl::StrCat(bpath, ".", ranks_text);
      int ranks = 0;
      if (!absl::SimpleAtoi(ranks_text, &ranks) || ranks < 2 || ranks > 1 << 20) {
        return r.Error(rpath, "must be keyed by a rank count >= 2");
      }
      if (!ops.is_object()) return r.Error(rpath, "must be an object");
      CollectiveProfile c;
      CollectiveFit* fits[] = {&c.all_reduce, &c.reduce_scatter, &c.all_gather};
      for (int k = 0; k < 3; ++k) {
        const std::string opath = absl::StrCat(rpath, ".", kOpNames[k]);
        ZS_ASSIGN_OR_RETURN(const Json* op, r.Object(ops, kOpNames[k], opath));
        ZS_ASSIGN_OR_RETURN(*fits[k], ReadFit(r, *op, opath));
      }
      p.collectives[backend][ranks] = c;
    }
  }
  return p;
}

std::string MachineProfileJson(const MachineProfile& p) {
  Json colls = Json::object();
  for (const auto& [backend, by_ranks] : p.collectives) {
    Json b = Json::object();
    for (const auto& [ranks, c] : by_ranks) {
      b[std::to_string(ranks)] = {{"all_reduce", FitJson(c.all_reduce)},
                                  {"reduce_scatter", FitJson(c.reduce_scatter)},
                                  {"all_gather", FitJson(c.all_gather)}};
    }
    colls[backend] = b;
  }
  Json j = {
      {"schema", kMachineProfileSchema},
      {"machine", p.machine},
      {"cpu", p.cpu},
      {"date", p.date},
      {"cores", p.cores},
      {"blas", p.blas},
      {"threads_per_rank", p.threads_per_rank},
      {"units",
       {{"gflops", "10^9 floating-point operations per second"},
        {"ns", "nanoseconds"},
        {"gbps", "10^9 bytes per second"},
        {"us", "microseconds"},
        {"bytes",
         "nccl-tests' buffer: all-reduce buffer, reduce-scatter input, all-gather "
         "output"}}},
      {"calibrated_shapes",
       {{"hidden", p.calibrated_hidden}, {"micro_batch", p.calibrated_micro_batch}}},
      {"sgemm",
       {{"gflops", p.sgemm_flops_per_s / 1e9},
        {"what",
         "cblas_sgemm, the residual MLP's six shapes (forward 2, backward 4) at "
         "calibrated_shapes, total FLOPs / total time, threads_per_rank threads"}}},
      {"elementwise",
       {{"gelu_ns", p.gelu_s_per_element * 1e9},
        {"gelu_grad_ns", p.gelu_grad_s_per_element * 1e9},
        {"copy_gbps", p.copy_bytes_per_s / 1e9},
        {"what",
         "exact (erf) GELU and its derivative per element; memcpy of one block's "
         "params (bytes counted once)"}}},
      {"optimizer",
       {{"ns_per_param", p.optimizer_s_per_param * 1e9},
        {"what",
         "Engine::Step() on 1 rank, fp32 AdamW with clipping (norm, clip, fused "
         "update), per param"}}},
      {"collectives", colls},
  };
  return j.dump(1) + "\n";
}

}  // namespace zeroshard
