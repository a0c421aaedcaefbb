#include "zeroshard/model_spec.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/common/tp_split.h"
#include "zeroshard/status.h"

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

const char* BoolText(bool b) { return b ? "true" : "false"; }

// "0.5"; "unset" for an absent weight decay.
std::string DecayText(const std::optional<double>& weight_decay) {
  return weight_decay ? absl::StrFormat("%g", *weight_decay) : std::string("unset");
}

// The param group fields of one param: lr_scale finite and >= 0,
// weight_decay finite and >= 0 and not given with no_decay.
absl::Status ValidateGroupFields(const std::string& unit, const ParamSpec& p) {
  if (!(p.lr_scale >= 0) || !std::isfinite(p.lr_scale)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model spec: param '%s.%s' has lr_scale %g; it must be finite and >= 0 (its learning "
        "rate is the schedule's times lr_scale; 0 holds it still)",
        unit, p.name, p.lr_scale));
  }
  if (p.weight_decay) {
    if (!(*p.weight_decay >= 0) || !std::isfinite(*p.weight_decay)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model spec: param '%s.%s' has weight_decay %g; it must be finite and >= 0", unit, p.name,
          *p.weight_decay));
    }
    if (p.no_decay) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model spec: param '%s.%s' has both no_decay and weight_decay %g; set one of them "
          "(no_decay is a weight decay of 0)",
          unit, p.name, *p.weight_decay));
    }
  }
  return absl::OkStatus();
}

// A param by its names, for resolving tied_to.
struct ParamKey {
  absl::string_view unit;
  absl::string_view param;
  int unit_index;
  int param_index;
  bool operator<(const ParamKey& o) const {
    return unit != o.unit ? unit < o.unit : param < o.param;
  }
};

// Every tied_to of `model` (whose names are unique) names a param of an
// earlier unit that is not tied itself, with the alias's shape and
// settings. Sorted keys, built only when the model has a tie: no cost for
// untied models and O(n log n) otherwise.
absl::Status ValidateTies(const ModelSpec& model) {
  std::vector<ParamKey> keys;
  for (size_t u = 0; u < model.units.size(); ++u) {
    const UnitSpec& unit = model.units[u];
    for (size_t p = 0; p < unit.params.size(); ++p) {
      keys.push_back({unit.name, unit.params[p].name, static_cast<int>(u), static_cast<int>(p)});
    }
  }
  std::sort(keys.begin(), keys.end());
  for (size_t u = 0; u < model.units.size(); ++u) {
    const UnitSpec& unit = model.units[u];
    for (const ParamSpec& alias : unit.params) {
      if (!alias.tied_to) continue;
      const ParamRef& ref = *alias.tied_to;
      const ParamKey wanted{ref.unit, ref.param, 0, 0};
      const auto found = std::lower_bound(keys.begin(), keys.end(), wanted);
      if (found == keys.end() || found->unit != wanted.unit || found->param != wanted.param) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' is tied to '%s.%s', which is no param of the model; "
            "tied_to names the owner by its unit's name and its param's name",
            unit.name, alias.name, ref.unit, ref.param));
      }
      if (found->unit_index >= static_cast<int>(u)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' (unit %d) is tied to '%s.%s' of unit %d, which does not "
            "come before it; the owner of a tie is in an earlier unit: tie the later unit's "
            "param to the earlier one's",
            unit.name, alias.name, u, ref.unit, ref.param, found->unit_index));
      }
      const ParamSpec& owner = model.units[found->unit_index].params[found->param_index];
      if (owner.tied_to) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' is tied to '%s.%s', which is itself tied to '%s.%s'; tie "
            "it to '%s.%s' directly",
            unit.name, alias.name, ref.unit, ref.param, owner.tied_to->unit, owner.tied_to->param,
            owner.tied_to->unit, owner.tied_to->param));
      }
      if (alias.shape != owner.shape) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' of shape %s is tied to '%s.%s' of shape %s; a tied "
            "param has its owner's shape",
            unit.name, alias.name, ShapeText(alias.shape), ref.unit, ref.param,
            ShapeText(owner.shape)));
      }
      std::string differs;
      if (alias.trainable != owner.trainable) {
        differs = absl::StrFormat("trainable %s, the owner's %s", BoolText(alias.trainable),
                                  BoolText(owner.trainable));
      } else if (alias.no_decay != owner.no_decay) {
        differs = absl::StrFormat("no_decay %s, the owner's %s", BoolText(alias.no_decay),
                                  BoolText(owner.no_decay));
      } else if (alias.lr_scale != owner.lr_scale) {
        differs = absl::StrFormat("lr_scale %g, the owner's %g", alias.lr_scale, owner.lr_scale);
      } else if (alias.weight_decay != owner.weight_decay) {
        differs = absl::StrFormat("weight_decay %s, the owner's %s", DecayText(alias.weight_decay),
                                  DecayText(owner.weight_decay));
      } else if (alias.tp_split_dim != owner.tp_split_dim) {
        differs = absl::StrFormat("tp_split_dim %d, the owner's %d", alias.tp_split_dim,
                                  owner.tp_split_dim);
      }
      if (!differs.empty()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' is tied to '%s.%s' but has %s; a tied param is its "
            "owner: give it the owner's trainable, no_decay, lr_scale, weight_decay and "
            "tp_split_dim",
            unit.name, alias.name, ref.unit, ref.param, differs));
      }
    }
  }
  return absl::OkStatus();
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

