#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/common/json_fields.h"
#include "engine/src/common/spec_fingerprint.h"
#include "engine/src/common/train_spec_fields.h"
#include "engine/src/layout/flat_layout.h"
#include "kernels/cpu/crc32c.h"
#include "nlohmann/json.hpp"
#include "zeroshard/input_file.h"
#include "zeroshard/quote.h"
#include "zeroshard/status.h"

// manifest.json: writing it, and reading it with every field checked.
namespace zeroshard::internal {
namespace {

using nlohmann::json;

constexpr char kFormatName[] = "zeroshard-checkpoint";
constexpr char kManifestCrcField[] = "manifest_crc32c";

// `text` parsed, without exceptions (discarded when it is not JSON), and how
// deep it nests: the parser is iterative, so depth is measured before any
// recursive walk (dump, comparison) of the document.
json ParseMeasuringDepth(const std::string& text, int* depth) {
  *depth = 0;
  return json::parse(
      text,
      [depth](int level, json::parse_event_t, json&) {
        *depth = std::max(*depth, level);
        return true;
      },
      /*allow_exceptions=*/false);
}

bool HostIsLittleEndian() {
  const uint32_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// The next path segments below `prefix` ("" or "optimizer.") among the
// table's field names, each once: the keys a "train" object holds there.
std::vector<std::string> TrainKeysUnder(absl::string_view prefix) {
  std::vector<std::string> keys;
  for (const TrainSpecField& field : TrainSpecFieldTable()) {
    absl::string_view name = field.name;
    if (!absl::ConsumePrefix(&name, prefix)) continue;
    const std::string key(name.substr(0, name.find('.')));
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  return keys;
}

json TrainToJson(const TrainSpec& t) {
  json j = json::object();
  for (const TrainSpecField& field : TrainSpecFieldTable()) {
    const std::vector<std::string> path = absl::StrSplit(field.name, '.');
    json* at = &j;
    for (size_t i = 0; i + 1 < path.size(); ++i) at = &(*at)[path[i]];
    json& value = (*at)[path.back()];
    const int64_t bits = field.get(t);
    switch (field.kind) {
      case SpecValueKind::kInt:
        value = bits;
        break;
      case SpecValueKind::kReal:
        value = RealOfBits(bits);
        break;
      case SpecValueKind::kBool:
        value = bits != 0;
        break;
      default:  // an enum, by name
        value = FormatSpecValue(field.kind, bits);
        break;
    }
  }
  return j;
}

// Every object of a "train" document holds only the keys of the table's
// fields at that path (`path` is "" or "optimizer."); recursively.
absl::Status CheckTrainKeys(const JsonFields& at, const std::string& path) {
  const std::vector<std::string> keys = TrainKeysUnder(path);
  ZS_RETURN_IF_ERROR(at.CheckKeys(keys));
  for (const std::string& key : keys) {
    const std::string group = absl::StrCat(path, key, ".");
    if (TrainKeysUnder(group).empty() || !at.Has(key.c_str())) continue;
    ZS_ASSIGN_OR_RETURN(const json* object, at.Get(key.c_str(), json::value_t::object));
    ZS_RETURN_IF_ERROR(CheckTrainKeys(at.Child(*object, key), group));
  }
  return absl::OkStatus();
}

// One field of the table from the "train" object `train`. Absent: an error
// when every manifest has it, else its name in `unrecorded`.
absl::Status TrainFieldFromJson(const JsonFields& train, const TrainSpecField& field, TrainSpec* t,
                                std::vector<std::string>* unrecorded) {
  const std::vector<std::string> path = absl::StrSplit(field.name, '.');
  JsonFields at = train;
  for (size_t i = 0;; ++i) {
    if (!field.in_every_manifest && !at.Has(path[i].c_str())) {
      unrecorded->push_back(field.name);
      return absl::OkStatus();
    }
    if (i + 1 == path.size()) break;
    ZS_ASSIGN_OR_RETURN(const json* group, at.Get(path[i].c_str(), json::value_t::object));
    at = at.Child(*group, path[i]);
  }
  const char* key = path.back().c_str();
  int64_t bits = 0;
  switch (field.kind) {
    case SpecValueKind::kInt: {
      ZS_ASSIGN_OR_RETURN(bits, at.Int(key, field.min, field.max));
      break;
    }
    case SpecValueKind::kReal: {
      ZS_ASSIGN_OR_RETURN(const double value, at.Real(key));
      bits = RealBits(value);
      break;
    }
    case SpecValueKind::kBool: {
      ZS_ASSIGN_OR_RETURN(const bool value, at.Bool(key));
      bits = value ? 1 : 0;
      break;
    }
    default: {
      ZS_ASSIGN_OR_RETURN(const std::string name, at.String(key));
      absl::StatusOr<int64_t> parsed = ParseSpecName(field.kind, name);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrFormat("%s: field '%s%s' is %s, %s", at.source(),
                                                          at.prefix(), key, QuoteForMessage(name),
                                                          parsed.status().message()));
      }
      bits = *parsed;
      break;
    }
  }
  field.set(*t, bits);
  return absl::OkStatus();
}

// Every field of the table; `unrecorded` lists those an older manifest lacks.
absl::StatusOr<TrainSpec> TrainFromJson(const JsonFields& f, std::vector<std::string>* unrecorded) {
  TrainSpec t;
  ZS_RETURN_IF_ERROR(CheckTrainKeys(f, ""));
  for (const TrainSpecField& field : TrainSpecFieldTable()) {
    ZS_RETURN_IF_ERROR(TrainFieldFromJson(f, field, &t, unrecorded));
  }
  absl::Status valid = t.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field 'train': %s", f.source(), valid.message()));
  }
  return t;
}

}  // namespace

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
  // One storage segment per unit (no frozen or tied params): each unit
  // records its segment's sizes, as format version 1 always did; else the
  // segments are listed apart, in layout order.
  const bool per_unit = m.used_numel.size() == m.model.units.size() && OneSegmentPerUnit(m.model);
  json units = json::array();
  for (size_t u = 0; u < m.model.units.size(); ++u) {
    const UnitSpec& unit = m.model.units[u];
    json params = json::array();
    for (const ParamSpec& p : unit.params) params.push_back(ParamSpecToJson(p));
    json record = {{"name", unit.name}, {"params", params}};
    if (per_unit) {
      record["used_numel"] = m.used_numel[u];
      record["shard_numel"] = m.shard_numel[u];
    }
    units.push_back(record);
  }
  j["model"] = {{"fingerprint", absl::StrFormat("%016x", m.model_fingerprint)},
                {"num_params", m.model.NumParams()},
                {"units", units}};
  if (!per_unit) {
    json segments = json::array();
    for (size_t s = 0; s < m.used_numel.size(); ++s) {
      segments.push_back({{"used_numel", m.used_numel[s]}, {"shard_numel", m.shard_numel[s]}});
    }
    j["model"]["segments"] = segments;
  }
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
  j[kManifestCrcField] = kernels::Crc32c(body.data(), body.size());
  return j.dump(1) + "\n";
}

