#include "engine/src/checkpoint/format.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/crc32c.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/layout/flat_layout.h"
#include "nlohmann/json.hpp"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

using nlohmann::json;

constexpr char kFormatName[] = "zeroshard-checkpoint";
constexpr char kManifestCrcField[] = "manifest_crc32c";
constexpr char kHeaderMagic[8] = {'Z', 'S', 'H', 'A', 'R', 'D', '0', '1'};
constexpr char kTrailerMagic[8] = {'Z', 'S', 'H', 'A', 'R', 'D', 'E', 'N'};
// Bytes read per pass when checksumming a whole file.
constexpr size_t kVerifyBlockBytes = size_t{4} << 20;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t rank;
  uint32_t world;
  uint32_t units;
  uint32_t tensors;
  uint32_t chunk_elements;
  uint64_t data_bytes;
  uint8_t reserved[24];
};
static_assert(sizeof(FileHeader) == kHeaderBytes, "the header is 64 bytes");

struct FileTrailer {
  uint64_t index_offset;
  uint64_t index_entries;
  char magic[8];
};
static_assert(sizeof(FileTrailer) == kTrailerBytes, "the trailer is 24 bytes");

bool HostIsLittleEndian() {
  const uint32_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// Reads one field with an error that names it ("manifest.json: field
// 'optimizer.beta1' is missing").
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  absl::StatusOr<const json*> Get(const char* key, json::value_t type) const {
    if (!object_.is_object() || !object_.contains(key)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: field '%s%s' is missing; the manifest is damaged or from another tool", source_,
          prefix_, key));
    }
    const json& v = object_.at(key);
    const bool number = type == json::value_t::number_float;
    const bool ok = number                                  ? v.is_number()
                    : type == json::value_t::number_integer ? v.is_number_integer()
                                                            : v.type() == type;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: field '%s%s' is %s, of the wrong type",
                                                        source_, prefix_, key, v.dump()));
    }
    return &v;
  }
  absl::StatusOr<int64_t> Int(const char* key, int64_t min, int64_t max) const {
    ZS_ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::number_integer));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max)) {
      return OutOfRange(key, v->dump(), min, max);
    }
    const int64_t value = v->get<int64_t>();
    if (value < min || value > max) return OutOfRange(key, v->dump(), min, max);
    return value;
  }
  absl::StatusOr<double> Real(const char* key) const {
    ZS_ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::number_float));
    return v->get<double>();
  }
  absl::StatusOr<std::string> String(const char* key) const {
    ZS_ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::string));
    return v->get<std::string>();
  }
  absl::StatusOr<bool> Bool(const char* key) const {
    ZS_ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::boolean));
    return v->get<bool>();
  }
  Fields Child(const json& object, const std::string& name) const {
    return Fields(object, source_, prefix_ + name + ".");
  }
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  absl::Status OutOfRange(const char* key, const std::string& value, int64_t min,
                          int64_t max) const {
    return absl::InvalidArgumentError(absl::StrFormat("%s: field '%s%s' is %s, outside [%d, %d]",
                                                      source_, prefix_, key, value, min, max));
  }

  const json& object_;
  std::string source_;
  std::string prefix_;
};

json TrainToJson(const TrainSpec& t) {
  json j;
  j["zero_stage"] = t.zero_stage;
  j["precision"] = PrecisionName(t.precision);
  j["grad_dtype"] = DTypeName(t.effective_grad_dtype());
  j["optimizer"] = {{"kind", t.optimizer.kind == OptimizerKind::kAdamW ? "AdamW" : "AdamL2"},
                    {"lr", t.optimizer.lr},
                    {"beta1", t.optimizer.beta1},
                    {"beta2", t.optimizer.beta2},
                    {"eps", t.optimizer.eps},
                    {"weight_decay", t.optimizer.weight_decay}};
  j["schedule"] = {
      {"kind", t.schedule.kind == LrSchedule::Kind::kConstant ? "constant" : "warmup-cosine"},
      {"warmup_steps", t.schedule.warmup_steps},
      {"total_steps", t.schedule.total_steps},
      {"min_lr_ratio", t.schedule.min_lr_ratio}};
  j["max_grad_norm"] = t.max_grad_norm;
  j["grad_accum_steps"] = t.grad_accum_steps;
  return j;
}

