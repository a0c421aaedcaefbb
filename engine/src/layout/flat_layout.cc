#include "engine/src/layout/flat_layout.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

int64_t RoundUp(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

}  // namespace

absl::StatusOr<FlatLayout> FlatLayout::Create(const ModelSpec& spec, int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrFormat("world size %d is outside [1, %d]", world_size, kMaxWorldSize));
  }
  ZS_RETURN_IF_ERROR(spec.Validate());
  FlatLayout layout;
  layout.world_size_ = world_size;
  int64_t offset = 0;
  int64_t shard_offset = 0;
  for (const UnitSpec& unit : spec.units) {
    UnitSegment seg;
    int64_t cursor = 0;
    for (const ParamSpec& p : unit.params) {
      cursor = RoundUp(cursor, kParamAlignment);
      seg.params.push_back({cursor, p.NumElements()});
      cursor += p.NumElements();
    }
    seg.used_numel = cursor;
    // Each shard is a whole number of quanta, so a per-unit shard never
    // splits a norm block and every rank gets the same length.
    seg.shard_numel = RoundUp((cursor + world_size - 1) / world_size, kShardQuantum);
    seg.padded_numel = seg.shard_numel * world_size;
    seg.offset = offset;
    seg.shard_offset = shard_offset;
    offset += seg.padded_numel;
    shard_offset += seg.shard_numel;
    layout.max_unit_numel_ = std::max(layout.max_unit_numel_, seg.padded_numel);
    layout.units_.push_back(std::move(seg));
  }
  layout.total_numel_ = offset;
  layout.shard_numel_ = shard_offset;
  return layout;
}

ElementRange FlatLayout::ShardRange(int u, int rank) const {
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

}  // namespace zeroshard
