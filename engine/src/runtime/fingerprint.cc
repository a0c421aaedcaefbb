#include "engine/src/runtime/fingerprint.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

int64_t RealBits(double value) {
  int64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

std::vector<StartField> TrainSpecFields(const TrainSpec& t) {
  using Kind = StartField::Kind;
  auto real = [](const char* name, double v) { return StartField{name, Kind::kReal, RealBits(v)}; };
  auto integer = [](const char* name, int64_t v) { return StartField{name, Kind::kInt, v}; };
  return {
      integer("zero_stage", t.zero_stage),
      {"precision", Kind::kPrecision, static_cast<int64_t>(t.precision)},
      {"grad_dtype", Kind::kDType, static_cast<int64_t>(t.effective_grad_dtype())},
      {"optimizer.kind", Kind::kOptimizer, static_cast<int64_t>(t.optimizer.kind)},
      real("optimizer.lr", t.optimizer.lr),
      real("optimizer.beta1", t.optimizer.beta1),
      real("optimizer.beta2", t.optimizer.beta2),
      real("optimizer.eps", t.optimizer.eps),
      real("optimizer.weight_decay", t.optimizer.weight_decay),
      {"schedule.kind", Kind::kSchedule, static_cast<int64_t>(t.schedule.kind)},
      integer("schedule.warmup_steps", t.schedule.warmup_steps),
      integer("schedule.total_steps", t.schedule.total_steps),
      real("schedule.min_lr_ratio", t.schedule.min_lr_ratio),
      real("max_grad_norm", t.max_grad_norm),
      integer("grad_accum_steps", t.grad_accum_steps),
      integer("num_grad_buffers", t.num_grad_buffers),
      integer("prefetch_units", t.prefetch_units),
      integer("max_live_gather_bytes", t.max_live_gather_bytes),
      integer("persistent_unit_numel", t.persistent_unit_numel),
      real("loss_scale.initial_scale", t.loss_scale.initial_scale),
      real("loss_scale.growth_factor", t.loss_scale.growth_factor),
      real("loss_scale.backoff_factor", t.loss_scale.backoff_factor),
      integer("loss_scale.growth_interval", t.loss_scale.growth_interval),
      integer("loss_scale.hysteresis", t.loss_scale.hysteresis),
      real("loss_scale.min_scale", t.loss_scale.min_scale),
      integer("loss_scale.max_skips_at_min_scale", t.loss_scale.max_skips_at_min_scale),
      {"check_collective_sequence", Kind::kBool, t.check_collective_sequence ? 1 : 0},
  };
}

uint64_t FingerprintTrainSpec(const TrainSpec& t) {
  uint64_t h = kFingerprintOffset;
  for (const StartField& field : TrainSpecFields(t)) {
    h = HashString(h, field.name);
    h = HashValue(h, field.bits);
  }
  return h;
}

std::string FormatStartValue(StartField::Kind kind, int64_t bits) {
  using Kind = StartField::Kind;
  switch (kind) {
    case Kind::kInt:
      return absl::StrCat(bits);
    case Kind::kReal: {
      double value;
      std::memcpy(&value, &bits, sizeof(value));
      // The shortest text that reads back as the same double.
      for (int digits = 6; digits < 17; ++digits) {
        const std::string text = absl::StrFormat("%.*g", digits, value);
        if (std::strtod(text.c_str(), nullptr) == value) return text;
      }
      return absl::StrFormat("%.17g", value);
    }
    case Kind::kBool:
      return bits != 0 ? "true" : "false";
    case Kind::kPrecision:
      if (bits >= 0 && bits <= 2) return PrecisionName(static_cast<Precision>(bits));
      break;
    case Kind::kDType:
      if (bits >= 0 && bits <= static_cast<int64_t>(DType::kUInt8)) {
        return DTypeName(static_cast<DType>(bits));
      }
      break;
    case Kind::kOptimizer:
      if (bits == static_cast<int64_t>(OptimizerKind::kAdamW)) return "AdamW";
      if (bits == static_cast<int64_t>(OptimizerKind::kAdamL2)) return "AdamL2";
      break;
    case Kind::kSchedule:
      if (bits == static_cast<int64_t>(LrSchedule::Kind::kConstant)) return "constant";
      if (bits == static_cast<int64_t>(LrSchedule::Kind::kWarmupCosine)) return "warmup-cosine";
      break;
    case Kind::kHash:
      return absl::StrFormat("%016x", static_cast<uint64_t>(bits));
  }
  return absl::StrCat("value ", bits);
}

}  // namespace zeroshard::internal