absl::StatusOr<TrainSpec> TrainFromJson(const Fields& f) {
  TrainSpec t;
  ZS_ASSIGN_OR_RETURN(t.zero_stage, f.Int("zero_stage", 0, 3));
  ZS_ASSIGN_OR_RETURN(std::string precision, f.String("precision"));
  absl::StatusOr<Precision> p = ParsePrecision(precision);
  if (!p.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: field '%sprecision': %s", f.source(),
                                                      f.prefix(), p.status().message()));
  }
  t.precision = *p;
  ZS_ASSIGN_OR_RETURN(std::string grad, f.String("grad_dtype"));
  absl::StatusOr<DType> g = ParseDType(grad);
  if (!g.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field '%sgrad_dtype' is '%s'", f.source(), f.prefix(), grad));
  }
  t.grad_dtype = *g;
  ZS_ASSIGN_OR_RETURN(const json* opt, f.Get("optimizer", json::value_t::object));
  const Fields o = f.Child(*opt, "optimizer");
  ZS_ASSIGN_OR_RETURN(std::string kind, o.String("kind"));
  if (kind != "AdamW" && kind != "AdamL2") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: field '%soptimizer.kind' is '%s', not AdamW or AdamL2", f.source(), f.prefix(), kind));
  }
  t.optimizer.kind = kind == "AdamW" ? OptimizerKind::kAdamW : OptimizerKind::kAdamL2;
  ZS_ASSIGN_OR_RETURN(t.optimizer.lr, o.Real("lr"));
  ZS_ASSIGN_OR_RETURN(t.optimizer.beta1, o.Real("beta1"));
  ZS_ASSIGN_OR_RETURN(t.optimizer.beta2, o.Real("beta2"));
  ZS_ASSIGN_OR_RETURN(t.optimizer.eps, o.Real("eps"));
  ZS_ASSIGN_OR_RETURN(t.optimizer.weight_decay, o.Real("weight_decay"));
  ZS_ASSIGN_OR_RETURN(const json* sched, f.Get("schedule", json::value_t::object));
  const Fields s = f.Child(*sched, "schedule");
  ZS_ASSIGN_OR_RETURN(std::string skind, s.String("kind"));
  if (skind != "constant" && skind != "warmup-cosine") {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field '%sschedule.kind' is '%s', not constant or warmup-cosine",
                        f.source(), f.prefix(), skind));
  }
  t.schedule.kind =
      skind == "constant" ? LrSchedule::Kind::kConstant : LrSchedule::Kind::kWarmupCosine;
  ZS_ASSIGN_OR_RETURN(t.schedule.warmup_steps, s.Int("warmup_steps", 0, int64_t{1} << 50));
  ZS_ASSIGN_OR_RETURN(t.schedule.total_steps, s.Int("total_steps", 0, int64_t{1} << 50));
  ZS_ASSIGN_OR_RETURN(t.schedule.min_lr_ratio, s.Real("min_lr_ratio"));
  ZS_ASSIGN_OR_RETURN(t.max_grad_norm, f.Real("max_grad_norm"));
  ZS_ASSIGN_OR_RETURN(const int64_t accum, f.Int("grad_accum_steps", 1, 1 << 20));
  t.grad_accum_steps = static_cast<int>(accum);
  absl::Status valid = t.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field 'train': %s", f.source(), valid.message()));
  }
  return t;
}

absl::Status Damaged(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrFormat(
      "%s: %s; the file is damaged: load an earlier checkpoint (docs/checkpoint.md)", path, what));
}

}  // namespace

std::string StepDirName(int64_t step) { return absl::StrFormat("step_%08d", step); }
std::string RankFileName(int rank) { return absl::StrFormat("rank_%05d.bin", rank); }

int64_t TensorOffset(const std::vector<int64_t>& shard_numel, int unit, int tensor) {
  int64_t floats = 0;
  for (int u = 0; u < unit; ++u) floats += kTensorsPerUnit * shard_numel[u];
  floats += tensor * shard_numel[unit];
  return kHeaderBytes + floats * static_cast<int64_t>(sizeof(float));
}

