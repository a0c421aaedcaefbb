// Fingerprints of what every rank must agree on before training: the model
// spec, the layout, the train spec and the initial weights.
#ifndef ZEROSHARD_RUNTIME_FINGERPRINT_H_
#define ZEROSHARD_RUNTIME_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/src/common/spec_fingerprint.h"
#include "engine/src/common/train_spec_fields.h"
#include "engine/src/layout/flat_layout.h"
#include "zeroshard/fingerprint.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::internal {

// HashBytes, FingerprintModelSpec and FingerprintUnitSpec live in
// engine/src/common/spec_fingerprint.h (the checkpoint reader uses them too).
uint64_t FingerprintLayout(const FlatLayout& layout);
uint64_t FingerprintTrainSpec(const TrainSpec& train);

// One value every rank must share, as Start() exchanges it: named, with a
// kind that says how to print it.
struct StartField {
  // kHash for fingerprints; the other kinds are those of the TrainSpec
  // fields (engine/src/common/train_spec_fields.h), printed for messages by
  // FormatSpecValue.
  using Kind = SpecValueKind;
  std::string name;
  Kind kind = Kind::kInt;
  int64_t bits = 0;
};

// Every field of `train`, named as in the struct ("optimizer.lr"), in the
// order of TrainSpecFieldTable.
std::vector<StartField> TrainSpecFields(const TrainSpec& train);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_FINGERPRINT_H_
