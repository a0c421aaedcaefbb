#include "engine/src/runtime/slice_reader.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

int64_t Product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t d = begin; d < end; ++d) p *= shape[d];
  return p;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::Status CheckSliceShape(const std::vector<int64_t>& local, const std::vector<int64_t>& whole,
                             const ParamOrigin& origin, const std::string& what) {
  const int k = origin.split_dim;
  const std::string slice = k < 0 ? std::string("the whole param")
                                  : absl::StrFormat("part %d of %d of dimension %d in %d group(s)",
                                                    origin.part, origin.parts, k, origin.groups);
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %s cannot be %s of %s.%s %s: %s", what,
                                                      ShapeText(local), slice, origin.unit,
                                                      origin.param, ShapeText(whole), why));
  };
  if (local.size() != whole.size()) return refuse("the ranks differ");
  if (k < 0) {
    if (local != whole) return refuse("the shapes differ");
    return absl::OkStatus();
  }
  if (k >= static_cast<int>(local.size())) return refuse("no such dimension");
  if (origin.groups < 1 || origin.parts < 1 || origin.part < 0 || origin.part >= origin.parts) {
    return refuse("groups and parts must be >= 1 and the part in [0, parts)");
  }
  for (size_t d = 0; d < local.size(); ++d) {
    if (static_cast<int>(d) != k && local[d] != whole[d]) {
      return refuse(absl::StrFormat("dimension %d differs", d));
    }
  }
  if (whole[k] % origin.groups != 0 || local[k] % origin.groups != 0) {
    return refuse("the groups do not divide the dimension");
  }
  const int64_t group = whole[k] / origin.groups;
  const int64_t part = local[k] / origin.groups;
  // Exactly ceil(group / parts): a wider part would read indices past the
  // group's end as padding, so a model with a larger dimension (a widened
  // vocabulary) would load as if the checkpoint's were padded.
  if (part != (group + origin.parts - 1) / origin.parts) {
    return refuse(absl::StrFormat("a part of a group of %d is %d, not ceil(%d / %d)", group, part,
                                  group, origin.parts));
  }
  return absl::OkStatus();
}

std::vector<SliceRun> SliceRuns(const std::vector<int64_t>& local,
                                const std::vector<int64_t>& whole, const ParamOrigin& origin,
                                int64_t begin, int64_t end) {
  std::vector<SliceRun> runs;
  if (begin >= end) return runs;
  const int k = origin.split_dim;
  if (k < 0) {
    runs.push_back({begin, begin, end - begin, end - begin});
    return runs;
  }
  const int64_t inner = Product(local, k + 1, local.size());
  const int64_t local_k = local[k];
  const int64_t whole_k = whole[k];
  const int64_t part = local_k / origin.groups;  // per group, local
  const int64_t group = whole_k / origin.groups;
  // This part's valid indices in each group (the rest is padding).
  const int64_t valid = std::clamp<int64_t>(group - origin.part * part, 0, part);
  const int64_t local_row = local_k * inner;  // elements per outer index
  const int64_t whole_row = whole_k * inner;
  for (int64_t o = begin / local_row; o * local_row < end; ++o) {
    for (int q = 0; q < origin.groups; ++q) {
      // Local elements [a, a + part * inner) come from the whole param's
      // [s, s + valid * inner), then padding.
      const int64_t a = o * local_row + q * part * inner;
      const int64_t s = o * whole_row + (q * group + origin.part * part) * inner;
      const int64_t lo = std::max(begin, a);
      const int64_t hi = std::min(end, a + part * inner);
      if (lo >= hi) continue;
      const int64_t valid_end = a + valid * inner;
      SliceRun run;
      run.local = lo;
      run.source = s + (lo - a);
      run.count = hi - lo;
      run.valid = std::clamp<int64_t>(valid_end - lo, 0, run.count);
      runs.push_back(run);
    }
  }
  return runs;
}