int64_t FirstChunk(const std::vector<int64_t>& shard_numel, int unit, int tensor,
                   int64_t chunk_elements) {
  int64_t chunks = 0;
  for (int u = 0; u <= unit; ++u) {
    const int64_t c = (shard_numel[u] + chunk_elements - 1) / chunk_elements;
    chunks += u < unit ? kTensorsPerUnit * c : tensor * c;
  }
  return chunks;
}

int64_t IndexEntries(const std::vector<int64_t>& shard_numel, int64_t chunk_elements) {
  return FirstChunk(shard_numel, static_cast<int>(shard_numel.size()) - 1, kTensorsPerUnit,
                    chunk_elements);
}

int64_t DataBytes(const Manifest& manifest) {
  int64_t floats = 0;
  for (int64_t n : manifest.shard_numel) floats += kTensorsPerUnit * n;
  return floats * static_cast<int64_t>(sizeof(float));
}

int64_t FileBytes(const std::vector<int64_t>& shard_numel, int64_t chunk_elements) {
  int64_t floats = 0;
  for (int64_t n : shard_numel) floats += kTensorsPerUnit * n;
  return kHeaderBytes + floats * static_cast<int64_t>(sizeof(float)) +
         IndexEntries(shard_numel, chunk_elements) * static_cast<int64_t>(sizeof(uint32_t)) +
         kTrailerBytes;
}

std::string ManifestToJson(const Manifest& m) {
  json j;
  j["format"] = kFormatName;
  j["version"] = m.version;
  j["step"] = m.step;
  j["applied_steps"] = m.applied_steps;
  j["skipped_steps"] = m.skipped_steps;
  j["world_size"] = m.world_size;
  j["train"] = TrainToJson(m.train);
  j["loss_scale"] = {{"scale", m.loss_scale},
                     {"hysteresis_left", m.hysteresis_left},
                     {"clean_steps", m.clean_steps},
                     {"skips_at_min_scale", m.skips_at_min_scale}};
  json units = json::array();
  for (size_t u = 0; u < m.model.units.size(); ++u) {
    const UnitSpec& unit = m.model.units[u];
    json params = json::array();
    for (const ParamSpec& p : unit.params) {
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"no_decay", p.no_decay}});
    }
    units.push_back({{"name", unit.name},
                     {"params", params},
                     {"used_numel", m.used_numel[u]},
                     {"shard_numel", m.shard_numel[u]}});
  }
  j["model"] = {{"fingerprint", absl::StrFormat("%016x", m.model_fingerprint)},
                {"num_params", m.model.NumParams()},
                {"units", units}};
  j["layout"] = {{"byte_order", "little"},
                 {"tensors", {kTensorNames[0], kTensorNames[1], kTensorNames[2]}},
                 {"chunk_elements", m.chunk_elements},
                 {"param_alignment", kParamAlignment},
                 {"shard_quantum", kShardQuantum}};
  json files = json::array();
  for (const FileRecord& f : m.files) {
    files.push_back({{"name", f.name},
                     {"bytes", f.bytes},
                     {"crc32c", f.crc32c},
                     {"index_crc32c", f.index_crc32c},
                     {"unit_crc32c", f.unit_crc32c}});
  }
  j["files"] = files;
  j["trainer_state"] = json::parse(m.trainer_state.empty() ? "{}" : m.trainer_state, nullptr,
                                   /*allow_exceptions=*/false);
  // The manifest's own checksum: over the document without this field, as
  // dumped here. Dumping is canonical (sorted keys, shortest round-trip
  // numbers), so the reader recomputes it from the parsed document.
  const std::string body = j.dump(1);
  j[kManifestCrcField] = Crc32c(body.data(), body.size());
  return j.dump(1) + "\n";
}

absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& source) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not a JSON object; the manifest is damaged: load an earlier checkpoint", source));
  }
  const auto crc = doc.find(kManifestCrcField);
  if (crc == doc.end() || !crc->is_number_unsigned() || crc->get<uint64_t>() > UINT32_MAX) {
    return absl::DataLossError(absl::StrFormat(
        "%s: field '%s' is missing or not a CRC32C; the manifest is damaged: load an earlier "
        "checkpoint",
        source, kManifestCrcField));
  }
  const uint32_t stored = static_cast<uint32_t>(crc->get<uint64_t>());
  doc.erase(crc);
  const std::string body = doc.dump(1);
  const uint32_t actual = Crc32c(body.data(), body.size());
  if (actual != stored) {
    return absl::DataLossError(absl::StrFormat(
        "%s: CRC32C mismatch (stored %08x, computed %08x): the manifest was damaged or edited; "
        "load an earlier checkpoint",
        source, stored, actual));
  }
  return ParseManifestContent(doc.dump(), source);
}

absl::StatusOr<Manifest> ParseManifestContent(const std::string& text, const std::string& source) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not a JSON object; the manifest is damaged: load an earlier checkpoint", source));
  }
  const Fields f(doc, source, "");
  ZS_ASSIGN_OR_RETURN(std::string format, f.String("format"));
  if (format != kFormatName) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field 'format' is '%s', not '%s': not a zeroshard checkpoint", source,
                        format, kFormatName));
  }
  Manifest m;
  ZS_ASSIGN_OR_RETURN(const int64_t version, f.Int("version", 1, 1 << 20));
  if (version != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: field 'version' is %d; this build reads version %d (a newer zeroshard wrote it?)",
        source, version, kFormatVersion));
  }
  ZS_ASSIGN_OR_RETURN(m.step, f.Int("step", 0, int64_t{1} << 50));
  ZS_ASSIGN_OR_RETURN(m.applied_steps, f.Int("applied_steps", 0, m.step));
  ZS_ASSIGN_OR_RETURN(m.skipped_steps, f.Int("skipped_steps", 0, m.step));
  if (m.applied_steps + m.skipped_steps != m.step) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: fields 'applied_steps' %d and 'skipped_steps' %d do not add up to 'step' %d", source,
        m.applied_steps, m.skipped_steps, m.step));
  }
  ZS_ASSIGN_OR_RETURN(const int64_t world, f.Int("world_size", 1, kMaxWorldSize));
  m.world_size = static_cast<int>(world);
  ZS_ASSIGN_OR_RETURN(const json* files, f.Get("files", json::value_t::array));
  if (files->size() != static_cast<size_t>(m.world_size)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field 'files' lists %d files for a world of %d ranks", source,
                        files->size(), m.world_size));
  }
  ZS_ASSIGN_OR_RETURN(const json* train, f.Get("train", json::value_t::object));
  ZS_ASSIGN_OR_RETURN(m.train, TrainFromJson(f.Child(*train, "train")));
  ZS_ASSIGN_OR_RETURN(const json* ls, f.Get("loss_scale", json::value_t::object));
  const Fields l = f.Child(*ls, "loss_scale");
  ZS_ASSIGN_OR_RETURN(m.loss_scale, l.Real("scale"));
  if (!(m.loss_scale > 0) || !std::isfinite(m.loss_scale)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: field 'loss_scale.scale' %g is not a positive number", source, m.loss_scale));
  }
  ZS_ASSIGN_OR_RETURN(const int64_t hysteresis, l.Int("hysteresis_left", 0, 1 << 20));
  m.hysteresis_left = static_cast<int>(hysteresis);
  ZS_ASSIGN_OR_RETURN(m.clean_steps, l.Int("clean_steps", 0, int64_t{1} << 50));
  ZS_ASSIGN_OR_RETURN(const int64_t skips, l.Int("skips_at_min_scale", 0, 1 << 20));
  m.skips_at_min_scale = static_cast<int>(skips);

  ZS_ASSIGN_OR_RETURN(const json* model, f.Get("model", json::value_t::object));
  const Fields mf = f.Child(*model, "model");
  ZS_ASSIGN_OR_RETURN(std::string fingerprint, mf.String("fingerprint"));
  m.model_fingerprint = std::strtoull(fingerprint.c_str(), nullptr, 16);
  ZS_ASSIGN_OR_RETURN(const json* units, mf.Get("units", json::value_t::array));
  if (units->empty() || units->size() > static_cast<size_t>(kMaxUnits)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field 'model.units' has %d entries; expected 1..%d", source,
                        units->size(), kMaxUnits));
  }
  for (size_t u = 0; u < units->size(); ++u) {
    const Fields uf = mf.Child((*units)[u], absl::StrFormat("units[%d]", u));
    UnitSpec unit;
    ZS_ASSIGN_OR_RETURN(unit.name, uf.String("name"));
    ZS_ASSIGN_OR_RETURN(const json* params, uf.Get("params", json::value_t::array));
    for (size_t p = 0; p < params->size(); ++p) {
      const Fields pf = uf.Child((*params)[p], absl::StrFormat("params[%d]", p));
      ParamSpec param;
      ZS_ASSIGN_OR_RETURN(param.name, pf.String("name"));
      ZS_ASSIGN_OR_RETURN(param.no_decay, pf.Bool("no_decay"));
      ZS_ASSIGN_OR_RETURN(const json* shape, pf.Get("shape", json::value_t::array));
      for (const json& d : *shape) {
        if (!d.is_number_integer()) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: field '%sshape' holds %s, not an integer", source, pf.prefix(), d.dump()));
        }
        param.shape.push_back(d.get<int64_t>());
      }
      unit.params.push_back(std::move(param));
    }
    ZS_ASSIGN_OR_RETURN(const int64_t used, uf.Int("used_numel", 0, kMaxModelElements));
    ZS_ASSIGN_OR_RETURN(const int64_t shard, uf.Int("shard_numel", 0, kMaxModelElements));
    m.used_numel.push_back(used);
    m.shard_numel.push_back(shard);
    m.model.units.push_back(std::move(unit));
  }
  absl::Status valid = m.model.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field 'model': ", valid.message()));
  }
  // The layout rules that wrote the file must be this build's (checked
  // before any size is derived from the shard sizes).
  ZS_ASSIGN_OR_RETURN(FlatLayout layout, FlatLayout::Create(m.model, m.world_size));
  for (int u = 0; u < layout.num_units(); ++u) {
    if (layout.unit(u).used_numel != m.used_numel[u] ||
        layout.unit(u).shard_numel != m.shard_numel[u]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unit '%s' has used_numel %d and shard_numel %d, but this build lays it out as %d "
          "and %d for %d ranks: the checkpoint was written with other layout rules",
          source, m.model.units[u].name, m.used_numel[u], m.shard_numel[u],
          layout.unit(u).used_numel, layout.unit(u).shard_numel, m.world_size));
    }
  }
  ZS_ASSIGN_OR_RETURN(const json* layout_json, f.Get("layout", json::value_t::object));
  const Fields lf = f.Child(*layout_json, "layout");
  ZS_ASSIGN_OR_RETURN(std::string order, lf.String("byte_order"));
  if (order != "little" || !HostIsLittleEndian()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: field 'layout.byte_order' is '%s'; this build reads little-endian checkpoints on "
        "little-endian hosts",
        source, order));
  }
  ZS_ASSIGN_OR_RETURN(m.chunk_elements, lf.Int("chunk_elements", 1, int64_t{1} << 30));
  const int64_t expected_bytes = FileBytes(m.shard_numel, m.chunk_elements);
  for (size_t r = 0; r < files->size(); ++r) {
    const Fields ff = f.Child((*files)[r], absl::StrFormat("files[%d]", r));
    FileRecord rec;
    ZS_ASSIGN_OR_RETURN(rec.name, ff.String("name"));
    if (rec.name != RankFileName(static_cast<int>(r))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: field 'files[%d].name' is '%s', expected '%s'", source, r, rec.name,
                          RankFileName(static_cast<int>(r))));
    }
    ZS_ASSIGN_OR_RETURN(rec.bytes, ff.Int("bytes", 0, int64_t{1} << 62));
    if (rec.bytes != expected_bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: field 'files[%d].bytes' is %d, but the layout gives %d", source, r,
                          rec.bytes, expected_bytes));
    }
    ZS_ASSIGN_OR_RETURN(const int64_t crc, ff.Int("crc32c", 0, UINT32_MAX));
    ZS_ASSIGN_OR_RETURN(const int64_t index_crc, ff.Int("index_crc32c", 0, UINT32_MAX));
    rec.crc32c = static_cast<uint32_t>(crc);
    rec.index_crc32c = static_cast<uint32_t>(index_crc);
    ZS_ASSIGN_OR_RETURN(const json* unit_crcs, ff.Get("unit_crc32c", json::value_t::array));
    if (unit_crcs->size() != m.model.units.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: field 'files[%d].unit_crc32c' has %d entries for %d units", source,
                          r, unit_crcs->size(), m.model.units.size()));
    }
    for (const json& c : *unit_crcs) {
      if (!c.is_number_unsigned() || c.get<uint64_t>() > UINT32_MAX) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: field 'files[%d].unit_crc32c' holds %s, not a CRC32C", source, r, c.dump()));
      }
      rec.unit_crc32c.push_back(static_cast<uint32_t>(c.get<uint64_t>()));
    }
    m.files.push_back(std::move(rec));
  }
  ZS_ASSIGN_OR_RETURN(const json* state, f.Get("trainer_state", json::value_t::object));
  m.trainer_state = state->dump();
  return m;
}

