#include "engine/src/common/train_spec_fields.h"

#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zeroshard::internal {

int64_t RealBits(double value) {
  int64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double RealOfBits(int64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

namespace {

using Kind = SpecValueKind;

constexpr int64_t kMaxSteps = int64_t{1} << 50;

// Accessors of one member: its bits, and the member from bits.
#define ZS_MEMBER(member)                                                       \
  [](const TrainSpec& t) -> int64_t { return static_cast<int64_t>(t.member); }, \
      [](TrainSpec& t, int64_t bits) { t.member = static_cast<decltype(t.member)>(bits); }
#define ZS_REAL_MEMBER(member)                                      \
  [](const TrainSpec& t) -> int64_t { return RealBits(t.member); }, \
      [](TrainSpec& t, int64_t bits) { t.member = RealOfBits(bits); }

// To add a field: the member in TrainSpec (with its check in Validate), then
// one line here. Start, the manifest and Load's report follow; a field new
// since format version 1 leaves in_every_manifest false.
const TrainSpecField kFields[] = {
    {"zero_stage", Kind::kInt, ZS_MEMBER(zero_stage), 0, 3, true},
    {"precision", Kind::kPrecision, ZS_MEMBER(precision), 0, 0, true},
    // The effective dtype: an unset grad_dtype and the param dtype are one
    // setting.
    {"grad_dtype", Kind::kDType,
     [](const TrainSpec& t) -> int64_t { return static_cast<int64_t>(t.effective_grad_dtype()); },
     [](TrainSpec& t, int64_t bits) { t.grad_dtype = static_cast<DType>(bits); }, 0, 0, true},
    {"optimizer.kind", Kind::kOptimizer, ZS_MEMBER(optimizer.kind), 0, 0, true,
     OnResume::kMustMatch},
    {"optimizer.lr", Kind::kReal, ZS_REAL_MEMBER(optimizer.lr), 0, 0, true},
    {"optimizer.beta1", Kind::kReal, ZS_REAL_MEMBER(optimizer.beta1), 0, 0, true,
     OnResume::kMustMatch},
    {"optimizer.beta2", Kind::kReal, ZS_REAL_MEMBER(optimizer.beta2), 0, 0, true,
     OnResume::kMustMatch},
    {"optimizer.eps", Kind::kReal, ZS_REAL_MEMBER(optimizer.eps), 0, 0, true, OnResume::kMustMatch},
    {"optimizer.weight_decay", Kind::kReal, ZS_REAL_MEMBER(optimizer.weight_decay), 0, 0, true},
    {"schedule.kind", Kind::kSchedule, ZS_MEMBER(schedule.kind), 0, 0, true},
    {"schedule.warmup_steps", Kind::kInt, ZS_MEMBER(schedule.warmup_steps), 0, kMaxSteps, true},
    {"schedule.total_steps", Kind::kInt, ZS_MEMBER(schedule.total_steps), 0, kMaxSteps, true},
    {"schedule.min_lr_ratio", Kind::kReal, ZS_REAL_MEMBER(schedule.min_lr_ratio), 0, 0, true},
    {"max_grad_norm", Kind::kReal, ZS_REAL_MEMBER(max_grad_norm), 0, 0, true},
    {"grad_accum_steps", Kind::kInt, ZS_MEMBER(grad_accum_steps), 1, 1 << 20, true},
    {"num_grad_buffers", Kind::kInt, ZS_MEMBER(num_grad_buffers), 0, INT_MAX},
    {"max_gathered_units", Kind::kInt, ZS_MEMBER(max_gathered_units), 0, INT_MAX},
    {"prefetch_units", Kind::kInt, ZS_MEMBER(prefetch_units), 0, INT_MAX},
    {"max_live_gather_bytes", Kind::kInt, ZS_MEMBER(max_live_gather_bytes), 0, INT64_MAX},
    {"persistent_unit_numel", Kind::kInt, ZS_MEMBER(persistent_unit_numel), 0, INT64_MAX},
    {"loss_scale.initial_scale", Kind::kReal, ZS_REAL_MEMBER(loss_scale.initial_scale)},
    {"loss_scale.growth_factor", Kind::kReal, ZS_REAL_MEMBER(loss_scale.growth_factor)},
    {"loss_scale.backoff_factor", Kind::kReal, ZS_REAL_MEMBER(loss_scale.backoff_factor)},
    {"loss_scale.growth_interval", Kind::kInt, ZS_MEMBER(loss_scale.growth_interval), 0, kMaxSteps},
    {"loss_scale.hysteresis", Kind::kInt, ZS_MEMBER(loss_scale.hysteresis), 0, INT_MAX},
    {"loss_scale.min_scale", Kind::kReal, ZS_REAL_MEMBER(loss_scale.min_scale)},
    {"loss_scale.max_skips_at_min_scale", Kind::kInt, ZS_MEMBER(loss_scale.max_skips_at_min_scale),
     0, INT_MAX},
    {"check_collective_sequence", Kind::kBool, ZS_MEMBER(check_collective_sequence)},
    // Where the optimizer state lives changes no number: a checkpoint moves
    // between tiers (the swap directory is per node and not compared).
    {"offload.optimizer", Kind::kTier, ZS_MEMBER(offload.optimizer)},
    {"offload.grads", Kind::kTier, ZS_MEMBER(offload.grads)},
    {"offload.params", Kind::kTier, ZS_MEMBER(offload.params)},
    {"offload.chunk_numel", Kind::kInt, ZS_MEMBER(offload.chunk_numel), 1024, int64_t{1} << 30},
    // ZeRO++ changes the numerics of the run, not its saved state: a resume
    // may switch it (Load reports the change).
    {"zeropp.quantized_weights", Kind::kBool, ZS_MEMBER(zeropp.quantized_weights)},
    {"zeropp.secondary_partition_size", Kind::kInt, ZS_MEMBER(zeropp.secondary_partition_size), 0,
     1 << 20},
    {"zeropp.quantized_grad_bits", Kind::kInt, ZS_MEMBER(zeropp.quantized_grad_bits), 0, 8},
};

#undef ZS_MEMBER
#undef ZS_REAL_MEMBER

// The names of an enum kind's values, indexed by the enum's value.
struct EnumNames {
  const char* names[4];
  int count;
};

EnumNames NamesOf(SpecValueKind kind) {
  switch (kind) {
    case Kind::kPrecision:
      return {{PrecisionName(Precision::kFp32), PrecisionName(Precision::kBf16Mixed),
               PrecisionName(Precision::kFp16Mixed)},
              3};
    case Kind::kOptimizer:
      static_assert(static_cast<int>(OptimizerKind::kAdamW) == 0 &&
                    static_cast<int>(OptimizerKind::kAdamL2) == 1);
      return {{"AdamW", "AdamL2"}, 2};
    case Kind::kSchedule:
      static_assert(static_cast<int>(LrSchedule::Kind::kConstant) == 0 &&
                    static_cast<int>(LrSchedule::Kind::kWarmupCosine) == 1);
      return {{"constant", "warmup-cosine"}, 2};
    case Kind::kTier:
      return {{MemoryTierName(MemoryTier::kDevice), MemoryTierName(MemoryTier::kHost),
               MemoryTierName(MemoryTier::kNvme)},
              3};
    default:
      return {{}, 0};
  }
}

}  // namespace

absl::Span<const TrainSpecField> TrainSpecFieldTable() { return kFields; }

const TrainSpecField* FindTrainSpecField(absl::string_view name) {
  for (const TrainSpecField& f : kFields) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::string FormatSpecValue(SpecValueKind kind, int64_t bits) {
  switch (kind) {
    case Kind::kInt:
      return absl::StrCat(bits);
    case Kind::kReal: {
      const double value = RealOfBits(bits);
      // The shortest text that reads back as the same double.
      for (int digits = 6; digits < 17; ++digits) {
        const std::string text = absl::StrFormat("%.*g", digits, value);
        if (std::strtod(text.c_str(), nullptr) == value) return text;
      }
      return absl::StrFormat("%.17g", value);
    }
    case Kind::kBool:
      return bits != 0 ? "true" : "false";
    case Kind::kDType:
      if (bits >= 0 && bits <= static_cast<int64_t>(DType::kUInt8)) {
        return DTypeName(static_cast<DType>(bits));
      }
      break;
    case Kind::kPrecision:
    case Kind::kOptimizer:
    case Kind::kSchedule:
    case Kind::kTier: {
      const EnumNames names = NamesOf(kind);
      if (bits >= 0 && bits < names.count) return names.names[bits];
      break;
    }
    case Kind::kHash:
      return absl::StrFormat("%016x", static_cast<uint64_t>(bits));
  }
  return absl::StrCat("value ", bits);
}

absl::StatusOr<int64_t> ParseSpecName(SpecValueKind kind, absl::string_view name) {
  if (kind == Kind::kDType) {
    absl::StatusOr<DType> dtype = ParseDType(name);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError("not fp32, bf16, fp16, fp64, int64 or uint8");
    }
    return static_cast<int64_t>(*dtype);
  }
  const EnumNames names = NamesOf(kind);
  std::string allowed;
  for (int i = 0; i < names.count; ++i) {
    if (name == names.names[i]) return i;
    absl::StrAppend(&allowed, i == 0 ? "" : i + 1 == names.count ? " or " : ", ", names.names[i]);
  }
  return absl::InvalidArgumentError(names.count > 0 ? absl::StrCat("not ", allowed)
                                                    : "not a name of this kind");
}

std::vector<std::string> DescribeTrainSpecChanges(const TrainSpec& before, const TrainSpec& after,
                                                  const std::vector<std::string>& unknown_before) {
  std::vector<std::string> changes;
  for (const TrainSpecField& f : kFields) {
    if (f.on_resume != OnResume::kReport) continue;
    bool unknown = false;
    for (const std::string& name : unknown_before) unknown |= name == f.name;
    const int64_t was = f.get(before);
    const int64_t now = f.get(after);
    if (unknown || was == now) continue;
    changes.push_back(absl::StrCat(f.name, " ", FormatSpecValue(f.kind, was), " -> ",
                                   FormatSpecValue(f.kind, now)));
  }
  return changes;
}

std::vector<std::string> MustMatchDifferences(const TrainSpec& before, const TrainSpec& after) {
  std::vector<std::string> names;
  for (const TrainSpecField& f : kFields) {
    if (f.on_resume == OnResume::kMustMatch && f.get(before) != f.get(after)) {
      names.push_back(f.name);
    }
  }
  return names;
}

}  // namespace zeroshard::internal
