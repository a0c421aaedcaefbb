// ParamGatherer: the params as the trainer sees them between Gather and
// Release.
//
// The trainer gathers ModelSpec units; a unit reads the layout's storage
// segments (flat_layout.h): its trainable and frozen params' segments and
// the tied params' segments it uses. The gatherer owns
//   - the pairing of Gather and Release of every unit, at every stage (a
//     trainer's missing Gather fails at stage 0 as at stage 3);
//   - the updated-param all-gathers: with the optimizer sharded (stages
//     1-2, stage 3's resident segments) each rank updates its shard and
//     Step all-gathers the trainable segments; Gather(u) waits for u's, so
//     they overlap the forward of the units before it;
//   - stage 3's gather pool: a fixed number of slots a segment is
//     all-gathered into; the trainer holds at most max_gathered_units units
//     at once (a segment two held units read, a tied param, is gathered
//     once and held by both); the oldest slot no unit holds is evicted
//     first, and a slot keeps its segment after Release, so a Gather right
//     after (forward to backward) is free;
//   - stage-3 prefetch: the first step records the order of its segment
//     gathers (a recompute pass's repeated gathers included); from then on
//     the next segments of that order are gathered ahead, while the trainer
//     computes, and a step that leaves the order fails with an error naming
//     the gather (prefetch would otherwise miss, silently).
#ifndef ZEROSHARD_RUNTIME_PARAM_GATHERER_H_
#define ZEROSHARD_RUNTIME_PARAM_GATHERER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/runtime/runtime_services.h"
#include "engine/src/runtime/shard_buffers.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

class ParamGatherer {
 public:
  // Every reference must outlive the gatherer.
  ParamGatherer(const ModelSpec& model, const FlatLayout& layout, const BufferPlan& plan, int rank,
                DType param_dtype, const ShardBuffers& buffers, RuntimeServices& services);
  // Waits for every all-gather still in flight (peers may read our buffers).
  ~ParamGatherer();

  // OffloadSpec::params host or nvme: copies this rank's shard of `unit`
  // from its tier into device memory `device` (a kParamStageBuffer slot)
  // and returns when it is there; the all-gather then reads the device copy.
  using ShardFetch = std::function<absl::Status(int unit, void* device)>;
  void set_shard_fetch(ShardFetch fetch) { fetch_ = std::move(fetch); }

  // hpZ: the group of plan.secondary_partition_size consecutive ranks that
  // share the secondary copy (a Split of the engine's communicator; must
  // outlive the gatherer). A segment's first gather of a step goes to every
  // rank and leaves this rank's piece in the secondary buffer; its later
  // gathers (until the optimizer rewrites it) all-gather the pieces within
  // the group.
  void set_secondary_group(Communicator* group) { secondary_ = group; }
  int64_t secondary_gathers() const { return secondary_gathers_; }

  // The memory of spec unit `unit`'s params: per segment of
  // layout.SegmentsOf(unit), in segment coordinates, complete on every
  // rank (waits for the all-gathers). `step` (1-based) and `first_step`
  // (the first since Start: stage 3 records its order) name and drive
  // prefetch. FailedPrecondition: the unit is gathered already; stage 3
  // holds max_gathered_units units; a later step's gather leaves the first
  // step's order (with prefetch).
  absl::StatusOr<std::vector<void*>> Gather(int unit, int64_t step, bool first_step);
  // FailedPrecondition when the unit is not gathered (naming those that are).
  absl::Status Release(int unit);

  // After the optimizer updated this rank's shard: all-gathers every
  // resident unit (optimizer sharded; nothing on one rank).
  void IssueUpdatedParamGathers();
  // Waits for those all-gathers (a read of every param: GetParam, Load).
  absl::Status WaitUpdatedParamGathers(WaitSite site);
  // Stage 3, before the optimizer rewrites the shards the pool's copies
  // came from: finishes and forgets them.
  absl::Status DropPool();
  // Stage 3, before the engine rewrites frozen segment `segment`'s shard
  // between steps (SetFrozenParam): finishes and forgets the pool's copy
  // of it (kept across steps otherwise) and its hpZ secondary piece.
  absl::Status DropSegment(int segment);
  // Stage 3, at the end of step `step` (1-based; `first_step` as in
  // Gather): turns prefetch on after the first step, or off when this step
  // left the recorded order, and gathers the next step's first units.
  absl::Status EndStep(int64_t step, bool first_step);

