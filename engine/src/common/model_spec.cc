#include "zeroshard/model_spec.h"

#include <algorithm>
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
