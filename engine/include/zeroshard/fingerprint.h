// Fingerprint64: the 64-bit hash the engine compares across ranks (start-up
// check, per-step collective-sequence check). Public so that a trainer can
// fingerprint what it must share but cannot pass as a number (a data
// config, a tokenizer file) and hand it to Engine::Start as a
// TrainerSetting, with the same function the engine uses.
#ifndef ZEROSHARD_FINGERPRINT_H_
#define ZEROSHARD_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>

namespace zeroshard {

// Hash of `bytes` bytes at `data`, continuing from `seed` (0 starts a new
// hash): FNV-1a mixing over 8-byte words, then the length. The same bytes
// give the same value on every rank and platform of the same endianness.
// Not cryptographic: a mismatch detector. Thread-safe; `data` may be null
// when `bytes` is 0.
uint64_t Fingerprint64(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace zeroshard

#endif  // ZEROSHARD_FINGERPRINT_H_
