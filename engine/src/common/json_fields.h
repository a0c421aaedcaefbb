// Reading fields of a JSON object that zeroshard did not necessarily write
// (a --spec file, a Hugging Face config.json, a checkpoint's manifest), with
// one wording for every error: the source, the field's path, what it holds
// and what it must be:
//   "s.json: field 'units[0].params[1].shape' is missing; it is required"
//   "manifest.json: field 'train.zero_stage' is 7, outside [0, 3]"
//   "c.json: field 'hidden_size' is \"64\"; it must be an integer"
// And the one reader of a ModelSpec's units from JSON, for the spec file
// (ModelFromSpecJson) and the manifest (ParseManifest).
#ifndef ZEROSHARD_COMMON_JSON_FIELDS_H_
#define ZEROSHARD_COMMON_JSON_FIELDS_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

class JsonFields {
 public:
  using json = nlohmann::json;
  static constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

  // Fields of `object` (which must outlive this), named in errors as
  // `source`: field '<prefix><key>'. `prefix` is "" or ends in '.'.
  JsonFields(const json& object, std::string source, std::string prefix = "");

  // Whether `key` is present and not null (null counts as absent).
  bool Has(const char* key) const;
  // The value of a required field of JSON type `type` (number_float: any
  // number; number_integer: any integer).
  absl::StatusOr<const json*> Get(const char* key, json::value_t type) const;
  // An integer in [min, max]; integers above 2^63 - 1 are refused, never
  // wrapped.
  absl::StatusOr<int64_t> Int(const char* key, int64_t min = std::numeric_limits<int64_t>::min(),
                              int64_t max = kNoLimit) const;
  absl::StatusOr<int64_t> IntOr(const char* key, int64_t fallback) const;
  // A size: an integer in [1, max], with the limit named ("n_layer 100000
  // exceeds the supported maximum 16384").
  absl::StatusOr<int64_t> Size(const char* key, int64_t max = kNoLimit) const;
  absl::StatusOr<int64_t> SizeOr(const char* key, int64_t fallback, int64_t max = kNoLimit) const;
  absl::StatusOr<double> Real(const char* key) const;
  absl::StatusOr<double> RealOr(const char* key, double fallback) const;
  absl::StatusOr<std::string> String(const char* key) const;
  absl::StatusOr<std::string> StringOr(const char* key, const std::string& fallback) const;
  absl::StatusOr<bool> Bool(const char* key) const;
  absl::StatusOr<bool> BoolOr(const char* key, bool fallback) const;
  // Every key of the object is one of `known`; else InvalidArgument naming
  // the unknown key ("'train' holds a field 'dropout' that a zeroshard
  // manifest does not have"). `what` names the kind of document.
  absl::Status CheckKeys(const std::vector<std::string>& known,
                         const char* what = "a zeroshard manifest") const;
  absl::Status CheckKeys(std::initializer_list<const char*> known,
                         const char* what = "a zeroshard manifest") const;
  // The fields of `object`, a value of field `name` of this one.
  JsonFields Child(const json& object, const std::string& name) const;

  // "<source>: field '<prefix><key>' <what>", the one wording.
  absl::Status Error(const std::string& key, const std::string& what) const;

  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  absl::Status WrongType(const char* key, const json& value, const char* must_be) const;

  const json* object_;
  std::string source_;
  std::string prefix_;
};

// How a unit of a ModelSpec is written in JSON:
//   {"name": "block.0", "params": [{"name": "w", "shape": [512, 128],
//    "no_decay": false}, ...], <the caller's own keys>}
// A param's keys: "name", "shape" and "no_decay", then each of
// "trainable" (false), "tied_to" ({"unit": ..., "param": ...}), "lr_scale"
// and "weight_decay" only when it is not ParamSpec's default, so that the
// JSON of a spec without them (a manifest's model) is what it was before
// they existed. ModelUnitsFromJson reads it back.
nlohmann::json ParamSpecToJson(const ParamSpec& param);

struct UnitJsonRules {
  // The manifest's rules: every key required and no other key allowed,
  // except the optional param keys of ParamSpecToJson ("trainable",
  // "tied_to", "lr_scale", "weight_decay"), which default to ParamSpec's
  // defaults under either rules. Otherwise (a spec file): "name" defaults
  // to "", "no_decay" to false, and other keys are ignored.
  bool strict = false;
  // Keys of a unit that the caller reads itself (strict: allowed).
  std::vector<std::string> unit_keys;
};

// The units of field `key` of `fields` (an array of at most kMaxUnits
// units, together at most kMaxModelTensors params, both checked before
// anything is built), each through `on_unit` (called with the unit's own
// fields, for the caller's keys) when given. The spec is not validated
// (the caller runs ModelSpec::Validate and words its error).
absl::StatusOr<ModelSpec> ModelUnitsFromJson(
    const JsonFields& fields, const char* key, const UnitJsonRules& rules,
    const std::function<absl::Status(const JsonFields& unit, int index)>& on_unit = nullptr);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_COMMON_JSON_FIELDS_H_
