#include "engine/src/common/spec_fingerprint.h"

#include <cstring>

namespace zeroshard::internal {
namespace {

constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t Mix(uint64_t h, uint64_t word) { return (h ^ word) * kFnvPrime; }

// Tags of the optional ParamSpec fields in a unit's fingerprint.
constexpr uint64_t kFrozenTag = 0x7a732d66726f7a6eull;       // "zs-frozn"
constexpr uint64_t kTiedTag = 0x7a732d7469656420ull;         // "zs-tied "
constexpr uint64_t kLrScaleTag = 0x7a732d6c72736361ull;      // "zs-lrsca"
constexpr uint64_t kWeightDecayTag = 0x7a732d7764656361ull;  // "zs-wdeca"

}  // namespace

uint64_t HashString(uint64_t h, const std::string& s) {
  h = HashValue(h, static_cast<uint64_t>(s.size()));
  return HashBytes(s.data(), s.size(), h);
}

uint64_t FingerprintUnitSpec(const UnitSpec& unit) {
  uint64_t h = HashString(kFingerprintOffset, unit.name);
  h = HashValue(h, static_cast<uint64_t>(unit.params.size()));
  for (const ParamSpec& p : unit.params) {
    h = HashString(h, p.name);
    h = HashValue(h, static_cast<uint64_t>(p.shape.size()));
    for (int64_t d : p.shape) h = HashValue(h, d);
    h = HashValue(h, static_cast<uint8_t>(p.no_decay));
    // Only when set: specs without tensor parallelism (and the checkpoints
    // whose manifests carry their fingerprint) keep their old fingerprint.
    if (p.tp_split_dim >= 0) h = HashValue(h, static_cast<int64_t>(p.tp_split_dim));
    // The same for the fields of frozen and tied params and param groups,
    // each behind its own tag so that one cannot pass for another.
    if (!p.trainable) h = HashValue(h, kFrozenTag);
    if (p.tied_to) {
      h = HashValue(h, kTiedTag);
      h = HashString(h, p.tied_to->unit);
      h = HashString(h, p.tied_to->param);
    }
    if (p.lr_scale != 1.0) {
      // +0.0 for -0.0: equal scales hash alike.
      const double scale = p.lr_scale == 0.0 ? 0.0 : p.lr_scale;
      h = HashValue(h, kLrScaleTag);
      h = HashValue(h, scale);
    }
    if (p.weight_decay) {
      const double decay = *p.weight_decay == 0.0 ? 0.0 : *p.weight_decay;
      h = HashValue(h, kWeightDecayTag);
      h = HashValue(h, decay);
    }
  }
  return h;
}

uint64_t FingerprintModelSpec(const ModelSpec& spec) {
  uint64_t h = HashValue(kFingerprintOffset, static_cast<uint64_t>(spec.units.size()));
  for (const UnitSpec& unit : spec.units) h = HashValue(h, FingerprintUnitSpec(unit));
  return h;
}

}  // namespace zeroshard::internal

namespace zeroshard {

uint64_t Fingerprint64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed == 0 ? internal::kFingerprintOffset : seed;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    h = internal::Mix(h, word);
  }
  for (; i < bytes; ++i) h = internal::Mix(h, p[i]);
  return internal::Mix(h, bytes);
}

}  // namespace zeroshard
