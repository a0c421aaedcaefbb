// FlatLayout: units -> padded, aligned flat segments -> per-rank shards.
//
// Each unit becomes one contiguous segment of the full flat buffer. Every
// param starts at a multiple of kParamAlignment elements from the segment
// start (so vector loads never split a param head, and so param offsets do
// not depend on the world size). The segment is zero-padded to
// world * shard_numel elements, where shard_numel is a multiple of
// kShardQuantum: rank r owns [r * shard_numel, (r + 1) * shard_numel) of
// every segment. A param may straddle shards.
//
// A rank's shard buffer is the concatenation of its shards of every unit, in
// unit order; ShardOffset(u) is where unit u's shard starts in it.
#ifndef ZEROSHARD_LAYOUT_FLAT_LAYOUT_H_
#define ZEROSHARD_LAYOUT_FLAT_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

inline constexpr int64_t kShardQuantum = 128;  // elements; shards are multiples of it
// Elements per block of the exact gradient-norm sum (kernels::kNormBlock; the
// runtime static_asserts they agree). A shard holds whole blocks, so the norm
// does not depend on where shards begin.
inline constexpr int64_t kNormBlockElements = kShardQuantum;
inline constexpr int64_t kParamAlignment = 64;  // elements; param starts within a segment
// Ranks a layout can be split over: 2^20, the largest cluster the estimator
// accepts. Nothing in a layout grows with the world size (per unit it keeps
// a shard length; a rank's range is computed on demand), and every count is
// checked: with the ModelSpec limits a padded buffer stays below 2^57
// elements.
inline constexpr int kMaxWorldSize = 1 << 20;

struct ParamSlot {
  int64_t offset = 0;  // from the start of the unit's segment
  int64_t numel = 0;
};

struct UnitSegment {
  int64_t offset = 0;        // of the segment in the full flat buffer
  int64_t used_numel = 0;    // end of the last param (params + alignment gaps)
  int64_t padded_numel = 0;  // world * shard_numel
  int64_t shard_numel = 0;   // per rank, a multiple of kShardQuantum
  int64_t shard_offset = 0;  // of this unit's shard in a rank's shard buffer
  std::vector<ParamSlot> params;
};

// A run of elements [begin, end) within a segment (or a shard).
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

class FlatLayout {
 public:
  // InvalidArgument for an invalid spec (ModelSpec::Validate), a world size
  // outside [1, kMaxWorldSize], or (unreachable within the ModelSpec limits)
  // a padded size that does not fit in int64_t.
  static absl::StatusOr<FlatLayout> Create(const ModelSpec& spec, int world_size);

  // The elements a unit's params occupy in its segment, each param starting
  // at a multiple of kParamAlignment: the used_numel Create gives the unit.
  // InvalidArgument when the count does not fit in int64_t.
  static absl::StatusOr<int64_t> UsedNumel(const UnitSpec& unit);
  // The same from the params' element counts, in order.
  static absl::StatusOr<int64_t> UsedNumel(const std::vector<int64_t>& param_numels);

  // A sizes-only layout: the segments, shards and totals Create gives a spec
  // whose units have these used_numel (UsedNumel), without the params
  // (unit(u).params is empty, so PaddingRanges does not apply). Lets the
  // planner size many slices of a validated model without copying it;
  // PlanBuffers needs nothing more. InvalidArgument for no units, a size
  // below 1, a world size outside [1, kMaxWorldSize], or a total past 2^63.
  static absl::StatusOr<FlatLayout> FromUsedNumels(const std::vector<int64_t>& used_numel,
                                                   int world_size);

  int world_size() const { return world_size_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitSegment& unit(int u) const { return units_[u]; }
  // Sum of padded segments: the full flat buffer, in elements.
  int64_t total_numel() const { return total_numel_; }
  // Sum of the unit shards: one rank's shard buffer, in elements.
  int64_t shard_numel() const { return shard_numel_; }
  // Largest padded segment (sizes per-unit staging buffers).
  int64_t max_unit_numel() const { return max_unit_numel_; }
  // Unit u's part of rank r's shard, in segment coordinates.
  ElementRange ShardRange(int u, int rank) const;
  // The padding of unit u in segment coordinates: the gaps between params
  // and the tail. Sorted, disjoint. For layouts made by Create.
  std::vector<ElementRange> PaddingRanges(int u) const;

 private:
  // Appends a segment of seg.used_numel elements, filling its shard,
  // padding and offsets; false when a count passes 2^63.
  bool AddSegment(UnitSegment seg);

  int world_size_ = 1;
  std::vector<UnitSegment> units_;
  int64_t total_numel_ = 0;
  int64_t shard_numel_ = 0;
  int64_t max_unit_numel_ = 0;
  int64_t shard_offset_ = 0;  // running sums while segments are added
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_LAYOUT_FLAT_LAYOUT_H_