absl::StatusOr<Manifest> ReadManifest(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, kManifestName);
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: no %s: not a complete checkpoint (a save that did not finish?); load the step "
          "that `latest` names",
          step_dir, kManifestName));
    }
    return text.status();
  }
  return ParseManifest(*text, path);
}

absl::StatusOr<FileRecord> WriteRankFile(const std::string& final_path, int rank, int world,
                                         const std::vector<int64_t>& shard_numel,
                                         const std::vector<float>& data) {
  const std::string tmp = final_path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrFormat("create %s: %s (errno %d)", tmp, std::strerror(errno), errno));
  }
  FileRecord rec;
  rec.name = RankFileName(rank);
  uint32_t file_crc = 0;
  auto put = [&](const void* bytes, size_t n) -> absl::Status {
    file_crc = Crc32cExtend(file_crc, bytes, n);
    return WriteAll(fd, bytes, n, tmp);
  };
  FileHeader header{};
  std::memcpy(header.magic, kHeaderMagic, sizeof(header.magic));
  header.version = kFormatVersion;
  header.rank = static_cast<uint32_t>(rank);
  header.world = static_cast<uint32_t>(world);
  header.units = static_cast<uint32_t>(shard_numel.size());
  header.tensors = kTensorsPerUnit;
  header.chunk_elements = static_cast<uint32_t>(kChunkElements);
  header.data_bytes = data.size() * sizeof(float);
  absl::Status status = put(&header, sizeof(header));
  std::vector<uint32_t> index;
  const float* p = data.data();
  for (size_t u = 0; u < shard_numel.size() && status.ok(); ++u) {
    uint32_t unit_crc = 0;
    for (int t = 0; t < kTensorsPerUnit && status.ok(); ++t) {
      for (int64_t begin = 0; begin < shard_numel[u] && status.ok(); begin += kChunkElements) {
        const int64_t n = std::min(kChunkElements, shard_numel[u] - begin);
        const size_t bytes = static_cast<size_t>(n) * sizeof(float);
        index.push_back(Crc32c(p, bytes));
        unit_crc = Crc32cExtend(unit_crc, p, bytes);
        status = put(p, bytes);
        p += n;
      }
    }
    rec.unit_crc32c.push_back(unit_crc);
  }
  const int64_t index_offset = kHeaderBytes + static_cast<int64_t>(data.size() * sizeof(float));
  if (status.ok()) {
    rec.index_crc32c = Crc32c(index.data(), index.size() * sizeof(uint32_t));
    status = put(index.data(), index.size() * sizeof(uint32_t));
  }
  FileTrailer trailer{};
  trailer.index_offset = static_cast<uint64_t>(index_offset);
  trailer.index_entries = index.size();
  std::memcpy(trailer.magic, kTrailerMagic, sizeof(trailer.magic));
  if (status.ok()) status = put(&trailer, sizeof(trailer));
  if (status.ok() && fsync(fd) != 0) {
    status = absl::InternalError(
        absl::StrFormat("fsync %s: %s (errno %d)", tmp, std::strerror(errno), errno));
  }
  if (close(fd) != 0 && status.ok()) {
    status = absl::InternalError(
        absl::StrFormat("close %s: %s (errno %d)", tmp, std::strerror(errno), errno));
  }
  if (!status.ok()) {
    unlink(tmp.c_str());
    return status;
  }
  rec.crc32c = file_crc;
  rec.bytes = FileBytes(shard_numel, kChunkElements);
  ZS_RETURN_IF_ERROR(RenamePath(tmp, final_path));
  return rec;
}

