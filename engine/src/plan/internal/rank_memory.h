// Per-rank memory of one candidate: the rank's slice of the model (tensor
// split, pipeline stage), its buffers (PlanBuffers with the candidate's
// stage and offload) and its activations. Every byte
// count is checked: a sum that would pass 2^63 is an error, never a wrapped
// number.
#ifndef ZEROSHARD_PLAN_INTERNAL_RANK_MEMORY_H_
#define ZEROSHARD_PLAN_INTERNAL_RANK_MEMORY_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/src/layout/flat_layout.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/model_spec.h"

namespace zeroshard {
namespace internal {

// What the time model needs to know about the rank with the most params.
struct RankSizes {
  int64_t full_numel = 0;   // the rank's flat buffer (params it computes with)
  int64_t shard_numel = 0;  // its data-parallel shard
  int64_t layers = 0;       // transformer layers on its pipeline stage
  // The trainable segments of each (FlatLayout::train_total_numel and
  // train_shard_numel): what has gradients and optimizer state. Equal to
  // the above when nothing is frozen.
  int64_t trainable_full_numel = 0;
  int64_t trainable_shard_numel = 0;
};

// The unit the last pipeline stage of a tied-embedding model adds.
inline constexpr char kTiedEmbeddingCopyUnit[] = "lm_head_tied_copy";

// The units of pipeline stage `pp_stage` (of `pp`), as indices into the
// model's units: units before the layers go to the first stage, after them
// to the last, which also keeps a copy of a tied token embedding (pp > 1):
// the copy replaces the LM head unit that aliases the embedding there.
struct StageUnits {
  std::vector<int> units;
  bool tied_embedding_copy = false;
  int64_t layers = 0;  // transformer layers among them
};
StageUnits UnitsOfStage(const ModelDescription& model, int pp, int pp_stage);

// The params one rank of pipeline stage `pp_stage` (of `pp`) holds with
// tensor-parallel degree `tp`: split dimensions divided by tp (rounded up,
// as Megatron pads the vocabulary), only the stage's units (units before
// the layers go to the first stage, after them to the last; a tied
// embedding is also kept on the last stage). `layers` receives the number
// of transformer layers in the slice.
ModelSpec RankSlice(const ModelDescription& model, int tp, int pp, int pp_stage, int64_t* layers);

// The storage segments (FlatLayout, top of flat_layout.h) of every unit of
// the model sliced for tensor-parallel degree tp, and of the tied-embedding
// copy, with the used_numel (FlatLayout::UsedNumel) and trainable flag of
// each: all the layout needs, computed once per tp and shared by every
// pipeline split, data-parallel size and GPU count of a plan. Per unit, as
// FlatLayout::Create stores it: its trainable params in one segment, its
// frozen ones (ParamSpec::trainable false) in a second, each param another
// unit ties to (ParamSpec::tied_to) in a segment of its own; an alias is
// its owner's segment and adds nothing (a unit of aliases only has no
// segment). Gradients, the fp32 master and the Adam moments exist for the
// trainable segments only. O(params) time, and memory per segment, not per
// param.
struct SliceSizes {
  std::vector<int64_t> segment_used;
  std::vector<bool> segment_trainable;
  // Unit u's own segments are [unit_segments[u], unit_segments[u + 1]).
  std::vector<int> unit_segments;
  // The tied segments units read as aliases: (unit, segment), sorted.
  std::vector<std::pair<int, int>> alias_reads;
  // Every unit has exactly one segment and nothing is tied: the grouping
  // FlatLayout::FromUsedNumels assumes by default.
  bool one_segment_per_unit = true;
  // The tied-embedding copy: the embedding unit's first param alone.
  int64_t tied_copy_used = 0;
  bool tied_copy_trainable = true;
};
absl::StatusOr<SliceSizes> SizeSlices(const ModelDescription& model, int tp);

// One tensor x pipeline x data-parallel split, laid out once (sizes only,
// FlatLayout::FromUsedNumels over the storage segments of SliceSizes, with
// their trainable flags and per-unit grouping: the layout FlatLayout::Create
// gives the RankSlice, as far as PlanBuffers reads it) and shared by every
// ZeRO stage and offload choice of that split.
struct SplitLayout {
  struct Stage {
    int index = 0;       // pipeline stage
    int64_t layers = 0;  // transformer layers on it
    FlatLayout layout;   // one rank's slice over dp ranks, sizes only
  };
  // The pipeline stages that can need the most memory: all of them, or for
  // a transformer (whose layers are alike) the first, the second and the
  // last: the middle stages hold the same layers, and the second keeps the
  // most micro-batches in flight of them (1F1B).
  std::vector<Stage> stages;
};

// `sizes` is SizeSlices(model, tp). InvalidArgument when a slice cannot be
// laid out over dp ranks.
absl::StatusOr<SplitLayout> LayOutSplit(const ModelDescription& model, const SliceSizes& sizes,
                                        int pp, int dp);

// Fills candidate.buffers, per_gpu, per_rank_host, per_node_host_bytes,
// worst_pp_stage, engine_supported, fits and verdict from candidate.stage,
// offload, tp, pp, dp and micro_batches over `split` (LayOutSplit of the
// same tp, pp and dp). `options.seq` must be resolved. InvalidArgument,
// naming the quantity, when a buffer, the activations or a sum of them does
// not fit in int64_t.
absl::Status FillRankMemory(const ModelDescription& model, const ClusterSpec& cluster,
                            const PlanOptions& options, const SplitLayout& split,
                            Candidate& candidate, RankSizes* sizes);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_PLAN_INTERNAL_RANK_MEMORY_H_
