#include "engine/src/layout/flat_layout.h"

#include <algorithm>
#include <optional>

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
  max_unit_numel_ = std::max(max_unit_numel_, *padded);
  units_.push_back(std::move(seg));
  return true;
}

absl::StatusOr<FlatLayout> FlatLayout::Create(const ModelSpec& spec, int world_size) {
  ZS_RETURN_IF_ERROR(CheckWorldSize(world_size));
  ZS_RETURN_IF_ERROR(spec.Validate());
  FlatLayout layout;
  layout.world_size_ = world_size;
  layout.units_.reserve(spec.units.size());
  for (const UnitSpec& unit : spec.units) {
    UnitSegment seg;
    seg.params.reserve(unit.params.size());
    ZS_ASSIGN_OR_RETURN(seg.used_numel, PlaceParams(unit, &seg.params));
    if (!layout.AddSegment(std::move(seg))) {
      return Overflow(absl::StrCat("'", unit.name, "'"), world_size);
    }
  }
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

absl::StatusOr<FlatLayout> FlatLayout::FromUsedNumels(const std::vector<int64_t>& used_numel,
                                                      int world_size) {
  ZS_RETURN_IF_ERROR(CheckWorldSize(world_size));
  if (used_numel.empty()) return absl::InvalidArgumentError("layout: no units");
  FlatLayout layout;
  layout.world_size_ = world_size;
  layout.units_.reserve(used_numel.size());
  for (size_t u = 0; u < used_numel.size(); ++u) {
    if (used_numel[u] < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layout: unit %d uses %d elements; it must use at least one", u, used_numel[u]));
    }
    UnitSegment seg;
    seg.used_numel = used_numel[u];
    if (!layout.AddSegment(std::move(seg))) return Overflow(absl::StrCat("#", u), world_size);
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