  // A unit between Gather and Release, or -1.
  int held_unit() const;
  // Engine::SetEvalMode: gathers in eval mode are not recorded, not checked
  // against the first step's order and prefetch nothing; leaving it
  // prefetches from where the step's order stands (the caller checks that
  // no unit is gathered).
  absl::Status SetEval(bool eval);
  bool prefetch_active() const { return prefetch_active_; }
  // Stage 3 since Start: segment gathers, those whose all-gather was issued
  // before the Gather that wanted it (prefetched, or kept from an earlier
  // Gather), and those that had to wait for theirs.
  int64_t segment_gathers() const { return segment_gathers_; }
  int64_t gathers_ahead() const { return gathers_ahead_; }
  int64_t gathers_waited() const { return gathers_waited_; }
  // "no unit is gathered", or the units that are ("'block.1' is gathered").
  std::string DescribeGathered() const;

 private:
  // A stage-3 gather buffer and the segment it holds (or receives).
  struct GatherSlot {
    int unit = -1;       // the segment
    int holds = 0;       // spec units between Gather and Release that read it
    CommHandle gather;   // all-gather in flight into the slot
    int64_t issued = 0;  // issue counter, to evict the oldest
    // qwZ: the gathered int8 packs are unpacked into the slot (done on the
    // segment's first use after its gather).
    bool dequantized = true;
    // hpZ: the gather went to every rank: keep this rank's piece once done.
    bool keep_secondary = false;
  };
  // One gather of the first step's order.
  struct OrderEntry {
    int segment = -1;
    int unit = -1;  // the spec unit whose Gather wanted it
  };

  absl::StatusOr<void*> GatherSegment(int segment, int unit, int64_t step, bool first_step);
  // qwZ: unpacks the slot's gathered int8 packs into it, once per gather;
  // hpZ: then keeps this rank's piece of a world gather.
  absl::Status Dequantize(int slot);
  absl::Status KeepSecondary(int slot);
  absl::Status CheckOrder(int segment, int unit, int64_t step);
  absl::StatusOr<int> AcquireSlot(int protect_from);
  absl::Status IssueUnitGather(int unit, int slot);
  absl::Status PrefetchFrom(size_t order_pos);
  bool InWindow(int segment, size_t order_pos) const;
  void Unhold(int unit);

  const ModelSpec& model_;
  const FlatLayout& layout_;
  const BufferPlan& plan_;
  int rank_;
  int world_;
  DType param_dtype_;
  const ShardBuffers& buffers_;
  RuntimeServices& services_;

  std::vector<char> gathered_;               // per spec unit: between Gather and Release
  std::vector<CommHandle> updated_gathers_;  // per segment: all-gather of updated params
  std::vector<GatherSlot> slots_;
  std::vector<int> unit_slot_;  // per segment: slot holding it, -1
  int held_units_ = 0;          // spec units holding a slot
  int64_t issue_counter_ = 0;
  std::vector<OrderEntry> recorded_order_;  // sharded segment gathers of the first step
  size_t order_pos_ = 0;                    // this step's position in it
  bool eval_ = false;                       // Engine::SetEvalMode
  bool prefetch_active_ = false;
  int prefetch_depth_ = 0;
  int64_t segment_gathers_ = 0;
  // hpZ.
  Communicator* secondary_ = nullptr;
  std::vector<char> secondary_valid_;  // [segment] its piece holds this step's params
  int64_t secondary_gathers_ = 0;
  int64_t gathers_ahead_ = 0;
  int64_t gathers_waited_ = 0;
  ShardFetch fetch_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_PARAM_GATHERER_H_
