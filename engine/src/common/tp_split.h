// The tensor-parallel split, written once: ShardModelSpec (the engine's
// shard of a model, which needs tp to divide the split dimension) and the
// planner's RankSlice and SizeSlices (which round it up, as Megatron pads
// the vocabulary) both take a unit's and a param's shape on one of tp ranks
// from here, by ParamSpec::tp_split_dim. Which units a pipeline stage holds
// is each caller's policy: ShardModelSpec balances the stages by size
// (PipelineStageUnits), the planner splits a transformer's layers evenly,
// the embedding first and the head last (UnitsOfStage).
#ifndef ZEROSHARD_COMMON_TP_SPLIT_H_
#define ZEROSHARD_COMMON_TP_SPLIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

// What to do with a split dimension that tp does not divide.
enum class TpRemainder {
  kRefuse,   // InvalidArgument naming the unit, the param and the dimension
  kRoundUp,  // each rank holds ceil(extent / tp) (the planner's estimate)
};

// The shape of `param` (of unit `unit_name`) on one of tp ranks: dimension
// param.tp_split_dim divided by tp; a replicated param (-1) or tp == 1 whole.
// `param` must have passed ModelSpec::Validate.
absl::StatusOr<std::vector<int64_t>> TpShardShape(const ParamSpec& param, int tp,
                                                  TpRemainder remainder,
                                                  const std::string& unit_name);

// `unit` on one of tp ranks: each param's shape as TpShardShape gives it;
// names, no_decay and tp_split_dim kept. With kRoundUp it cannot fail.
absl::StatusOr<UnitSpec> TpShardUnit(const UnitSpec& unit, int tp, TpRemainder remainder);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_COMMON_TP_SPLIT_H_
