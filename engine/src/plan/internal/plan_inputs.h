// The planner's inputs, checked: the cluster and the options against their
// documented ranges (docs/estimator.md), the model against the options, and
// the batch counts against 2^63. Every error is one InvalidArgument line
// naming the flag and saying what to do.
#ifndef ZEROSHARD_PLAN_INTERNAL_PLAN_INPUTS_H_
#define ZEROSHARD_PLAN_INTERNAL_PLAN_INPUTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard {
namespace internal {

// GPUs in [1, 2^20] (whole nodes), byte sizes up to 2^62, and every rate,
// latency and fraction within the ranges that keep times finite.
absl::Status ValidateCluster(const ClusterSpec& cluster);

// The options with seq resolved (0: the model's max positions up to 4096,
// else 2048), checked against the model (learned positions, heads and
// layers that tp and pp divide) and the cluster. ActivationModel
// kGptExample: also the model and recompute against the GPT example
// (GptExampleTensors), and tp = pp = 1, offload none forced.
absl::StatusOr<PlanOptions> ResolveOptions(const ModelDescription& model,
                                           const ClusterSpec& cluster, PlanOptions options);

// Sequences per optimizer step, gpus x micro_batch x grad_accum_steps;
// InvalidArgument when it or the tokens per step (x seq) pass 2^63.
absl::StatusOr<int64_t> GlobalBatch(const ClusterSpec& cluster, const PlanOptions& options);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_PLAN_INTERNAL_PLAN_INPUTS_H_