int64_t ModelSpec::NumStoredParams() const {
  CheckedInt64 n = 0;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) {
      if (p.tied_to.has_value()) continue;
      const int64_t count = p.NumElements();
      if (count < 0) return -1;
      n += count;
    }
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
  bool any_tied = false;
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
      if (p.tp_split_dim < -1 || p.tp_split_dim >= static_cast<int>(p.shape.size())) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' of shape %s has tp_split_dim %d; it must name one of its "
            "%d dimensions (0-%d) or be -1 (replicated)",
            unit.name, p.name, ShapeText(p.shape), p.tp_split_dim, p.shape.size(),
            p.shape.size() - 1));
      }
      const int64_t elements = p.NumElements();
      if (elements < 0 || elements > kMaxModelElements) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model spec: param '%s.%s' of shape %s has more than %d elements (2^56), the "
            "supported maximum for a whole model; check the shape",
            unit.name, p.name, ShapeText(p.shape), kMaxModelElements));
      }
      ZS_RETURN_IF_ERROR(ValidateGroupFields(unit.name, p));
      any_tied = any_tied || p.tied_to.has_value();
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
  if (any_tied) ZS_RETURN_IF_ERROR(ValidateTies(*this));
  return absl::OkStatus();
}

}  // namespace zeroshard

namespace zeroshard {
namespace {

// The largest number of contiguous stages the units can be cut into when no
// stage may hold more than `bound` elements, filling from the last unit
// backwards (each stage takes as many units as fit). `sizes` are the units'
// element counts, each <= bound.
int StagesNeeded(const std::vector<int64_t>& sizes, int64_t bound) {
  int stages = 0;
  int64_t filled = bound;  // forces a new stage at the first unit
  for (size_t i = sizes.size(); i-- > 0;) {
    if (filled + sizes[i] > bound) {
      ++stages;
      filled = 0;
    }
    filled += sizes[i];
  }
  return stages;
}

}  // namespace

absl::StatusOr<std::vector<std::pair<int, int>>> PipelineStageUnits(const ModelSpec& model,
                                                                    int pp) {
  ZS_RETURN_IF_ERROR(model.Validate());
  const int units = static_cast<int>(model.units.size());
  if (pp < 1 || pp > units) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pipeline stages: pp %d must be between 1 and the model's %d units (each stage holds at "
        "least one unit)",
        pp, units));
  }
  // The linear partition problem: the smallest bound B such that the units
  // fit in pp contiguous stages of at most B elements, by bisection over B
  // (the greedy count is monotone in B). Validate() bounds the total by
  // 2^56, so nothing below overflows.
  std::vector<int64_t> sizes(units);
  int64_t lo = 0;
  int64_t hi = 0;
  for (int u = 0; u < units; ++u) {
    sizes[u] = model.units[u].NumElements();
    lo = std::max(lo, sizes[u]);
    hi += sizes[u];
  }
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (StagesNeeded(sizes, mid) <= pp) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const int64_t bound = lo;
  // Cut under that bound from the last unit backwards, so the last stages
  // are the full ones and the first stage (which keeps the most micro-batches
  // in flight under 1F1B) the lightest; a stage also ends early when the
  // units left are just enough to give every earlier stage one.
  std::vector<std::pair<int, int>> stages(pp);
  int end = units;
  for (int s = pp - 1; s >= 0; --s) {
    int begin = end - 1;  // every stage takes at least one unit
    int64_t filled = sizes[begin];
    while (begin > s && filled + sizes[begin - 1] <= bound) {
      filled += sizes[--begin];
    }
    stages[s] = {begin, end};
    end = begin;
  }
  if (end != 0) {
    // Cannot happen: the bound admits pp stages, and the cut above is the
    // same greedy as StagesNeeded until the reservation takes over.
    return absl::InternalError(absl::StrFormat(
        "pipeline stages: %d units left before stage 0 under bound %d", end, bound));
  }
  return stages;
}

