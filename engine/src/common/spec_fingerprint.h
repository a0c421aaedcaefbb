// The fingerprint rule (zeroshard/fingerprint.h's Fingerprint64) and the
// fingerprints of a model spec, in zs_common so that the checkpoint reader
// checks a manifest's model fingerprint with the function the engine uses
// to compare ranks' specs at start-up (engine/src/runtime/fingerprint.h has
// the rest: layout, train spec, start fields).
#ifndef ZEROSHARD_COMMON_SPEC_FINGERPRINT_H_
#define ZEROSHARD_COMMON_SPEC_FINGERPRINT_H_

#include <cstdint>
#include <string>

#include "zeroshard/fingerprint.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

// Fingerprint64's starting value (FNV-1a's offset basis).
inline constexpr uint64_t kFingerprintOffset = 0xcbf29ce484222325ull;

// Fingerprint64, by its internal name.
inline uint64_t HashBytes(const void* data, size_t bytes, uint64_t seed) {
  return Fingerprint64(data, bytes, seed);
}
template <typename T>
uint64_t HashValue(uint64_t h, const T& value) {
  return HashBytes(&value, sizeof(value), h);
}
// The length, then the bytes: "ab","c" and "a","bc" hash apart.
uint64_t HashString(uint64_t h, const std::string& s);

uint64_t FingerprintModelSpec(const ModelSpec& spec);
// One unit: its name and every param's name, shape, no_decay and, each only
// when not its default (so that the fingerprints of specs without them, and
// of the checkpoints that record them, stay what they were): tp_split_dim,
// trainable, tied_to, lr_scale and weight_decay.
uint64_t FingerprintUnitSpec(const UnitSpec& unit);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_COMMON_SPEC_FINGERPRINT_H_
