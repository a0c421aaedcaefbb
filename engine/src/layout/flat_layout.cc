#include "engine/src/layout/flat_layout.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

absl::Status CheckWorldSize(int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "world size %d is outside [1, %d] (2^20 ranks)", world_size, kMaxWorldSize));
  }
  return absl::OkStatus();
}

// Places params of `numel(i)` elements, i < count, at aligned offsets; the
// end of the last one, or nullopt past 2^63 (then *failed is the param).
template <typename NumelOf>
std::optional<int64_t> PlaceParams(size_t count, NumelOf numel_of, std::vector<ParamSlot>* slots,
                                   size_t* failed) {
  int64_t cursor = 0;
  for (size_t i = 0; i < count; ++i) {
    const int64_t numel = numel_of(i);
    const std::optional<int64_t> start = CheckedRoundUp(cursor, kParamAlignment);
    const std::optional<int64_t> end =
        start.has_value() && numel >= 0 ? CheckedAdd(*start, numel) : std::nullopt;
    if (!end.has_value()) {
      *failed = i;
      return std::nullopt;
    }
    if (slots != nullptr) slots->push_back({*start, numel});
    cursor = *end;
  }
  return cursor;
}

absl::StatusOr<int64_t> PlaceParams(const UnitSpec& unit, std::vector<ParamSlot>* slots) {
  size_t failed = 0;
  const std::optional<int64_t> used = PlaceParams(
      unit.params.size(), [&](size_t i) { return unit.params[i].NumElements(); }, slots, &failed);
  if (!used.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout of unit '%s': param '%s' ends past 2^63 elements; make the model smaller",
        unit.name, unit.params[failed].name));
  }
  return *used;
}

absl::Status Overflow(const std::string& unit, int world_size) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "layout of unit %s over %d ranks: the flat buffer passes 2^63 elements; make the model "
      "smaller",
      unit, world_size));
}

}  // namespace

bool OneSegmentPerUnit(const ModelSpec& spec) {
  for (const UnitSpec& unit : spec.units) {
    for (const ParamSpec& p : unit.params) {
      if (!p.trainable || p.tied_to.has_value()) return false;
    }
  }
  return true;
}

bool FlatLayout::AddSegment(UnitSegment seg) {
  const int64_t used = seg.used_numel;
  // Each shard is a whole number of quanta, so a per-unit shard never
  // splits a norm block and every rank gets the same length.
  const int64_t per_rank = used / world_size_ + (used % world_size_ != 0 ? 1 : 0);
  const std::optional<int64_t> shard = CheckedRoundUp(per_rank, kShardQuantum);
  const std::optional<int64_t> padded =
      shard.has_value() ? CheckedMul(*shard, world_size_) : std::nullopt;
  const std::optional<int64_t> end =
      padded.has_value() ? CheckedAdd(total_numel_, *padded) : std::nullopt;
  if (!end.has_value()) return false;
  seg.shard_numel = *shard;
  seg.padded_numel = *padded;
  seg.offset = total_numel_;
  seg.shard_offset = shard_offset_;
  total_numel_ = *end;
  shard_offset_ += *shard;  // at most total_numel_
  shard_numel_ = shard_offset_;
  // The trainable segments' sums are parts of the sums above: no overflow.
  if (seg.trainable) {
    seg.train_offset = train_total_numel_;
    seg.train_shard_offset = train_shard_numel_;
    train_total_numel_ += *padded;
    train_shard_numel_ += *shard;
    max_unit_numel_ = std::max(max_unit_numel_, *padded);
  } else {
    seg.train_offset = -1;
    seg.train_shard_offset = -1;
  }
  units_.push_back(std::move(seg));
  return true;
}

