#include "tools/machine_profile.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "zeroshard/estimate/byte_units.h"
#include "zeroshard/quote.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

using Json = nlohmann::json;

constexpr const char* kOpNames[] = {"all_reduce", "reduce_scatter", "all_gather"};

// A field's closed range, in the file's unit. The ranges are wide (a slow
// laptop core to a GPU, a loopback to a slow network) yet keep every
// predicted time finite: the workload limits (hidden <= 2^16, blocks <=
// 2^16, micro-batch <= 2^20) keep a step's FLOPs, elements and bytes below
// 10^23, and no rate is below 10^6 per second (nor a time per item above
// 10^-3 s), so no time passes 10^17 s; PredictMlpEngineStep then bounds
// each one by kMaxPredictedStepSeconds.
struct FieldRange {
  double min;
  double max;
  const char* unit;
  bool integer = false;
};

constexpr FieldRange kCoresRange{1, 1 << 20, "CPUs", true};
constexpr FieldRange kThreadsRange{1, 1 << 20, "threads", true};
constexpr FieldRange kHiddenRange{1, 1 << 16, "elements", true};
constexpr FieldRange kMicroBatchRange{1, 1 << 20, "samples", true};
constexpr FieldRange kNetworkCountRange{1, 1 << 20, "nodes or ranks", true};
constexpr FieldRange kGflopsRange{1e-3, 1e6, "10^9 FLOP/s"};
constexpr FieldRange kNsPerElementRange{1e-3, 1e6, "ns per element"};
constexpr FieldRange kNsPerParamRange{1e-3, 1e6, "ns per param"};
constexpr FieldRange kGbpsRange{1e-3, 1e6, "10^9 bytes/s"};
constexpr FieldRange kAlphaUsRange{0, 1e6, "us"};
constexpr FieldRange kSizeBytesRange{0, 4611686018427387904.0, "bytes"};  // 2^62
constexpr FieldRange kSecondsRange{0, 1e6, "s"};
constexpr size_t kMaxStringBytes = 256;
constexpr size_t kMaxMeasuredPoints = 4096;

// The rates: one row per field, in the file's unit; value x scale is the
// MachineProfile member's (SI) value. Parsing and ValidateMachineProfile
// walk the same rows.
struct RateField {
  const char* section;
  const char* key;
  double MachineProfile::*member;
  double scale;
  FieldRange range;
};

constexpr RateField kRateFields[] = {
    {"sgemm", "gflops", &MachineProfile::sgemm_flops_per_s, 1e9, kGflopsRange},
    {"elementwise", "gelu_ns", &MachineProfile::gelu_s_per_element, 1e-9, kNsPerElementRange},
    {"elementwise", "gelu_grad_ns", &MachineProfile::gelu_grad_s_per_element, 1e-9,
     kNsPerElementRange},
    {"elementwise", "copy_gbps", &MachineProfile::copy_bytes_per_s, 1e9, kGbpsRange},
    {"optimizer", "ns_per_param", &MachineProfile::optimizer_s_per_param, 1e-9, kNsPerParamRange},
};

// The optional offload section: each rate absent (0, not measured) or in
// range.
struct OffloadRateField {
  const char* key;
  double MachineProfile::Offload::*member;
};
constexpr OffloadRateField kOffloadRateFields[] = {
    {"host_copy_gbps", &MachineProfile::Offload::host_copy_bytes_per_s},
    {"nvme_read_gbps", &MachineProfile::Offload::nvme_read_bytes_per_s},
    {"nvme_write_gbps", &MachineProfile::Offload::nvme_write_bytes_per_s},
};

// A collective fit's alpha (us in the file, s in memory) and beta (GB/s,
// bytes/s).
constexpr double kAlphaScale = 1e-6;

constexpr double kBetaScale = 1e9;

std::string OutsideRange(const std::string& value_text, const FieldRange& range) {
  return absl::StrFormat("is %s, outside its range [%s, %s] (%s)", value_text,
                         FormatNumber(range.min), FormatNumber(range.max), range.unit);
}

