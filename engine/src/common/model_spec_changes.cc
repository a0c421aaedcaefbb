#include "engine/src/common/model_spec_changes.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/common/train_spec_fields.h"

namespace zeroshard::internal {
namespace {

const char* BoolText(bool b) { return b ? "true" : "false"; }

// The shortest text that reads back as `value` (as DescribeTrainSpecChanges).
std::string RealText(double value) {
  return FormatSpecValue(SpecValueKind::kReal, RealBits(value));
}

std::string DecayText(const std::optional<double>& decay) {
  return decay ? RealText(*decay) : std::string("unset");
}

std::string TieText(const std::optional<ParamRef>& tie) {
  return tie ? absl::StrFormat("tied to '%s.%s'", tie->unit, tie->param) : std::string("untied");
}

}  // namespace

std::string DescribeModelStorageDifference(const ModelSpec& saved, const ModelSpec& mine) {
  if (saved.units.size() != mine.units.size()) {
    return absl::StrFormat("it has %d units, this engine's model %d", saved.units.size(),
                           mine.units.size());
  }
  for (size_t u = 0; u < saved.units.size(); ++u) {
    const UnitSpec& a = saved.units[u];
    const UnitSpec& b = mine.units[u];
    if (a.name != b.name) {
      return absl::StrFormat("its unit %d is '%s', this engine's '%s'", u, a.name, b.name);
    }
    if (a.params.size() != b.params.size()) {
      return absl::StrFormat("unit '%s' has %d params, this engine's %d", a.name, a.params.size(),
                             b.params.size());
    }
    for (size_t p = 0; p < a.params.size(); ++p) {
      const ParamSpec& x = a.params[p];
      const ParamSpec& y = b.params[p];
      if (x.name != y.name || x.shape != y.shape) {
        return absl::StrFormat(
            "param %d of unit '%s' is '%s' of shape [%s], this engine's '%s' of shape [%s]", p,
            a.name, x.name, absl::StrJoin(x.shape, ", "), y.name, absl::StrJoin(y.shape, ", "));
      }
      // These decide what is stored (frozen params have no optimizer
      // state, a tied param is stored once, with its owner): the
      // checkpoint's tensors do not fit another choice.
      if (x.trainable != y.trainable) {
        return absl::StrFormat(
            "param '%s.%s' has trainable %s in the checkpoint and %s in this engine's model; "
            "frozen params store no optimizer state, so the flags must match at Load: declare "
            "them as the checkpoint does (Engine::SetTrainable changes them between steps)",
            a.name, x.name, BoolText(x.trainable), BoolText(y.trainable));
      }
      const bool same_tie = x.tied_to.has_value() == y.tied_to.has_value() &&
                            (!x.tied_to || (x.tied_to->unit == y.tied_to->unit &&
                                            x.tied_to->param == y.tied_to->param));
      if (!same_tie) {
        return absl::StrFormat(
            "param '%s.%s' is %s in the checkpoint and %s in this engine's model; a tied param is "
            "stored once, with its owner, so the ties must match at Load",
            a.name, x.name, TieText(x.tied_to), TieText(y.tied_to));
      }
    }
  }
  return "";
}

std::vector<std::string> DescribeParamGroupChanges(const ModelSpec& before, const ModelSpec& after,
                                                   size_t max_listed) {
  std::vector<std::string> changes;
  size_t more = 0;
  auto add = [&](std::string change) {
    if (changes.size() < max_listed) {
      changes.push_back(std::move(change));
    } else {
      ++more;
    }
  };
  for (size_t u = 0; u < before.units.size() && u < after.units.size(); ++u) {
    const UnitSpec& unit = before.units[u];
    for (size_t p = 0; p < unit.params.size() && p < after.units[u].params.size(); ++p) {
      const ParamSpec& x = unit.params[p];
      const ParamSpec& y = after.units[u].params[p];
      const std::string name = absl::StrCat(unit.name, ".", x.name);
      if (x.lr_scale != y.lr_scale) {
        add(absl::StrCat(name, ": lr_scale ", RealText(x.lr_scale), " -> ", RealText(y.lr_scale)));
      }
      if (x.weight_decay != y.weight_decay) {
        add(absl::StrCat(name, ": weight_decay ", DecayText(x.weight_decay), " -> ",
                         DecayText(y.weight_decay)));
      }
      if (x.no_decay != y.no_decay) {
        add(absl::StrCat(name, ": no_decay ", BoolText(x.no_decay), " -> ", BoolText(y.no_decay)));
      }
    }
  }
  if (more > 0) changes.push_back(absl::StrFormat("and %d more param group changes", more));
  return changes;
}

}  // namespace zeroshard::internal