absl::StatusOr<int64_t> TrainerStateManifestBytes(const std::string& state) {
  if (static_cast<int64_t>(state.size()) > kMaxTrainerStateBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Save: the trainer state is %d bytes, more than the %d a checkpoint holds; keep it to "
        "positions and RNG states and store larger data beside the checkpoint",
        state.size(), kMaxTrainerStateBytes));
  }
  int depth = 0;
  const json parsed = ParseMeasuringDepth(state, &depth);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(
        "Save: the trainer state is not a JSON object; pass e.g. {\"sampler_step\": 1200}");
  }
  if (depth > kMaxTrainerStateDepth) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Save: the trainer state is nested %d levels deep, more than %d", depth,
                        kMaxTrainerStateDepth));
  }
  // As ManifestToJson places it: one level in, with dump(1)'s indentation.
  const json with = {{"trainer_state", parsed}};
  const json without = {{"trainer_state", json::object()}};
  return static_cast<int64_t>(with.dump(1).size() - without.dump(1).size());
}

namespace {

// manifest.json's text as a JSON object, refused as damaged when it is not
// one or nests deeper than a manifest does.
absl::StatusOr<json> ParseManifestDocument(const std::string& text, const std::string& source) {
  int depth = 0;
  json doc = ParseMeasuringDepth(text, &depth);
  if (!doc.is_discarded() && depth > kMaxManifestDepth) {
    return absl::DataLossError(absl::StrFormat(
        "%s: nested %d levels deep, more than the %d a manifest has; the manifest is damaged: "
        "load an earlier checkpoint",
        source, depth, kMaxManifestDepth));
  }
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not a JSON object; the manifest is damaged: load an earlier checkpoint", source));
  }
  return doc;
}

// The fields of a parsed manifest, each checked (ParseManifestContent).
absl::StatusOr<Manifest> ManifestFromDocument(const json& doc, const std::string& source);

}  // namespace

absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& source) {
  ZS_ASSIGN_OR_RETURN(json doc, ParseManifestDocument(text, source));
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
  const uint32_t actual = kernels::Crc32c(body.data(), body.size());
  if (actual != stored) {
    return absl::DataLossError(absl::StrFormat(
        "%s: CRC32C mismatch (stored %08x, computed %08x): the manifest was damaged or edited; "
        "load an earlier checkpoint",
        source, stored, actual));
  }
  return ManifestFromDocument(doc, source);
}

absl::StatusOr<Manifest> ParseManifestContent(const std::string& text, const std::string& source) {
  ZS_ASSIGN_OR_RETURN(const json doc, ParseManifestDocument(text, source));
  return ManifestFromDocument(doc, source);
}

namespace {

absl::StatusOr<Manifest> ManifestFromDocument(const json& doc, const std::string& source) {
  const JsonFields f(doc, source, "");
  ZS_ASSIGN_OR_RETURN(std::string format, f.String("format"));
  ZS_RETURN_IF_ERROR(
      f.CheckKeys({"format", "version", "step", "applied_steps", "skipped_steps", "world_size",
                   "train", "loss_scale", "model", "layout", "files", "trainer_state"}));
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
  ZS_ASSIGN_OR_RETURN(m.train, TrainFromJson(f.Child(*train, "train"), &m.unrecorded_train_fields));
  ZS_ASSIGN_OR_RETURN(const json* ls, f.Get("loss_scale", json::value_t::object));
  const JsonFields l = f.Child(*ls, "loss_scale");
  ZS_RETURN_IF_ERROR(
      l.CheckKeys({"scale", "hysteresis_left", "clean_steps", "skips_at_min_scale"}));
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
  const JsonFields mf = f.Child(*model, "model");
  ZS_RETURN_IF_ERROR(mf.CheckKeys({"fingerprint", "num_params", "units", "segments"}));
  ZS_ASSIGN_OR_RETURN(std::string fingerprint, mf.String("fingerprint"));
  if (fingerprint.size() != 16 ||
      fingerprint.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field 'model.fingerprint' is %s, not 16 lowercase hex digits", source,
                        QuoteForMessage(fingerprint)));
  }
  m.model_fingerprint = std::strtoull(fingerprint.c_str(), nullptr, 16);
  ZS_ASSIGN_OR_RETURN(const int64_t num_params, mf.Int("num_params", 1, kMaxModelElements));
  UnitJsonRules rules;
  rules.strict = true;
  rules.unit_keys = {"used_numel", "shard_numel"};
  ZS_ASSIGN_OR_RETURN(
      m.model,
      ModelUnitsFromJson(mf, "units", rules, [&](const JsonFields& unit, int) -> absl::Status {
        // Listed apart (below) for a model with frozen or tied params.
        if (mf.Has("segments")) return absl::OkStatus();
        ZS_ASSIGN_OR_RETURN(const int64_t used, unit.Int("used_numel", 0, kMaxModelElements));
        ZS_ASSIGN_OR_RETURN(const int64_t shard, unit.Int("shard_numel", 0, kMaxModelElements));
        m.used_numel.push_back(used);
        m.shard_numel.push_back(shard);
        return absl::OkStatus();
      }));
  absl::Status valid = m.model.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field 'model': ", valid.message()));
  }
  if (num_params != m.model.NumParams()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field 'model.num_params' is %d, but its units hold %d params", source,
                        num_params, m.model.NumParams()));
  }
  if (m.model_fingerprint != FingerprintModelSpec(m.model)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: field 'model.fingerprint' is %s, but the units it lists fingerprint as %016x", source,
        fingerprint, FingerprintModelSpec(m.model)));
  }
  if (mf.Has("segments")) {
    ZS_ASSIGN_OR_RETURN(const json* segments, mf.Get("segments", json::value_t::array));
    if (segments->size() > static_cast<size_t>(kMaxModelTensors)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: field 'model.segments' lists %d segments, more than the model has params", source,
          segments->size()));
    }
    for (size_t k = 0; k < segments->size(); ++k) {
      const json& segment = (*segments)[k];
      if (!segment.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: field 'model.segments[%d]' is not an object", source, k));
      }
      const JsonFields sf = mf.Child(segment, absl::StrFormat("model.segments[%d]", k));
      ZS_RETURN_IF_ERROR(sf.CheckKeys({"used_numel", "shard_numel"}));
      ZS_ASSIGN_OR_RETURN(const int64_t used, sf.Int("used_numel", 0, kMaxModelElements));
      ZS_ASSIGN_OR_RETURN(const int64_t shard, sf.Int("shard_numel", 0, kMaxModelElements));
      m.used_numel.push_back(used);
      m.shard_numel.push_back(shard);
    }
  }
  // The layout rules that wrote the file must be this build's (checked
  // before any size is derived from the shard sizes).
  ZS_ASSIGN_OR_RETURN(FlatLayout layout, FlatLayout::Create(m.model, m.world_size));
  if (static_cast<size_t>(layout.num_units()) != m.used_numel.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the manifest lists %d storage segments, but this build stores the model in %d: the "
        "checkpoint was written with other layout rules",
        source, m.used_numel.size(), layout.num_units()));
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    if (layout.unit(u).used_numel != m.used_numel[u] ||
        layout.unit(u).shard_numel != m.shard_numel[u]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unit '%s' has used_numel %d and shard_numel %d, but this build lays it out as %d "
          "and %d for %d ranks: the checkpoint was written with other layout rules",
          source, m.model.units[layout.unit(u).spec_unit].name, m.used_numel[u], m.shard_numel[u],
          layout.unit(u).used_numel, layout.unit(u).shard_numel, m.world_size));
    }
  }
  ZS_ASSIGN_OR_RETURN(const json* layout_json, f.Get("layout", json::value_t::object));
  const JsonFields lf = f.Child(*layout_json, "layout");
  ZS_RETURN_IF_ERROR(lf.CheckKeys(
      {"byte_order", "tensors", "chunk_elements", "param_alignment", "shard_quantum"}));
  ZS_ASSIGN_OR_RETURN(const json* tensors, lf.Get("tensors", json::value_t::array));
  if (*tensors != json::array({kTensorNames[0], kTensorNames[1], kTensorNames[2]})) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: field 'layout.tensors' is %s; this build stores [\"%s\", \"%s\", \"%s\"] per unit",
        source, QuoteForMessage(tensors->dump()), kTensorNames[0], kTensorNames[1],
        kTensorNames[2]));
  }
  // The layout rules (compared unit by unit above) are these two constants.
  ZS_RETURN_IF_ERROR(lf.Int("param_alignment", kParamAlignment, kParamAlignment).status());
  ZS_RETURN_IF_ERROR(lf.Int("shard_quantum", kShardQuantum, kShardQuantum).status());
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
    const JsonFields ff = f.Child((*files)[r], absl::StrFormat("files[%d]", r));
    ZS_RETURN_IF_ERROR(ff.CheckKeys({"name", "bytes", "crc32c", "index_crc32c", "unit_crc32c"}));
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
    if (unit_crcs->size() != m.used_numel.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: field 'files[%d].unit_crc32c' has %d entries for %d storage segments", source, r,
          unit_crcs->size(), m.used_numel.size()));
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

}  // namespace