absl::StatusOr<ModelSpec> ShardModelSpec(const ModelSpec& model, int tp, int tp_rank, int pp,
                                         int pp_rank) {
  if (tp < 1 || tp_rank < 0 || tp_rank >= tp) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard model spec: tp rank %d of tp %d; need tp >= 1 and 0 <= tp rank < tp", tp_rank, tp));
  }
  if (pp_rank < 0 || pp_rank >= pp) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard model spec: pp rank %d of pp %d; need 0 <= pp rank < pp", pp_rank, pp));
  }
  ZS_ASSIGN_OR_RETURN(const auto stages, PipelineStageUnits(model, pp));
  ModelSpec shard;
  const auto [first, last] = stages[pp_rank];
  // A tie is stored once, in its owner's unit: both units must be on the
  // same pipeline stage (sharing a tensor across stages would need an
  // exchange of its gradient between them, which the engine does not do).
  std::vector<absl::string_view> stage_units;
  for (int u = first; u < last; ++u) {
    for (const ParamSpec& p : model.units[u].params) {
      if (!p.tied_to) continue;
      if (stage_units.empty()) {
        for (int v = first; v < last; ++v) stage_units.push_back(model.units[v].name);
        std::sort(stage_units.begin(), stage_units.end());
      }
      if (!std::binary_search(stage_units.begin(), stage_units.end(), p.tied_to->unit)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "shard model spec: param '%s.%s' is tied to '%s.%s', but pp %d puts unit '%s' on "
            "pipeline stage %d and unit '%s' on an earlier one; a tie must stay within one "
            "stage: use fewer pipeline stages or untie the params",
            model.units[u].name, p.name, p.tied_to->unit, p.tied_to->param, pp, model.units[u].name,
            pp_rank, p.tied_to->unit));
      }
    }
  }
  shard.units.assign(model.units.begin() + first, model.units.begin() + last);
  for (UnitSpec& unit : shard.units) {
    ZS_ASSIGN_OR_RETURN(unit, internal::TpShardUnit(unit, tp, internal::TpRemainder::kRefuse));
  }
  return shard;
}

namespace internal {

absl::StatusOr<std::vector<int64_t>> TpShardShape(const ParamSpec& param, int tp,
                                                  TpRemainder remainder,
                                                  const std::string& unit_name) {
  std::vector<int64_t> shape = param.shape;
  if (tp == 1 || param.tp_split_dim < 0) return shape;
  int64_t& dim = shape[param.tp_split_dim];
  if (dim % tp != 0 && remainder == TpRemainder::kRefuse) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard model spec: param '%s.%s' of shape %s splits dimension %d (%d) over tp %d, "
        "which does not divide it; choose a tp that divides it, or pad the dimension",
        unit_name, param.name, ShapeText(param.shape), param.tp_split_dim, dim, tp));
  }
  dim = dim / tp + (dim % tp != 0 ? 1 : 0);
  return shape;
}

absl::StatusOr<UnitSpec> TpShardUnit(const UnitSpec& unit, int tp, TpRemainder remainder) {
  UnitSpec out = unit;
  if (tp == 1) return out;
  for (ParamSpec& p : out.params) {
    ZS_ASSIGN_OR_RETURN(p.shape, TpShardShape(p, tp, remainder, unit.name));
  }
  return out;
}

}  // namespace internal
}  // namespace zeroshard