RankFileReader::RankFileReader(RankFileReader&& other) noexcept { *this = std::move(other); }

RankFileReader& RankFileReader::operator=(RankFileReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    other.fd_ = -1;
    manifest_ = other.manifest_;
    index_ = std::move(other.index_);
    chunk_ = std::move(other.chunk_);
  }
  return *this;
}

RankFileReader::~RankFileReader() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<RankFileReader> RankFileReader::Open(const std::string& step_dir,
                                                    const Manifest& manifest, int rank) {
  RankFileReader reader;
  reader.manifest_ = &manifest;
  reader.path_ = JoinPath(step_dir, RankFileName(rank));
  const FileRecord& rec = manifest.files[rank];
  absl::StatusOr<int64_t> size = FileSize(reader.path_);
  if (!size.ok()) {
    return absl::Status(size.status().code(),
                        absl::StrFormat("%s; the manifest lists it: the checkpoint is incomplete "
                                        "(copied without all rank files?)",
                                        size.status().message()));
  }
  if (*size != rec.bytes) {
    return Damaged(reader.path_,
                   absl::StrFormat("it has %d bytes, the manifest says %d (truncated or "
                                   "partly copied)",
                                   *size, rec.bytes));
  }
  reader.fd_ = open(reader.path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (reader.fd_ < 0) {
    return absl::InternalError(
        absl::StrFormat("open %s: %s (errno %d)", reader.path_, std::strerror(errno), errno));
  }
  FileHeader header{};
  ZS_RETURN_IF_ERROR(ReadAt(reader.fd_, 0, &header, sizeof(header), reader.path_));
  if (std::memcmp(header.magic, kHeaderMagic, sizeof(header.magic)) != 0 ||
      header.version != kFormatVersion || header.rank != static_cast<uint32_t>(rank) ||
      header.world != static_cast<uint32_t>(manifest.world_size) ||
      header.units != manifest.model.units.size() ||
      header.chunk_elements != static_cast<uint32_t>(manifest.chunk_elements)) {
    return Damaged(reader.path_,
                   absl::StrFormat("its header (bytes [0, 64)) does not describe rank %d of %d "
                                   "with %d units",
                                   rank, manifest.world_size, manifest.model.units.size()));
  }
  FileTrailer trailer{};
  ZS_RETURN_IF_ERROR(
      ReadAt(reader.fd_, rec.bytes - kTrailerBytes, &trailer, sizeof(trailer), reader.path_));
  const int64_t entries = IndexEntries(manifest.shard_numel, manifest.chunk_elements);
  const int64_t index_offset = kHeaderBytes + DataBytes(manifest);
  if (std::memcmp(trailer.magic, kTrailerMagic, sizeof(trailer.magic)) != 0 ||
      trailer.index_offset != static_cast<uint64_t>(index_offset) ||
      trailer.index_entries != static_cast<uint64_t>(entries)) {
    return Damaged(reader.path_, absl::StrFormat("its trailer (bytes [%d, %d)) is not valid",
                                                 rec.bytes - kTrailerBytes, rec.bytes));
  }
  reader.index_.resize(static_cast<size_t>(entries));
  ZS_RETURN_IF_ERROR(ReadAt(reader.fd_, index_offset, reader.index_.data(),
                            reader.index_.size() * sizeof(uint32_t), reader.path_));
  const uint32_t index_crc = Crc32c(reader.index_.data(), reader.index_.size() * sizeof(uint32_t));
  if (index_crc != rec.index_crc32c) {
    return Damaged(
        reader.path_,
        absl::StrFormat("crc mismatch in its chunk index (bytes [%d, %d)): expected "
                        "0x%08x, got 0x%08x",
                        index_offset, index_offset + entries * 4, rec.index_crc32c, index_crc));
  }
  return reader;
}

absl::Status RankFileReader::Read(int unit, int tensor, int64_t begin, int64_t end, float* out) {
  const std::vector<int64_t>& shard = manifest_->shard_numel;
  const int64_t chunk = manifest_->chunk_elements;
  const int64_t base = TensorOffset(shard, unit, tensor);
  const int64_t first = FirstChunk(shard, unit, tensor, chunk);
  for (int64_t c = begin / chunk; c * chunk < end; ++c) {
    const int64_t c_begin = c * chunk;
    const int64_t c_end = std::min(c_begin + chunk, shard[unit]);
    chunk_.resize(static_cast<size_t>(c_end - c_begin));
    const int64_t offset = base + c_begin * static_cast<int64_t>(sizeof(float));
    const size_t bytes = chunk_.size() * sizeof(float);
    ZS_RETURN_IF_ERROR(ReadAt(fd_, offset, chunk_.data(), bytes, path_));
    const uint32_t crc = Crc32c(chunk_.data(), bytes);
    const uint32_t expected = index_[static_cast<size_t>(first + c)];
    if (crc != expected) {
      return Damaged(
          path_, absl::StrFormat("crc mismatch in unit '%s' tensor %s, bytes [%d, %d): expected "
                                 "0x%08x, got 0x%08x",
                                 manifest_->model.units[unit].name, kTensorNames[tensor], offset,
                                 offset + static_cast<int64_t>(bytes), expected, crc));
    }
    const int64_t from = std::max(begin, c_begin);
    const int64_t to = std::min(end, c_end);
    std::memcpy(out + (from - begin), chunk_.data() + (from - c_begin),
                static_cast<size_t>(to - from) * sizeof(float));
  }
  return absl::OkStatus();
}

void VerifyRankFile(const std::string& step_dir, const Manifest& manifest, int rank,
                    std::vector<std::string>* problems) {
  const std::string path = JoinPath(step_dir, RankFileName(rank));
  const FileRecord& rec = manifest.files[rank];
  absl::StatusOr<RankFileReader> reader = RankFileReader::Open(step_dir, manifest, rank);
  if (!reader.ok()) {
    problems->push_back(std::string(reader.status().message()));
    return;
  }
  // Every chunk, unit by unit, then the whole file.
  const size_t problems_before = problems->size();
  std::vector<float> values;
  for (size_t u = 0; u < manifest.model.units.size(); ++u) {
    uint32_t unit_crc = 0;
    bool unit_readable = true;
    for (int t = 0; t < kTensorsPerUnit; ++t) {
      values.resize(static_cast<size_t>(manifest.shard_numel[u]));
      absl::Status read =
          reader->Read(static_cast<int>(u), t, 0, manifest.shard_numel[u], values.data());
      if (!read.ok()) {
        problems->push_back(std::string(read.message()));
        unit_readable = false;
        continue;
      }
      unit_crc = Crc32cExtend(unit_crc, values.data(), values.size() * sizeof(float));
    }
    if (unit_readable && unit_crc != rec.unit_crc32c[u]) {
      problems->push_back(
          absl::StrFormat("%s: crc mismatch in unit '%s': expected 0x%08x, got 0x%08x", path,
                          manifest.model.units[u].name, rec.unit_crc32c[u], unit_crc));
    }
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    problems->push_back(absl::StrFormat("open %s: %s", path, std::strerror(errno)));
    return;
  }
  std::vector<char> block(kVerifyBlockBytes);
  uint32_t crc = 0;
  for (int64_t offset = 0; offset < rec.bytes;) {
    const size_t n = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(block.size()), rec.bytes - offset));
    absl::Status read = ReadAt(fd, offset, block.data(), n, path);
    if (!read.ok()) {
      problems->push_back(std::string(read.message()));
      close(fd);
      return;
    }
    crc = Crc32cExtend(crc, block.data(), n);
    offset += static_cast<int64_t>(n);
  }
  close(fd);
  // One line per problem: a damaged chunk already named changes the whole
  // file's CRC too; alone, this names damage outside the checked parts.
  if (crc != rec.crc32c && problems->size() == problems_before) {
    problems->push_back(absl::StrFormat(
        "%s: crc mismatch over the whole file (outside the chunks, header and trailer checked "
        "above): expected 0x%08x, got 0x%08x",
        path, rec.crc32c, crc));
  }
}

}  // namespace zeroshard::internal
