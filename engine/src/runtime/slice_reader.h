// Engine::LoadSlices' reading: a model-parallel shard's params from a
// checkpoint of the whole model (docs/checkpoint.md, "Loading onto a grid").
#ifndef ZEROSHARD_RUNTIME_SLICE_READER_H_
#define ZEROSHARD_RUNTIME_SLICE_READER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/segment_reader.h"
#include "engine/src/layout/flat_layout.h"
#include "zeroshard/engine.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

// A contiguous piece of a param slice: `count` elements from element
// `local` of the local param, of which the first `valid` are the whole
// param's elements from `source` on (the rest: padding).
struct SliceRun {
  int64_t local = 0;
  int64_t source = 0;
  int64_t count = 0;
  int64_t valid = 0;
};

// The runs of local elements [begin, end) of a param of shape `local`
// sliced from a param of shape `whole` as `origin` says (checked by
// CheckSliceShape), in local order.
std::vector<SliceRun> SliceRuns(const std::vector<int64_t>& local,
                                const std::vector<int64_t>& whole, const ParamOrigin& origin,
                                int64_t begin, int64_t end);

// OK when a param of shape `local` is a slice `origin` of one of shape
// `whole`; InvalidArgument naming `what` otherwise.
absl::Status CheckSliceShape(const std::vector<int64_t>& local, const std::vector<int64_t>& whole,
                             const ParamOrigin& origin, const std::string& what);

// For each segment u of `layout` (of `model`, this engine's), elements
// [owned[u].begin, owned[u].end) of every tensor t whose
// fresh[u * kTensorsPerUnit + t] is not empty, read from the checkpoint
// whose manifest is `manifest` through `reader`, each param from the slice
// `origins` names (padding: left as the zeros `fresh` holds).
absl::Status ReadParamSlices(const ModelSpec& model, const FlatLayout& layout,
                             const std::vector<std::vector<ParamOrigin>>& origins,
                             const Manifest& manifest, SegmentReader& reader,
                             const std::vector<ElementRange>& owned,
                             std::vector<std::vector<float>>& fresh);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_SLICE_READER_H_