absl::Status ReadParamSlices(const ModelSpec& model, const FlatLayout& layout,
                             const std::vector<std::vector<ParamOrigin>>& origins,
                             const Manifest& manifest, SegmentReader& reader,
                             const std::vector<ElementRange>& owned,
                             std::vector<std::vector<float>>& fresh) {
  if (origins.size() != model.units.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("LoadSlices: %d units of origins for a model of %d units", origins.size(),
                        model.units.size()));
  }
  for (size_t u = 0; u < model.units.size(); ++u) {
    if (origins[u].size() != model.units[u].params.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("LoadSlices: unit '%s' has %d params but %d origins", model.units[u].name,
                          model.units[u].params.size(), origins[u].size()));
    }
  }
  ZS_ASSIGN_OR_RETURN(const FlatLayout source_layout,
                      FlatLayout::Create(manifest.model, manifest.world_size));
  std::map<std::pair<std::string, std::string>, std::pair<int, int>> index;
  for (size_t u = 0; u < manifest.model.units.size(); ++u) {
    const UnitSpec& unit = manifest.model.units[u];
    for (size_t p = 0; p < unit.params.size(); ++p) {
      index[{unit.name, unit.params[p].name}] = {static_cast<int>(u), static_cast<int>(p)};
    }
  }
  std::vector<float> span[kTensorsPerUnit];
  for (int s = 0; s < layout.num_units(); ++s) {
    const UnitSegment& seg = layout.unit(s);
    for (const ParamSlot& slot : seg.params) {
      const int64_t begin = std::max(owned[s].begin, slot.offset);
      const int64_t end = std::min(owned[s].end, slot.offset + slot.numel);
      const ParamSpec& mine = model.units[slot.spec_unit].params[slot.spec_param];
      const ParamOrigin& origin = origins[slot.spec_unit][slot.spec_param];
      const std::string what =
          absl::StrFormat("LoadSlices: %s.%s", model.units[slot.spec_unit].name, mine.name);
      auto found = index.find({origin.unit, origin.param});
      if (found == index.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: the checkpoint's model has no param %s.%s", what, origin.unit, origin.param));
      }
      const ParamSpec& whole =
          manifest.model.units[found->second.first].params[found->second.second];
      ZS_RETURN_IF_ERROR(CheckSliceShape(mine.shape, whole.shape, origin, what));
      if (begin >= end) continue;
      // A tied alias in the checkpoint is its owner's storage.
      const ParamPlace place = source_layout.PlaceOf(found->second.first, found->second.second);
      const ParamSlot& source = source_layout.unit(place.segment).params[place.slot];
      const std::vector<SliceRun> runs =
          SliceRuns(mine.shape, whole.shape, origin, begin - slot.offset, end - slot.offset);
      // One read of the span of the whole param that holds the runs.
      int64_t lo = -1, hi = -1;
      for (const SliceRun& r : runs) {
        if (r.valid == 0) continue;
        lo = lo < 0 ? r.source : std::min(lo, r.source);
        hi = std::max(hi, r.source + r.valid);
      }
      if (lo < 0) continue;  // padding only
      float* out[kTensorsPerUnit];
      for (int t = 0; t < kTensorsPerUnit; ++t) {
        const bool wanted = !fresh[static_cast<size_t>(s) * kTensorsPerUnit + t].empty();
        if (wanted) span[t].assign(static_cast<size_t>(hi - lo), 0.0f);
        out[t] = wanted ? span[t].data() : nullptr;
      }
      ZS_RETURN_IF_ERROR(reader.Read(place.segment, source.offset + lo, source.offset + hi, out));
      for (int t = 0; t < kTensorsPerUnit; ++t) {
        if (out[t] == nullptr) continue;
        float* dst = fresh[static_cast<size_t>(s) * kTensorsPerUnit + t].data();
        for (const SliceRun& r : runs) {
          std::copy(span[t].begin() + (r.source - lo), span[t].begin() + (r.source - lo + r.valid),
                    dst + (slot.offset + r.local - owned[s].begin));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
