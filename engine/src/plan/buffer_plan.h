// PlanBuffers: the buffer list of one rank over a laid-out model; the one
// function behind PlanEngineBuffers (public), Engine::Create and the
// planner's candidates.
#ifndef ZEROSHARD_PLAN_BUFFER_PLAN_H_
#define ZEROSHARD_PLAN_BUFFER_PLAN_H_

#include "absl/status/statusor.h"
#include "engine/src/layout/flat_layout.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::internal {

// Per-rank buffers for `train` over `layout` (see PlanEngineBuffers). Every
// buffer's bytes and the total fit in int64_t. InvalidArgument for an
// invalid TrainSpec, a gather cap below one unit, or a size past 2^63.
absl::StatusOr<BufferPlan> PlanBuffers(const FlatLayout& layout, const TrainSpec& train);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_PLAN_BUFFER_PLAN_H_