bool InRange(double v, const FieldRange& range, double scale = 1) {
  // NaN fails both comparisons. Rounding is monotonic, so a file value in
  // [min, max] stays in [min x scale, max x scale] once scaled.
  return v >= range.min * scale && v <= range.max * scale;
}

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

  // A number in `range`; an integer too when the range's unit says so.
  absl::StatusOr<double> Number(const Json& value, const std::string& path,
                                const FieldRange& range) const {
    const std::string text = QuoteForMessage(value.dump(), 32);
    if (!value.is_number()) {
      return Error(path, absl::StrFormat("must be a number (got %s)", text));
    }
    const double v = value.get<double>();
    if (!InRange(v, range)) return Error(path, OutsideRange(value.dump(), range));
    if (range.integer && v != std::floor(v)) {
      return Error(path,
                   absl::StrFormat("is %s, not a whole number of %s", value.dump(), range.unit));
    }
    return v;
  }

  absl::StatusOr<double> Number(const Json& parent, const std::string& name,
                                const std::string& path, const FieldRange& range) const {
    auto it = parent.find(name);
    if (it == parent.end()) return Error(path, "is missing");
    return Number(*it, path, range);
  }

  // A short, printable string; "unknown" when the field is absent.
  absl::StatusOr<std::string> String(const Json& parent, const std::string& name) const {
    auto it = parent.find(name);
    if (it == parent.end()) return std::string("unknown");
    if (!it->is_string()) {
      return Error(name,
                   absl::StrFormat("must be a string (got %s)", QuoteForMessage(it->dump(), 32)));
    }
    std::string text = it->get<std::string>();
    if (absl::Status s = CheckString(text); !s.ok()) return Error(name, std::string(s.message()));
    return text;
  }

  // At most kMaxStringBytes bytes, no control characters: it is printed
  // as it is in the estimate's table.
  static absl::Status CheckString(const std::string& text) {
    if (text.size() > kMaxStringBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "is %d bytes long, more than the %d a name may have", text.size(), kMaxStringBytes));
    }
    for (char c : text) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrFormat("is %s, which holds a control character", QuoteForMessage(text, 32)));
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

// The measured points of a fit (kept for the record): optional, but when
// given, two lists of the same length of numbers in range.
absl::Status ReadPoints(const FieldReader& r, const Json& op, const std::string& path,
                        CollectiveFit* fit) {
  auto sizes = op.find("sizes_bytes");
  auto seconds = op.find("seconds");
  if (sizes == op.end() && seconds == op.end()) return absl::OkStatus();
  if (sizes == op.end() || seconds == op.end() || !sizes->is_array() || !seconds->is_array() ||
      sizes->size() != seconds->size() || sizes->size() > kMaxMeasuredPoints) {
    return r.Error(path + ".sizes_bytes",
                   absl::StrFormat("and '%s.seconds' must be lists of the same length, at most %d "
                                   "(the measured points), or both absent",
                                   path, kMaxMeasuredPoints));
  }
  for (size_t i = 0; i < sizes->size(); ++i) {
    ZS_ASSIGN_OR_RETURN(
        const double bytes,
        r.Number((*sizes)[i], absl::StrCat(path, ".sizes_bytes[", i, "]"), kSizeBytesRange));
    ZS_ASSIGN_OR_RETURN(
        const double s,
        r.Number((*seconds)[i], absl::StrCat(path, ".seconds[", i, "]"), kSecondsRange));
    fit->sizes_bytes.push_back(bytes);
    fit->seconds.push_back(s);
  }
  return absl::OkStatus();
}

absl::StatusOr<CollectiveFit> ReadFit(const FieldReader& r, const Json& op,
                                      const std::string& path) {
  CollectiveFit fit;
  ZS_ASSIGN_OR_RETURN(const double alpha_us,
                      r.Number(op, "alpha_us", path + ".alpha_us", kAlphaUsRange));
  ZS_ASSIGN_OR_RETURN(const double beta_gbps,
                      r.Number(op, "beta_gbps", path + ".beta_gbps", kGbpsRange));
  fit.alpha_s = alpha_us * kAlphaScale;
  fit.beta_bytes_per_s = beta_gbps * kBetaScale;
  ZS_RETURN_IF_ERROR(ReadPoints(r, op, path, &fit));
  return fit;
}

