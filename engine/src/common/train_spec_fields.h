// The one list of TrainSpec's fields. Three readers iterate it, so a field
// added here (and to the struct) appears in all three without further code:
//   - Engine::Start compares every field across ranks and names the one that
//     differs (TrainSpecFields, engine/src/runtime/fingerprint.cc);
//   - a checkpoint's manifest.json records every field under "train" and
//     reads each back, checked (engine/src/checkpoint/manifest.cc);
//   - Engine::Load reports every field the resuming run changed
//     (DescribeTrainSpecChanges, in CheckpointInfo::changed_settings), or
//     refuses the change of a field the saved state depends on.
// tests/common/train_spec_fields_test.cc proves all three by iterating the
// table.
#ifndef ZEROSHARD_COMMON_TRAIN_SPEC_FIELDS_H_
#define ZEROSHARD_COMMON_TRAIN_SPEC_FIELDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::internal {

// How a field's value is held (as 64 bits) and written for people and JSON.
enum class SpecValueKind : uint8_t {
  kInt,
  kReal,  // the bits are the double's bit pattern: compared exactly
  kBool,
  kPrecision,  // by name: "fp32", "bf16", "fp16"
  kDType,      // by name: "fp32", "bf16", ...
  kOptimizer,  // "AdamW", "AdamL2"
  kSchedule,   // "constant", "warmup-cosine"
  kTier,       // MemoryTier: "device", "host", "nvme"
  kHash,       // a fingerprint (not a TrainSpec field): only "differs" can be said
};

// What a resume may do with a field.
enum class OnResume : uint8_t {
  kReport,     // may change; Load lists the change in changed_settings
  kMustMatch,  // the saved state depends on it (the Adam moments on the
               // optimizer): Load refuses another value
};

struct TrainSpecField {
  // The struct path, "optimizer.lr": the name in Start's and Load's messages
  // and the path of its JSON value under a manifest's "train" object.
  const char* name;
  SpecValueKind kind;
  int64_t (*get)(const TrainSpec&);  // the value's bits (effective grad dtype)
  void (*set)(TrainSpec&, int64_t bits);
  // kInt: the range a manifest may hold (TrainSpec::Validate checks the
  // rest after reading).
  int64_t min = 0;
  int64_t max = 0;
  // Written by every manifest of format version 1. The fields added since
  // may be absent from older manifests; Load then knows nothing of their old
  // value and reports no change.
  bool in_every_manifest = false;
  OnResume on_resume = OnResume::kReport;
};

// Every field of TrainSpec, in struct order.
absl::Span<const TrainSpecField> TrainSpecFieldTable();
// The field named `name`, or nullptr.
const TrainSpecField* FindTrainSpecField(absl::string_view name);

// The value for messages: "0.001" (the shortest text that reads back as the
// same double), "bf16", "AdamW", "true"; kHash as 16 hex digits.
std::string FormatSpecValue(SpecValueKind kind, int64_t bits);
// The bits of an enum kind's name (kPrecision, kDType, kOptimizer,
// kSchedule); else InvalidArgument whose message lists the names allowed
// ("not AdamW or AdamL2"), for the caller to put after the field and value.
absl::StatusOr<int64_t> ParseSpecName(SpecValueKind kind, absl::string_view name);
int64_t RealBits(double value);
double RealOfBits(int64_t bits);

// "optimizer.lr 0.001 -> 0.0005" for every field with on_resume == kReport
// whose value differs between `before` and `after`, in table order; fields
// named in `unknown_before` (absent from an older manifest) are skipped.
std::vector<std::string> DescribeTrainSpecChanges(const TrainSpec& before, const TrainSpec& after,
                                                  const std::vector<std::string>& unknown_before);
// The fields with on_resume == kMustMatch whose values differ, by name.
std::vector<std::string> MustMatchDifferences(const TrainSpec& before, const TrainSpec& after);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_COMMON_TRAIN_SPEC_FIELDS_H_