absl::StatusOr<StorageMap> MapStorage(const ModelSpec& spec) {
  const int units = static_cast<int>(spec.units.size());
  StorageMap map;
  map.unit_segments.resize(units);
  map.places.resize(units);
  // The ties, by name only in a model that has them: per alias param its
  // owner's (unit, param), per owner param its aliases' units.
  std::vector<std::vector<std::pair<int, int>>> owner_of(units);
  std::vector<std::vector<std::vector<int>>> alias_units(units);
  absl::flat_hash_map<std::string, int> unit_index;
  for (int u = 0; u < units; ++u) {
    const UnitSpec& unit = spec.units[u];
    map.places[u].assign(unit.params.size(), ParamPlace{});
    owner_of[u].assign(unit.params.size(), {-1, -1});
    alias_units[u].resize(unit.params.size());
  }
  for (int u = 0; u < units; ++u) {
    const UnitSpec& unit = spec.units[u];
    for (size_t p = 0; p < unit.params.size(); ++p) {
      if (!unit.params[p].tied_to.has_value()) continue;
      if (unit_index.empty()) {
        for (int v = 0; v < units; ++v) unit_index.emplace(spec.units[v].name, v);
      }
      const ParamRef& ref = *unit.params[p].tied_to;
      const auto it = unit_index.find(ref.unit);
      int op = -1;
      if (it != unit_index.end()) {
        const std::vector<ParamSpec>& owner_params = spec.units[it->second].params;
        for (int k = 0; k < static_cast<int>(owner_params.size()) && op < 0; ++k) {
          if (owner_params[k].name == ref.param) op = k;
        }
      }
      if (op < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "unit '%s' param '%s' is tied to '%s.%s', which the model does not have; tie it to a "
            "param of an earlier unit",
            unit.name, unit.params[p].name, ref.unit, ref.param));
      }
      owner_of[u][p] = {it->second, op};
      alias_units[it->second][op].push_back(u);
    }
  }
  auto add = [&](int u, std::vector<int> which, bool trainable, int tied_param) {
    if (which.empty()) return;
    const int segment = static_cast<int>(map.segments.size());
    for (size_t i = 0; i < which.size(); ++i) {
      map.places[u][which[i]] = {segment, static_cast<int>(i)};
    }
    std::vector<int> users;
    if (trainable) {
      users.push_back(u);
      if (tied_param >= 0) {
        for (int a : alias_units[u][tied_param]) users.push_back(a);
      }
      users.erase(std::unique(users.begin(), users.end()), users.end());
    }
    map.users.push_back(std::move(users));
    map.unit_segments[u].push_back(segment);
    map.segments.push_back({u, tied_param, trainable, std::move(which)});
  };
  for (int u = 0; u < units; ++u) {
    const UnitSpec& unit = spec.units[u];
    std::vector<int> trained;
    std::vector<int> frozen;
    std::vector<int> owners;
    for (int p = 0; p < static_cast<int>(unit.params.size()); ++p) {
      const ParamSpec& param = unit.params[p];
      if (param.tied_to.has_value()) continue;  // its owner's storage
      if (!alias_units[u][p].empty()) {
        owners.push_back(p);
      } else {
        (param.trainable ? trained : frozen).push_back(p);
      }
    }
    add(u, std::move(trained), true, -1);
    add(u, std::move(frozen), false, -1);
    for (int p : owners) add(u, {p}, unit.params[p].trainable, p);
  }
  // An alias is its owner's storage; its unit reads the owner's segment.
  for (int u = 0; u < units; ++u) {
    for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
      const auto [ou, op] = owner_of[u][p];
      if (ou < 0) continue;
      map.places[u][p] = map.places[ou][op];
      map.unit_segments[u].push_back(map.places[u][p].segment);
    }
    std::vector<int>& segs = map.unit_segments[u];
    std::sort(segs.begin(), segs.end());
    segs.erase(std::unique(segs.begin(), segs.end()), segs.end());
  }
  return map;
}

absl::StatusOr<FlatLayout> FlatLayout::Create(const ModelSpec& spec, int world_size) {
  ZS_RETURN_IF_ERROR(CheckWorldSize(world_size));
  ZS_RETURN_IF_ERROR(spec.Validate());
  ZS_ASSIGN_OR_RETURN(StorageMap map, MapStorage(spec));
  FlatLayout layout;
  layout.world_size_ = world_size;
  layout.units_.reserve(map.segments.size());
  for (const StorageSegment& s : map.segments) {
    const UnitSpec& unit = spec.units[s.spec_unit];
    UnitSegment seg;
    seg.trainable = s.trainable;
    seg.spec_unit = s.spec_unit;
    seg.tied_param = s.tied_param;
    size_t failed = 0;
    const std::optional<int64_t> used = PlaceParams(
        s.params.size(), [&](size_t i) { return unit.params[s.params[i]].NumElements(); },
        &seg.params, &failed);
    if (!used.has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layout of unit '%s': param '%s' ends past 2^63 elements; make the model smaller",
          unit.name, unit.params[s.params[failed]].name));
    }
    seg.used_numel = *used;
    for (size_t i = 0; i < s.params.size(); ++i) {
      seg.params[i].spec_unit = s.spec_unit;
      seg.params[i].spec_param = s.params[i];
    }
    if (!layout.AddSegment(std::move(seg))) {
      return Overflow(absl::StrCat("'", unit.name, "'"), world_size);
    }
  }
  layout.spec_segments_ = std::move(map.unit_segments);
  layout.places_ = std::move(map.places);
  layout.users_ = std::move(map.users);
  return layout;
}

