// Per-rank memory of one candidate: the rank's slice of the model (tensor
// split, pipeline stage), its buffers (PlanBuffers, then the analytic
// changes for stage 3, offload and fp16) and its activations.
#ifndef ZEROSHARD_PLAN_INTERNAL_RANK_MEMORY_H_
#define ZEROSHARD_PLAN_INTERNAL_RANK_MEMORY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/src/plan/model_description.h"
#include "engine/src/plan/planner.h"
#include "zeroshard/model_spec.h"

namespace zeroshard {
namespace internal {

// What the time model needs to know about the rank with the most params.
struct RankSizes {
  int64_t full_numel = 0;   // the rank's flat buffer (params it computes with)
  int64_t shard_numel = 0;  // its data-parallel shard
  int64_t layers = 0;       // transformer layers on its pipeline stage
};

// The params one rank of pipeline stage `pp_stage` (of `pp`) holds with
// tensor-parallel degree `tp`: split dimensions divided by tp (rounded up,
// as Megatron pads the vocabulary), only the stage's units (units before
// the layers go to the first stage, after them to the last; a tied
// embedding is also kept on the last stage). `layers` receives the number
// of transformer layers in the slice.
ModelSpec RankSlice(const ModelDescription& model, int tp, int pp, int pp_stage, int64_t* layers);

// Fills candidate.buffers, per_gpu, per_rank_host, per_node_host_bytes,
// worst_pp_stage, engine_supported, fits and verdict from candidate.stage,
// offload, tp, pp, dp and micro_batches. `options.seq` must be resolved.
// InvalidArgument when the data-parallel size exceeds the layout's limit.
absl::Status FillRankMemory(const ModelDescription& model, const ClusterSpec& cluster,
                            const PlanOptions& options, Candidate& candidate, RankSizes* sizes);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_PLAN_INTERNAL_RANK_MEMORY_H_
