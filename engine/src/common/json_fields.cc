#include "engine/src/common/json_fields.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "zeroshard/quote.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

using json = nlohmann::json;

JsonFields::JsonFields(const json& object, std::string source, std::string prefix)
    : object_(&object), source_(std::move(source)), prefix_(std::move(prefix)) {}

bool JsonFields::Has(const char* key) const {
  return object_->is_object() && object_->contains(key) && !object_->at(key).is_null();
}

absl::Status JsonFields::Error(const std::string& key, const std::string& what) const {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: field '%s%s' %s", source_, prefix_, key, what));
}

absl::Status JsonFields::WrongType(const char* key, const json& value, const char* must_be) const {
  return Error(key, absl::StrFormat("is %s; it must be %s", value.dump(), must_be));
}

absl::StatusOr<const json*> JsonFields::Get(const char* key, json::value_t type) const {
  if (!Has(key)) return Error(key, "is missing; it is required");
  const json& v = object_->at(key);
  switch (type) {
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      if (!v.is_number_integer()) return WrongType(key, v, "an integer");
      break;
    case json::value_t::number_float:
      if (!v.is_number()) return WrongType(key, v, "a number");
      break;
    case json::value_t::string:
      if (!v.is_string()) return WrongType(key, v, "a string");
      break;
    case json::value_t::boolean:
      if (!v.is_boolean()) return WrongType(key, v, "true or false");
      break;
    case json::value_t::object:
      if (!v.is_object()) return WrongType(key, v, "an object");
      break;
    case json::value_t::array:
      if (!v.is_array()) return WrongType(key, v, "an array");
      break;
    default:
      if (v.type() != type) return WrongType(key, v, v.type_name());
      break;
  }
  return &v;
}

absl::StatusOr<int64_t> JsonFields::Int(const char* key, int64_t min, int64_t max) const {
  ZS_ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::number_integer));
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kNoLimit)) {
    if (max == kNoLimit)
      return Error(key, absl::StrCat("is ", v->dump(), ", above 2^63 - 1; give a smaller value"));
    return Error(key, absl::StrFormat("is %s, outside [%d, %d]", v->dump(), min, max));
  }
  const int64_t value = v->get<int64_t>();
  if (value < min || value > max) {
    return Error(key, absl::StrFormat("is %s, outside [%d, %d]", v->dump(), min, max));
  }
  return value;
}

absl::StatusOr<int64_t> JsonFields::IntOr(const char* key, int64_t fallback) const {
  if (!Has(key)) return fallback;
  return Int(key);
}

absl::StatusOr<int64_t> JsonFields::Size(const char* key, int64_t max) const {
  ZS_ASSIGN_OR_RETURN(const int64_t v, Int(key));
  if (v < 1) return Error(key, absl::StrFormat("is %d; it must be a positive integer", v));
  if (v > max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s%s %d exceeds the supported maximum %d; check the config", source_,
                        prefix_, key, v, max));
  }
  return v;
}

absl::StatusOr<int64_t> JsonFields::SizeOr(const char* key, int64_t fallback, int64_t max) const {
  if (!Has(key)) return fallback;
  return Size(key, max);
}

absl::StatusOr<double> JsonFields::Real(const char* key) const {
  ZS_ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::number_float));
  return v->get<double>();
}

absl::StatusOr<double> JsonFields::RealOr(const char* key, double fallback) const {
  if (!Has(key)) return fallback;
  return Real(key);
}

absl::StatusOr<std::string> JsonFields::String(const char* key) const {
  ZS_ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::string));
  return v->get<std::string>();
}

absl::StatusOr<std::string> JsonFields::StringOr(const char* key,
                                                 const std::string& fallback) const {
  if (!Has(key)) return fallback;
  return String(key);
}

absl::StatusOr<bool> JsonFields::Bool(const char* key) const {
  ZS_ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::boolean));
  return v->get<bool>();
}

absl::StatusOr<bool> JsonFields::BoolOr(const char* key, bool fallback) const {
  if (!Has(key)) return fallback;
  return Bool(key);
}

absl::Status JsonFields::CheckKeys(std::initializer_list<const char*> known,
                                   const char* what) const {
  return CheckKeys(std::vector<std::string>(known.begin(), known.end()), what);
}

absl::Status JsonFields::CheckKeys(const std::vector<std::string>& known, const char* what) const {
  if (!object_->is_object()) return absl::OkStatus();
  for (const auto& item : object_->items()) {
    bool found = false;
    for (const std::string& k : known) found |= item.key() == k;
    if (!found) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s holds a field %s that %s does not have (another tool or version wrote it?)",
          source_,
          prefix_.empty() ? "the top level" : "'" + prefix_.substr(0, prefix_.size() - 1) + "'",
          QuoteForMessage(item.key()), what));
    }
  }
  return absl::OkStatus();
}

JsonFields JsonFields::Child(const json& object, const std::string& name) const {
  return JsonFields(object, source_, prefix_ + name + ".");
}

json ParamSpecToJson(const ParamSpec& param) {
  json j = {{"name", param.name}, {"shape", param.shape}, {"no_decay", param.no_decay}};
  if (!param.trainable) j["trainable"] = false;
  if (param.tied_to)
    j["tied_to"] = {{"unit", param.tied_to->unit}, {"param", param.tied_to->param}};
  if (param.lr_scale != 1.0) j["lr_scale"] = param.lr_scale;
  if (param.weight_decay) j["weight_decay"] = *param.weight_decay;
  return j;
}

