// Alpha-beta model of one optimizer step (docs/memory_model.md, "Time").
#ifndef ZEROSHARD_PLAN_INTERNAL_STEP_TIME_H_
#define ZEROSHARD_PLAN_INTERNAL_STEP_TIME_H_

#include <cstdint>

#include "engine/src/plan/internal/rank_memory.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard {
namespace internal {

// Model FLOPs of one step over `global_batch` sequences of options.seq
// tokens: 6 N per token plus 12 s (a d) L per token for attention
// (forward + backward, no recomputation). N is the active params
// (ModelDescription::active_params): a mixture of experts counts only the
// experts a token is routed to. A frozen param (ParamSpec::trainable) needs
// no weight gradient, so of its 6 FLOPs per token only the forward's 2 and
// the input gradient's 2 remain: 4 N + 2 N_trainable, with N_trainable the
// active params' trainable share (the backward still passes through every
// layer, as LoRA's adapters need it).
double ModelFlopsPerStep(const ModelDescription& model, const PlanOptions& options,
                         int64_t global_batch);

// Ring reduce-scatter or all-gather over n ranks of a buffer of `bytes`
// (the full buffer, per rank): (n - 1) alpha + (n - 1) / n * bytes / beta.
// An all-reduce costs twice this.
double RingSeconds(int n, double bytes, double gbps, double latency_us);

StepTime EstimateStepTime(const ModelDescription& model, const ClusterSpec& cluster,
                          const PlanOptions& options, int64_t global_batch, const Candidate& c,
                          const RankSizes& sizes);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_PLAN_INTERNAL_STEP_TIME_H_
