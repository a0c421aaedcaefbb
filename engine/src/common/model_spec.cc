#include "zeroshard/model_spec.h"

#include <set>

#include "absl/strings/str_format.h"

namespace zeroshard {

int64_t ParamSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t UnitSpec::NumElements() const {
  int64_t n = 0;
  for (const ParamSpec& p : params) n += p.NumElements();
  return n;
}

int64_t ModelSpec::NumParams() const {
  int64_t n = 0;
  for (const UnitSpec& u : units) n += u.NumElements();
  return n;
}

absl::Status ModelSpec::Validate() const {
  if (units.empty()) return absl::InvalidArgumentError("model spec has no units");
  std::set<std::string> unit_names;
  // NumElements() and NumParams() multiply and add in int64_t; a spec they
  // cannot count is refused here rather than overflowing there.
  int64_t model_elements = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitSpec& unit = units[u];
    if (unit.name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("model spec: unit %d has no name", u));
    }
    if (!unit_names.insert(unit.name).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model spec: unit name '%s' appears twice; unit names must be unique", unit.name));
    }
    if (unit.params.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model spec: unit '%s' has no params", unit.name));
    }
    std::set<std::string> param_names;
    for (const ParamSpec& p : unit.params) {
      if (p.name.empty() || !param_names.insert(p.name).second) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: unit '%s' has an empty or repeated param name '%s'", unit.name, p.name));
      }
      if (p.shape.empty()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("model spec: param '%s.%s' has no shape; give at least one dimension",
                            unit.name, p.name));
      }
      int64_t elements = 1;
      bool overflow = false;
      for (int64_t d : p.shape) {
        if (d <= 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "model spec: param '%s.%s' has dimension %d; dimensions must be positive", unit.name,
              p.name, d));
        }
        overflow = overflow || __builtin_mul_overflow(elements, d, &elements);
      }
      if (overflow || __builtin_add_overflow(model_elements, elements, &model_elements)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' brings the model past 2^63-1 elements; check its shape",
            unit.name, p.name));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace zeroshard
