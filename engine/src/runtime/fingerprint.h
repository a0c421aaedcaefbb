// Fingerprints of what every rank must agree on before training: the model
// spec, the layout, the train spec and the initial weights.
#ifndef ZEROSHARD_RUNTIME_FINGERPRINT_H_
#define ZEROSHARD_RUNTIME_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>

#include "engine/src/layout/flat_layout.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::internal {

// 64-bit hash of `bytes` continuing from `seed` (FNV-1a mixing over 8-byte
// words; not cryptographic, only a mismatch detector).
uint64_t HashBytes(const void* data, size_t bytes, uint64_t seed);

uint64_t FingerprintModelSpec(const ModelSpec& spec);
uint64_t FingerprintLayout(const FlatLayout& layout);
uint64_t FingerprintTrainSpec(const TrainSpec& train);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_FINGERPRINT_H_