absl::StatusOr<int64_t> FlatLayout::UsedNumel(const UnitSpec& unit) {
  return PlaceParams(unit, nullptr);
}

absl::StatusOr<int64_t> FlatLayout::UsedNumel(const std::vector<int64_t>& param_numels) {
  size_t failed = 0;
  const std::optional<int64_t> used = PlaceParams(
      param_numels.size(), [&](size_t i) { return param_numels[i]; }, nullptr, &failed);
  if (!used.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout: param %d of %d elements ends past 2^63 elements; make the model smaller", failed,
        param_numels[failed]));
  }
  return *used;
}

absl::StatusOr<FlatLayout> FlatLayout::FromUsedNumels(
    const std::vector<int64_t>& used_numel, int world_size, const std::vector<bool>& trainable,
    const std::vector<std::vector<int>>& unit_segments) {
  ZS_RETURN_IF_ERROR(CheckWorldSize(world_size));
  if (used_numel.empty()) return absl::InvalidArgumentError("layout: no units");
  if (!trainable.empty() && trainable.size() != used_numel.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("layout: %d trainable flags for %d units",
                                                      trainable.size(), used_numel.size()));
  }
  const int segments = static_cast<int>(used_numel.size());
  FlatLayout layout;
  layout.world_size_ = world_size;
  layout.units_.reserve(used_numel.size());
  if (unit_segments.empty()) {
    layout.spec_segments_.resize(segments);
    for (int s = 0; s < segments; ++s) layout.spec_segments_[s] = {s};
  } else {
    layout.spec_segments_ = unit_segments;
  }
  layout.places_.resize(layout.spec_segments_.size());
  // The units that read each segment, in unit order; the first is the
  // segment's spec unit (Create's owner reads its own segments first).
  std::vector<std::vector<int>> readers(segments);
  for (size_t u = 0; u < layout.spec_segments_.size(); ++u) {
    std::vector<int>& segs = layout.spec_segments_[u];
    std::sort(segs.begin(), segs.end());
    segs.erase(std::unique(segs.begin(), segs.end()), segs.end());
    for (int s : segs) {
      if (s < 0 || s >= segments) {
        return absl::InvalidArgumentError(
            absl::StrFormat("layout: unit %d reads segment %d of %d; list segments in [0, %d)", u,
                            s, segments, segments));
      }
      readers[s].push_back(static_cast<int>(u));
    }
  }
  layout.users_.reserve(used_numel.size());
  for (int s = 0; s < segments; ++s) {
    if (used_numel[s] < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layout: unit %d uses %d elements; it must use at least one", s, used_numel[s]));
    }
    if (readers[s].empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("layout: no unit reads segment %d; list it in its unit's segments", s));
    }
    UnitSegment seg;
    seg.used_numel = used_numel[s];
    seg.trainable = trainable.empty() || trainable[s];
    seg.spec_unit = readers[s].front();
    layout.users_.push_back(seg.trainable ? readers[s] : std::vector<int>{});
    if (!layout.AddSegment(std::move(seg))) return Overflow(absl::StrCat("#", s), world_size);
  }
  return layout;
}

ElementRange FlatLayout::ShardRange(int u, int rank) const {
  // rank * len <= padded_numel, which AddSegment checked.
  const int64_t len = units_[u].shard_numel;
  return {rank * len, (rank + 1) * len};
}

std::vector<ElementRange> FlatLayout::PaddingRanges(int u) const {
  std::vector<ElementRange> out;
  const UnitSegment& seg = units_[u];
  int64_t cursor = 0;
  for (const ParamSlot& p : seg.params) {
    if (p.offset > cursor) out.push_back({cursor, p.offset});
    cursor = p.offset + p.numel;
  }
  if (seg.padded_numel > cursor) out.push_back({cursor, seg.padded_numel});
  return out;
}

}  // namespace zeroshard::internal
