#include "engine/src/runtime/fingerprint.h"

#include <string>

namespace zeroshard::internal {

uint64_t FingerprintLayout(const FlatLayout& layout) {
  uint64_t h = HashValue(kFingerprintOffset, layout.world_size());
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitSegment& seg = layout.unit(u);
    h = HashValue(h, seg.offset);
    h = HashValue(h, seg.padded_numel);
    h = HashValue(h, seg.shard_numel);
    for (const ParamSlot& p : seg.params) {
      h = HashValue(h, p.offset);
      h = HashValue(h, p.numel);
    }
  }
  return h;
}

std::vector<StartField> TrainSpecFields(const TrainSpec& t) {
  std::vector<StartField> fields;
  for (const TrainSpecField& f : TrainSpecFieldTable()) {
    fields.push_back({f.name, f.kind, f.get(t)});
  }
  return fields;
}

uint64_t FingerprintTrainSpec(const TrainSpec& t) {
  uint64_t h = kFingerprintOffset;
  for (const StartField& field : TrainSpecFields(t)) {
    h = HashString(h, field.name);
    h = HashValue(h, field.bits);
  }
  return h;
}

}  // namespace zeroshard::internal