absl::Status CheckFit(const CollectiveFit& fit, const std::string& path) {
  auto bad = [&](const std::string& field, double value, const FieldRange& range) {
    return absl::InvalidArgumentError(absl::StrFormat("machine profile: field '%s.%s' %s", path,
                                                      field,
                                                      OutsideRange(FormatNumber(value), range)));
  };
  if (!InRange(fit.alpha_s, kAlphaUsRange, kAlphaScale)) {
    return bad("alpha_us", fit.alpha_s / kAlphaScale, kAlphaUsRange);
  }
  if (!InRange(fit.beta_bytes_per_s, kGbpsRange, kBetaScale)) {
    return bad("beta_gbps", fit.beta_bytes_per_s / kBetaScale, kGbpsRange);
  }
  if (fit.sizes_bytes.size() != fit.seconds.size() || fit.sizes_bytes.size() > kMaxMeasuredPoints) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "machine profile: field '%s.sizes_bytes' has %d points and '%s.seconds' %d; they must "
        "pair up, at most %d",
        path, fit.sizes_bytes.size(), path, fit.seconds.size(), kMaxMeasuredPoints));
  }
  for (size_t i = 0; i < fit.sizes_bytes.size(); ++i) {
    if (!InRange(fit.sizes_bytes[i], kSizeBytesRange)) {
      return bad(absl::StrCat("sizes_bytes[", i, "]"), fit.sizes_bytes[i], kSizeBytesRange);
    }
    if (!InRange(fit.seconds[i], kSecondsRange)) {
      return bad(absl::StrCat("seconds[", i, "]"), fit.seconds[i], kSecondsRange);
    }
  }
  return absl::OkStatus();
}

Json FitJson(const CollectiveFit& fit) {
  return {{"alpha_us", fit.alpha_s / kAlphaScale},
          {"beta_gbps", fit.beta_bytes_per_s / kBetaScale},
          {"sizes_bytes", fit.sizes_bytes},
          {"seconds", fit.seconds}};
}

}  // namespace

