// A tiny language model for the engine's tied/frozen tests, driven through
// the public API:
//   x = E[t];  z = (W + F) x + b;  y = g * z;  logits = E y + bias
//   loss = 0.5 / B * sum ||logits - target||^2
// F and g are frozen (g's unit "scale" has no trainable param at all); the
// head's weight is E (ParamSpec::tied_to). The trainer writes each use's
// gradient of E through its own unit's GradView; the engine sums them.
#ifndef ZEROSHARD_TESTS_RUNTIME_TINY_LM_H_
#define ZEROSHARD_TESTS_RUNTIME_TINY_LM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "zeroshard/engine.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::testing {

inline constexpr int kVocab = 23;
inline constexpr int kHidden = 10;
inline constexpr int kBatch = 4;  // samples per micro-batch
enum TinyUnit : int { kEmbed = 0, kMid = 1, kScale = 2, kHead = 3, kNumUnits = 4 };

struct TinyOptions {
  bool scale_unit = true;  // false: the model without the all-frozen unit
  bool f_frozen = true;
};
ModelSpec TinySpec(const TinyOptions& o = {});

// Deterministic initial values of param `param` of unit `unit` (kHead for
// the head whatever its index).
std::vector<float> InitValues(uint64_t seed, int unit, int param, int64_t n);

// The data of global micro-batch `micro` of step `step`.
struct Batch {
  int tokens[kBatch];
  float target[kBatch][kVocab];
};
Batch MakeBatch(uint64_t seed, int64_t step, int micro);

struct TrainerOptions {
  bool recompute = false;   // the backward gathers the embedding again to recompute x
  bool hold_embed = false;  // the forward keeps the embedding gathered until the head
};

// One micro-batch through the engine (fp32: host views).
absl::Status MicroBatch(Engine& e, const ModelSpec& spec, const Batch& batch,
                        const TrainerOptions& t);

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_RUNTIME_TINY_LM_H_