absl::StatusOr<Manifest> ReadManifest(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, kManifestName);
  absl::StatusOr<bool> inside = ResolvesInside(path, step_dir);
  if (!inside.ok()) {
    if (absl::IsNotFound(inside.status())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: no %s: not a complete checkpoint (a save that did not finish?); load the step "
          "that `latest` names",
          step_dir, kManifestName));
    }
    return inside.status();
  }
  if (!*inside) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s resolves to %s, outside %s; a checkpoint's files must be inside its step "
        "directory: copy the file there",
        path, ResolvedPath(path), step_dir));
  }
  absl::StatusOr<std::string> text =
      ReadInputFile(path, "a checkpoint's manifest", kMaxManifestBytes);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: no %s: not a complete checkpoint (a save that did not finish?); load the step "
          "that `latest` names",
          step_dir, kManifestName));
    }
    if (absl::IsOutOfRange(text.status()) || absl::IsFailedPrecondition(text.status())) {
      return absl::DataLossError(absl::StrCat(
          text.status().message(), "; the manifest is damaged: load an earlier checkpoint"));
    }
    return text.status();
  }
  return ParseManifest(*text, path);
}

CheckpointInfo DescribeCheckpoint(const std::string& step_dir, const Manifest& m,
                                  const std::string& note) {
  CheckpointInfo info;
  info.note = note;
  info.path = step_dir;
  info.step = m.step;
  info.world_size = m.world_size;
  info.zero_stage = m.train.zero_stage;
  info.precision = m.train.precision;
  info.grad_accum_steps = m.train.grad_accum_steps;
  info.num_params = m.model.NumParams();
  info.num_units = static_cast<int>(m.model.units.size());
  for (const FileRecord& f : m.files) info.file_bytes.push_back(f.bytes);
  info.trainer_state = m.trainer_state;
  return info;
}

}  // namespace zeroshard::internal