absl::Status ValidateMachineProfile(const MachineProfile& p) {
  auto bad = [](const std::string& field, double value, const FieldRange& range) {
    return absl::InvalidArgumentError(absl::StrFormat("machine profile: field '%s' %s", field,
                                                      OutsideRange(FormatNumber(value), range)));
  };
  const std::pair<const char*, const std::string*> strings[] = {
      {"machine", &p.machine}, {"cpu", &p.cpu}, {"date", &p.date}, {"blas", &p.blas}};
  for (const auto& [name, text] : strings) {
    if (absl::Status s = FieldReader::CheckString(*text); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("machine profile: field '%s' %s", name, s.message()));
    }
  }
  if (!InRange(p.cores, kCoresRange)) return bad("cores", p.cores, kCoresRange);
  if (!InRange(p.threads_per_rank, kThreadsRange)) {
    return bad("threads_per_rank", p.threads_per_rank, kThreadsRange);
  }
  if (!InRange(static_cast<double>(p.calibrated_hidden), kHiddenRange)) {
    return bad("calibrated_shapes.hidden", static_cast<double>(p.calibrated_hidden), kHiddenRange);
  }
  if (!InRange(static_cast<double>(p.calibrated_micro_batch), kMicroBatchRange)) {
    return bad("calibrated_shapes.micro_batch", static_cast<double>(p.calibrated_micro_batch),
               kMicroBatchRange);
  }
  for (const RateField& f : kRateFields) {
    const double v = p.*f.member;
    if (!InRange(v, f.range, f.scale)) {
      return bad(absl::StrCat(f.section, ".", f.key), v / f.scale, f.range);
    }
  }
  for (const OffloadRateField& f : kOffloadRateFields) {
    const double v = p.offload.*f.member;
    if (v != 0 && !InRange(v, kGbpsRange, 1e9)) {
      return bad(absl::StrCat("offload.", f.key), v / 1e9, kGbpsRange);
    }
  }
  for (const auto& [name, text] :
       {std::pair<const char*, const std::string*>{"offload.io_backend", &p.offload.io_backend},
        {"offload.dir", &p.offload.dir}}) {
    if (absl::Status s = FieldReader::CheckString(*text); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("machine profile: field '%s' %s", name, s.message()));
    }
  }
  if (p.network.measured()) {
    for (const auto& [name, value] : {std::pair<const char*, int>{"nodes", p.network.nodes},
                                      {"ranks_per_node", p.network.ranks_per_node}}) {
      if (value < 1 || value > 1 << 20) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "machine profile: field 'network.%s' is %d, outside its range [1, 1048576]", name,
            value));
      }
    }
    for (const auto& [name, fit] :
         {std::pair<const char*, const CollectiveFit*>{"intra_node", &p.network.intra_node},
          {"inter_node", &p.network.inter_node}}) {
      if (fit->beta_bytes_per_s > 0) {
        ZS_RETURN_IF_ERROR(CheckFit(*fit, absl::StrCat("network.", name)));
      }
    }
  }
  for (const auto& [backend, by_ranks] : p.collectives) {
    if (backend.empty() || !FieldReader::CheckString(backend).ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("machine profile: collectives backend %s is not a short name",
                          QuoteForMessage(backend, 32)));
    }
    for (const auto& [ranks, c] : by_ranks) {
      const std::string path = absl::StrCat("collectives.", backend, ".", ranks);
      if (ranks < 2 || ranks > 1 << 20) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "machine profile: field '%s' must be keyed by a rank count in [2, 1048576]", path));
      }
      const CollectiveFit* fits[] = {&c.all_reduce, &c.reduce_scatter, &c.all_gather};
      for (int k = 0; k < 3; ++k) {
        ZS_RETURN_IF_ERROR(CheckFit(*fits[k], absl::StrCat(path, ".", kOpNames[k])));
      }
    }
  }
  return absl::OkStatus();
}

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
    return r.Error(
        "schema",
        absl::StrCat("must be \"", kMachineProfileSchema, "\" (got ",
                     j.contains("schema") ? QuoteForMessage(j["schema"].dump(), 32) : "nothing",
                     ")"));
  }
  MachineProfile p;
  ZS_ASSIGN_OR_RETURN(p.machine, r.String(j, "machine"));
  ZS_ASSIGN_OR_RETURN(p.cpu, r.String(j, "cpu"));
  ZS_ASSIGN_OR_RETURN(p.date, r.String(j, "date"));
  ZS_ASSIGN_OR_RETURN(p.blas, r.String(j, "blas"));
  ZS_ASSIGN_OR_RETURN(const double cores, r.Number(j, "cores", "cores", kCoresRange));
  p.cores = static_cast<int>(cores);
  if (j.contains("threads_per_rank")) {
    ZS_ASSIGN_OR_RETURN(const double t,
                        r.Number(j, "threads_per_rank", "threads_per_rank", kThreadsRange));
    p.threads_per_rank = static_cast<int>(t);
  }
  ZS_ASSIGN_OR_RETURN(const Json* shapes, r.Object(j, "calibrated_shapes", "calibrated_shapes"));
  ZS_ASSIGN_OR_RETURN(const double hidden,
                      r.Number(*shapes, "hidden", "calibrated_shapes.hidden", kHiddenRange));
  ZS_ASSIGN_OR_RETURN(
      const double micro,
      r.Number(*shapes, "micro_batch", "calibrated_shapes.micro_batch", kMicroBatchRange));
  p.calibrated_hidden = static_cast<int64_t>(hidden);
  p.calibrated_micro_batch = static_cast<int64_t>(micro);

  for (const RateField& f : kRateFields) {
    ZS_ASSIGN_OR_RETURN(const Json* section, r.Object(j, f.section, f.section));
    ZS_ASSIGN_OR_RETURN(const double v,
                        r.Number(*section, f.key, absl::StrCat(f.section, ".", f.key), f.range));
    p.*f.member = v * f.scale;
  }

  if (j.contains("offload")) {
    ZS_ASSIGN_OR_RETURN(const Json* offload, r.Object(j, "offload", "offload"));
    for (const OffloadRateField& f : kOffloadRateFields) {
      if (!offload->contains(f.key)) continue;
      ZS_ASSIGN_OR_RETURN(const double v,
                          r.Number(*offload, f.key, absl::StrCat("offload.", f.key), kGbpsRange));
      p.offload.*f.member = v * 1e9;
    }
    for (const auto& [key, member] :
         {std::pair<const char*, std::string*>{"io_backend", &p.offload.io_backend},
          {"dir", &p.offload.dir}}) {
      if (!offload->contains(key)) continue;
      ZS_ASSIGN_OR_RETURN(*member, r.String(*offload, key));
    }
  }

  if (j.contains("network")) {
    ZS_ASSIGN_OR_RETURN(const Json* net, r.Object(j, "network", "network"));
    ZS_ASSIGN_OR_RETURN(const double nodes,
                        r.Number(*net, "nodes", "network.nodes", kNetworkCountRange));
    ZS_ASSIGN_OR_RETURN(
        const double per_node,
        r.Number(*net, "ranks_per_node", "network.ranks_per_node", kNetworkCountRange));
    p.network.nodes = static_cast<int>(nodes);
    p.network.ranks_per_node = static_cast<int>(per_node);
    for (const auto& [key, fit] :
         {std::pair<const char*, CollectiveFit*>{"intra_node", &p.network.intra_node},
          {"inter_node", &p.network.inter_node}}) {
      if (!net->contains(key)) continue;
      const std::string path = absl::StrCat("network.", key);
      ZS_ASSIGN_OR_RETURN(const Json* op, r.Object(*net, key, path));
      ZS_ASSIGN_OR_RETURN(*fit, ReadFit(r, *op, path));
    }
    if (!p.network.measured()) {
      return r.Error("network", "must hold 'intra_node', 'inter_node' or both");
    }
  }

  ZS_ASSIGN_OR_RETURN(const Json* colls, r.Object(j, "collectives", "collectives"));
  for (const auto& [backend, by_ranks] : colls->items()) {
    const std::string bpath = absl::StrCat("collectives.", backend);
    if (backend.empty() || !FieldReader::CheckString(backend).ok()) {
      return r.Error(absl::StrCat("collectives.", QuoteForMessage(backend, 32)),
                     "must be keyed by a backend name (local, mpi)");
    }
    if (!by_ranks.is_object()) return r.Error(bpath, "must be an object keyed by rank count");
    for (const auto& [ranks_text, ops] : by_ranks.items()) {
      const std::string rpath = absl::StrCat(bpath, ".", ranks_text);
      int ranks = 0;
      if (!absl::SimpleAtoi(ranks_text, &ranks) || ranks < 2 || ranks > 1 << 20) {
        return r.Error(rpath, "must be keyed by a rank count in [2, 1048576]");
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
  Json offload = Json::object();
  for (const OffloadRateField& f : kOffloadRateFields) {
    if (p.offload.*f.member > 0) offload[f.key] = p.offload.*f.member / 1e9;
  }
  if (!offload.empty()) {
    if (!p.offload.io_backend.empty()) offload["io_backend"] = p.offload.io_backend;
    if (!p.offload.dir.empty()) offload["dir"] = p.offload.dir;
    offload["what"] =
        "host_copy: the Device's copy of a gradient chunk to the host and a param chunk back; "
        "nvme: sequential reads and writes of swap files through SwapFiles (the engine's I/O "
        "path) in dir, with io_backend";
    j["offload"] = offload;
  }
  if (p.network.measured()) {
    Json net = {{"nodes", p.network.nodes}, {"ranks_per_node", p.network.ranks_per_node}};
    if (p.network.intra_node.beta_bytes_per_s > 0)
      net["intra_node"] = FitJson(p.network.intra_node);
    if (p.network.inter_node.beta_bytes_per_s > 0)
      net["inter_node"] = FitJson(p.network.inter_node);
    net["what"] =
        "one-way time of a message between two ranks on one node (intra_node) and on two nodes "
        "(inter_node), mpi Send/Recv ping-pong halved; beta the least-squares slope over "
        "sizes_bytes, alpha the smallest message's time less its bytes at beta";
    j["network"] = net;
  }
  return j.dump(1) + "\n";
}

}  // namespace zeroshard