namespace {

// The optional keys of ParamSpecToJson into `param` (absent: the default).
// The values are checked by ModelSpec::Validate, as the caller runs it.
absl::Status ParamGroupFieldsFromJson(const JsonFields& pf, bool strict, ParamSpec* param) {
  ZS_ASSIGN_OR_RETURN(param->trainable, pf.BoolOr("trainable", true));
  ZS_ASSIGN_OR_RETURN(param->lr_scale, pf.RealOr("lr_scale", 1.0));
  if (pf.Has("weight_decay")) {
    ZS_ASSIGN_OR_RETURN(const double decay, pf.Real("weight_decay"));
    param->weight_decay = decay;
  }
  if (pf.Has("tied_to")) {
    ZS_ASSIGN_OR_RETURN(const json* tied, pf.Get("tied_to", json::value_t::object));
    const JsonFields tf = pf.Child(*tied, "tied_to");
    if (strict) ZS_RETURN_IF_ERROR(tf.CheckKeys({"unit", "param"}));
    ParamRef owner;
    ZS_ASSIGN_OR_RETURN(owner.unit, tf.String("unit"));
    ZS_ASSIGN_OR_RETURN(owner.param, tf.String("param"));
    param->tied_to = std::move(owner);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> ModelUnitsFromJson(
    const JsonFields& fields, const char* key, const UnitJsonRules& rules,
    const std::function<absl::Status(const JsonFields& unit, int index)>& on_unit) {
  ZS_ASSIGN_OR_RETURN(const json* units, fields.Get(key, json::value_t::array));
  // The limits before anything grows with the counts.
  if (units->size() > static_cast<size_t>(kMaxUnits)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d units exceed the supported maximum %d (field '%s%s'); group layers into fewer "
        "units",
        fields.source(), units->size(), kMaxUnits, fields.prefix(), key));
  }
  if (units->empty()) return fields.Error(key, "has no units; a model has at least one");
  int64_t tensors = 0;
  for (const json& unit : *units) {
    if (unit.is_object() && unit.contains("params") && unit["params"].is_array()) {
      tensors += static_cast<int64_t>(unit["params"].size());
    }
  }
  if (tensors > kMaxModelTensors) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d params (tensors) exceed the supported maximum %d; merge small params",
        fields.source(), tensors, kMaxModelTensors));
  }
  std::vector<std::string> unit_keys = {"name", "params"};
  unit_keys.insert(unit_keys.end(), rules.unit_keys.begin(), rules.unit_keys.end());
  ModelSpec spec;
  spec.units.reserve(units->size());
  for (size_t u = 0; u < units->size(); ++u) {
    const std::string unit_name = absl::StrFormat("%s[%d]", key, u);
    const json& unit_json = (*units)[u];
    if (!unit_json.is_object()) {
      return fields.Error(unit_name, absl::StrFormat("is %s; it must be an object",
                                                     QuoteForMessage(unit_json.dump())));
    }
    const JsonFields uf = fields.Child(unit_json, unit_name);
    if (rules.strict) ZS_RETURN_IF_ERROR(uf.CheckKeys(unit_keys));
    UnitSpec unit;
    ZS_ASSIGN_OR_RETURN(unit.name, rules.strict ? uf.String("name") : uf.StringOr("name", ""));
    ZS_ASSIGN_OR_RETURN(const json* params, uf.Get("params", json::value_t::array));
    for (size_t p = 0; p < params->size(); ++p) {
      const std::string param_name = absl::StrFormat("params[%d]", p);
      const json& param_json = (*params)[p];
      if (!param_json.is_object()) {
        return uf.Error(param_name, absl::StrFormat("is %s; it must be an object",
                                                    QuoteForMessage(param_json.dump())));
      }
      const JsonFields pf = uf.Child(param_json, param_name);
      if (rules.strict) {
        ZS_RETURN_IF_ERROR(pf.CheckKeys(
            {"name", "shape", "no_decay", "trainable", "tied_to", "lr_scale", "weight_decay"}));
      }
      ParamSpec param;
      ZS_ASSIGN_OR_RETURN(param.name, rules.strict ? pf.String("name") : pf.StringOr("name", ""));
      ZS_ASSIGN_OR_RETURN(param.no_decay,
                          rules.strict ? pf.Bool("no_decay") : pf.BoolOr("no_decay", false));
      ZS_RETURN_IF_ERROR(ParamGroupFieldsFromJson(pf, rules.strict, &param));
      ZS_ASSIGN_OR_RETURN(const json* shape, pf.Get("shape", json::value_t::array));
      for (const json& d : *shape) {
        if (!d.is_number_integer()) {
          return pf.Error("shape",
                          absl::StrFormat("holds %s; it must be a list of integers", d.dump()));
        }
        if (d.is_number_unsigned() &&
            d.get<uint64_t>() > static_cast<uint64_t>(JsonFields::kNoLimit)) {
          return pf.Error(
              "shape", absl::StrCat("holds ", d.dump(), ", above 2^63 - 1; give a smaller value"));
        }
        param.shape.push_back(d.get<int64_t>());
      }
      unit.params.push_back(std::move(param));
    }
    if (on_unit) ZS_RETURN_IF_ERROR(on_unit(uf, static_cast<int>(u)));
    spec.units.push_back(std::move(unit));
  }
  return spec;
}

}  // namespace zeroshard::internal
