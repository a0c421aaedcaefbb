// How a checkpoint's model may differ from the model that loads it
// (Engine::Load): what must match, because it decides what is stored, and
// the param groups, which may change on resume and are reported.
#ifndef ZEROSHARD_COMMON_MODEL_SPEC_CHANGES_H_
#define ZEROSHARD_COMMON_MODEL_SPEC_CHANGES_H_

#include <string>
#include <vector>

#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

// What differs between `saved` (a checkpoint's model) and `mine` in what
// decides the storage: the units, their names, the params' names and
// shapes, and each param's trainable flag and tie (tied_to). "" when they
// agree. tp_split_dim, no_decay, lr_scale and weight_decay are not compared.
// Example: "param 'block.0.w' has trainable true in the checkpoint and
// false in this engine's model".
std::string DescribeModelStorageDifference(const ModelSpec& saved, const ModelSpec& mine);

// The param group settings that changed from `before` to `after` (whose
// storage agrees: DescribeModelStorageDifference is ""), one entry per param
// and field, in model order: "block.0.b1: lr_scale 1 -> 0.5",
// "embed.w: weight_decay unset -> 0.1", "head.b: no_decay true -> false".
// At most `max_listed` entries, then one "and N more param group changes".
std::vector<std::string> DescribeParamGroupChanges(const ModelSpec& before, const ModelSpec& after,
                                                   size_t max_listed = 32);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_COMMON_MODEL_SPEC_CHANGES_H_
