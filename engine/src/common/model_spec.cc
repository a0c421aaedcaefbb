#include "zeroshard/model_spec.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/src/common/checked_math.h"

namespace zeroshard {
namespace {

// "[4611686018427387905, 4]"
std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A name that appears more than once (sorts `names`), or nullptr.
const absl::string_view* FindRepeated(std::vector<absl::string_view>& names) {
  std::sort(names.begin(), names.end());
  const auto twice = std::adjacent_find(names.begin(), names.end());
  return twice == names.end() ? nullptr : &*twice;
}

}  // namespace

int64_t ParamSpec::NumElements() const {
  CheckedInt64 n = 1;
  for (int64_t d : shape) n *= d;
  return n.value().value_or(-1);
}

int64_t UnitSpec::NumElements() const {
  CheckedInt64 n = 0;
  for (const ParamSpec& p : params) {
    const int64_t count = p.NumElements();
    if (count < 0) return -1;
    n += count;
  }
  return n.value().value_or(-1);
}

int64_t ModelSpec::NumParams() const {
  CheckedInt64 n = 0;
  for (const UnitSpec& u : units) {
    const int64_t count = u.NumElements();
    if (count < 0) return -1;
    n += count;
  }
  return n.value().value_or(-1);
}

absl::Status ModelSpec::Validate() const {
  if (units.empty()) return absl::InvalidArgumentError("model spec has no units");
  // The counts first: the name sets below grow with them.
  if (static_cast<int64_t>(units.size()) > kMaxUnits) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model spec has %d units; the supported maximum is %d: group layers into fewer units",
        units.size(), kMaxUnits));
  }
  int64_t tensors = 0;
  for (const UnitSpec& unit : units) tensors += static_cast<int64_t>(unit.params.size());
  if (tensors > kMaxModelTensors) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model spec has %d params (tensors); the supported maximum is %d: merge small params",
        tensors, kMaxModelTensors));
  }
  // Names are checked for uniqueness by sorting views of them: no copies,
  // so validating a 16384-layer model stays cheap for the planner, which
  // lays out many slices of it.
  std::vector<absl::string_view> unit_names;
  unit_names.reserve(units.size());
  std::vector<absl::string_view> param_names;
  int64_t model_elements = 0;  // stays <= kMaxModelElements, so the sums below cannot overflow
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitSpec& unit = units[u];
    if (unit.name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("model spec: unit %d has no name", u));
    }
    unit_names.push_back(unit.name);
    if (unit.params.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model spec: unit '%s' has no params", unit.name));
    }
    param_names.clear();
    for (const ParamSpec& p : unit.params) {
      if (p.name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("model spec: unit '%s' has a param with an empty name", unit.name));
      }
      param_names.push_back(p.name);
      if (p.shape.empty()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("model spec: param '%s.%s' has no shape; give at least one dimension",
                            unit.name, p.name));
      }
      for (int64_t d : p.shape) {
        if (d <= 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "model spec: param '%s.%s' has dimension %d; dimensions must be positive", unit.name,
              p.name, d));
        }
      }
      const int64_t elements = p.NumElements();
      if (elements < 0 || elements > kMaxModelElements) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' of shape %s has more than %d elements (2^56), the "
            "supported maximum for a whole model; check the shape",
            unit.name, p.name, ShapeText(p.shape), kMaxModelElements));
      }
      model_elements += elements;
      if (model_elements > kMaxModelElements) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: the model has more than %d elements (2^56), the supported maximum; the "
            "count passes it at param '%s.%s' of shape %s",
            kMaxModelElements, unit.name, p.name, ShapeText(p.shape)));
      }
    }
    if (const absl::string_view* twice = FindRepeated(param_names)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model spec: unit '%s' has the param name '%s' twice; param names must be unique "
          "within a unit",
          unit.name, *twice));
    }
  }
  if (const absl::string_view* twice = FindRepeated(unit_names)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model spec: unit name '%s' appears twice; unit names must be unique", *twice));
  }
  return absl::OkStatus();
}

}  // namespace zeroshard

namespace zeroshard {

// TODO(issue 11): balanced stages and tp-split shapes.
absl::StatusOr<std::vector<std::pair<int, int>>> PipelineStageUnits(const ModelSpec& model,
                                                                    int pp) {
  return absl::UnimplementedError("PipelineStageUnits is not implemented yet");
}

absl::StatusOr<ModelSpec> ShardModelSpec(const ModelSpec& model, int tp, int tp_rank, int pp,
                                         int pp_rank) {
  return absl::UnimplementedError("ShardModelSpec is not implemented yet");
}

}  // namespace zeroshard
