// FlatLayout: units -> padded, aligned flat segments -> per-rank shards.
//
// Storage: a unit's params are stored in segments (the layout's "units"
// below; the engine's grain of gathering, reduction and checkpoint files):
//   - its trainable params, in spec order, in one segment;
//   - its frozen params (ParamSpec::trainable false), in a second one,
//     which has params but no gradient, master or moments;
//   - each param another unit ties to (ParamSpec::tied_to) in a segment of
//     its own, which both units gather and whose gradient both write;
//   - a tied alias is stored nowhere: it is its owner's segment.
// The segments of a unit follow each other in that order, units in spec
// order; a model without frozen or tied params has exactly one segment per
// unit, in unit order (the layout of format version 1 checkpoints).
//
// Each segment is one contiguous run of the full flat buffer. Every
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
  // The param of the ModelSpec stored here (Create; -1 for FromUsedNumels).
  int spec_unit = -1;
  int spec_param = -1;
};

struct UnitSegment {
  int64_t offset = 0;        // of the segment in the full flat buffer
  int64_t used_numel = 0;    // end of the last param (params + alignment gaps)
  int64_t padded_numel = 0;  // world * shard_numel
  int64_t shard_numel = 0;   // per rank, a multiple of kShardQuantum
  int64_t shard_offset = 0;  // of this unit's shard in a rank's shard buffer
  // Frozen segments hold params only: no gradient, master or moments.
  bool trainable = true;
  // Of the gradient and optimizer buffers, which hold trainable segments
  // only (-1 for a frozen segment): the segment's offset in a full buffer
  // and its shard's offset in a rank's shard buffer.
  int64_t train_offset = 0;
  int64_t train_shard_offset = 0;
  // The ModelSpec unit that stores its params here (for names), and for a
  // tied param's own segment the param's index (else -1).
  int spec_unit = -1;
  int tied_param = -1;
  std::vector<ParamSlot> params;
};

// Where a ModelSpec param is stored: segment and slot index in it.
struct ParamPlace {
  int segment = -1;
  int slot = -1;
};

// A run of elements [begin, end) within a segment (or a shard).
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Whether Create stores every unit of `spec` in one segment, in unit order:
// no frozen and no tied params.
bool OneSegmentPerUnit(const ModelSpec& spec);

// How `spec` is stored (the rules at the top of this file), without sizes:
// Create lays these segments out, and the planner sizes the same segments
// of a tensor-parallel slice. O(params).
struct StorageSegment {
  int spec_unit = -1;
  int tied_param = -1;  // the tied param a segment of its own holds, else -1
  bool trainable = true;
  std::vector<int> params;  // indices into spec.units[spec_unit].params, in order
};
struct StorageMap {
  std::vector<StorageSegment> segments;         // in layout order; a unit's own ones together
  std::vector<std::vector<int>> unit_segments;  // per unit: FlatLayout::SegmentsOf
  std::vector<std::vector<ParamPlace>> places;  // per unit and param: FlatLayout::PlaceOf
  std::vector<std::vector<int>> users;          // per segment: FlatLayout::UsersOf
};
// InvalidArgument naming the param when a tie names no param of the spec
// (ModelSpec::Validate refuses it first).
absl::StatusOr<StorageMap> MapStorage(const ModelSpec& spec);

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
  // whose segments have these used_numel (UsedNumel), without the params
  // (unit(u).params is empty, so PaddingRanges does not apply).
  // `trainable` (empty: all trainable) marks the frozen ones.
  // `unit_segments` (empty: segment s is spec unit s's alone) lists, per
  // spec unit, the segments it reads (SegmentsOf: its own, then the tied
  // ones it aliases); UsersOf a trainable segment is then the units that
  // list it, as Create makes them. With the segments Create would make for
  // a spec (in its order) and their grouping, PlanBuffers of this layout is
  // PlanBuffers of Create's. Lets the planner size many slices of a
  // validated model without copying it; PlanBuffers needs nothing more.
  // InvalidArgument for no units, a size below 1, a world size outside
  // [1, kMaxWorldSize], a total past 2^63, flags or a segment index that do
  // not match the segments, or a segment no unit lists.
  static absl::StatusOr<FlatLayout> FromUsedNumels(
      const std::vector<int64_t>& used_numel, int world_size,
      const std::vector<bool>& trainable = {},
      const std::vector<std::vector<int>>& unit_segments = {});

  int world_size() const { return world_size_; }
  // Segments ("units" of the layout; see the top of this file).
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitSegment& unit(int u) const { return units_[u]; }
  // Sum of padded segments: the full flat buffer (params), in elements.
  int64_t total_numel() const { return total_numel_; }
  // Sum of the unit shards: one rank's shard buffer (params), in elements.
  int64_t shard_numel() const { return shard_numel_; }
  // The same over the trainable segments: the gradient and optimizer buffers.
  int64_t train_total_numel() const { return train_total_numel_; }
  int64_t train_shard_numel() const { return train_shard_numel_; }
  // Largest padded trainable segment (sizes per-unit staging buffers).
  int64_t max_unit_numel() const { return max_unit_numel_; }

  // The spec's side (Create; FromUsedNumels: its unit_segments, or unit s
  // reads segment s).
  int num_spec_units() const { return static_cast<int>(spec_segments_.size()); }
  // The segments spec unit `unit` reads: its own, then the tied segments it
  // uses (its own ties and those it aliases), in segment order.
  const std::vector<int>& SegmentsOf(int unit) const { return spec_segments_[unit]; }
  // Where param `param` of spec unit `unit` is stored (an alias: its owner's).
  ParamPlace PlaceOf(int unit, int param) const { return places_[unit][param]; }
  // The spec units whose gradient writes segment `segment` (its uses): one,
  // or a tied param's owner and aliases, in unit order. Empty when frozen.
  const std::vector<int>& UsersOf(int segment) const { return users_[segment]; }
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
  int64_t train_total_numel_ = 0;
  int64_t train_shard_numel_ = 0;
  int64_t max_unit_numel_ = 0;
  int64_t shard_offset_ = 0;  // running sums while segments are added
  std::vector<std::vector<int>> spec_segments_;
  std::vector<std::vector<ParamPlace>> places_;
  std::vector<std::vector<int>> users_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_LAYOUT_FLAT_LAYOUT_H_
