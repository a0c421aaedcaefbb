// ParamGatherer: the params as the trainer sees them between Gather and
// Release.
//
// It owns
//   - the pairing of Gather and Release of every unit, at every stage (a
//     trainer's missing Gather fails at stage 0 as at stage 3);
//   - the updated-param all-gathers: with the optimizer sharded (stages
//     1-2, stage 3's resident units) each rank updates its shard and Step
//     all-gathers the units; Gather(u) waits for u's, so they overlap the
//     forward of the units before it;
//   - stage 3's gather pool: a fixed number of slots a unit is all-gathered
//     into, one held at a time, the oldest evicted first; a slot keeps its
//     unit after Release, so a Gather right after (forward to backward) is
//     free;
//   - stage-3 prefetch: the first step records the order of its Gathers;
//     from then on the next units of that order are gathered ahead, while
//     the trainer computes, and a step that leaves the order turns
//     prefetch off (said once on stderr).
#ifndef ZEROSHARD_RUNTIME_PARAM_GATHERER_H_
#define ZEROSHARD_RUNTIME_PARAM_GATHERER_H_

#include <cstdint>
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

  // The memory of unit `unit`'s params (segment coordinates), complete on
  // every rank: waits for the unit's all-gather. `step` (1-based) and
  // `first_step` (the first since Start: stage 3 records its order) only
  // name and drive prefetch. FailedPrecondition: stage 3 already holds
  // another unit.
  absl::StatusOr<void*> Gather(int unit, int64_t step, bool first_step);
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
  // Stage 3, at the end of step `step` (1-based; `first_step` as in
  // Gather): turns prefetch on after the first step, or off when this step
  // left the recorded order, and gathers the next step's first units.
  absl::Status EndStep(int64_t step, bool first_step);

  // The stage-3 unit between Gather and Release, or -1.
  int held_unit() const { return held_unit_; }
  bool prefetch_active() const { return prefetch_active_; }
  // "no unit is gathered", or the units that are ("'block.1' is gathered").
  std::string DescribeGathered() const;

 private:
  // A stage-3 gather buffer and the unit it holds (or receives).
  struct GatherSlot {
    int unit = -1;
    bool held = false;   // between Gather and Release
    CommHandle gather;   // all-gather in flight into the slot
    int64_t issued = 0;  // issue counter, to evict the oldest
  };

  absl::StatusOr<void*> GatherSharded(int unit, int64_t step, bool first_step);
  absl::StatusOr<int> AcquireSlot(int protect_from);
  absl::Status IssueUnitGather(int unit, int slot);
  absl::Status PrefetchFrom(size_t order_pos);
  void DisablePrefetch(const std::string& why);

  const ModelSpec& model_;
  const FlatLayout& layout_;
  const BufferPlan& plan_;
  int rank_;
  int world_;
  DType param_dtype_;
  const ShardBuffers& buffers_;
  RuntimeServices& services_;

  std::vector<char> gathered_;               // per unit: between Gather and Release
  std::vector<CommHandle> updated_gathers_;  // per unit: all-gather of updated params
  std::vector<GatherSlot> slots_;
  std::vector<int> unit_slot_;  // per unit: slot holding it, -1
  int held_unit_ = -1;
  int64_t issue_counter_ = 0;
  std::vector<int> recorded_order_;  // Gather() calls of the first step
  size_t order_pos_ = 0;             // this step's position in it
  bool prefetch_active_ = false;
  bool prefetch_fallback_reported_ = false;
  int prefetch_depth_ = 0;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_PARAM_GATHERER_H_
