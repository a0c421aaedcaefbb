#include "zeroshard/train_spec.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace zeroshard {

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16Mixed:
      return "bf16";
    case Precision::kFp16Mixed:
      return "fp16";
  }
  return "?";
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16Mixed;
  if (name == "fp16") return Precision::kFp16Mixed;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown precision '%s'; expected fp32, bf16 or fp16", name));
}

double LrSchedule::LrAt(int64_t step, double peak_lr) const {
  if (kind == Kind::kConstant) return peak_lr;
  if (step <= warmup_steps) {
    return peak_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  const double min_lr = peak_lr * min_lr_ratio;
  if (step >= total_steps) return min_lr;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

DType TrainSpec::param_dtype() const {
  switch (precision) {
    case Precision::kFp32:
      return DType::kFloat32;
    case Precision::kBf16Mixed:
      return DType::kBFloat16;
    case Precision::kFp16Mixed:
      return DType::kFloat16;
  }
  return DType::kFloat32;
}

DType TrainSpec::effective_grad_dtype() const {
  return grad_dtype.has_value() ? *grad_dtype : param_dtype();
}

namespace {

// Upper bounds of the integer fields: far above any real run, low enough
// that every count derived from them (staging bytes, gather slots, step
// numbers) stays far from overflow.
constexpr int kMaxGradAccumSteps = 1 << 20;
constexpr int kMaxGradBuffers = 64;
constexpr int kMaxPrefetchUnits = 1 << 16;
constexpr int64_t kMaxSteps = int64_t{1} << 50;
constexpr int kMaxHysteresis = 1 << 20;

bool IsFinite(double v) { return std::isfinite(v); }

}  // namespace

absl::Status TrainSpec::Validate() const {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("train spec: " + what);
  };
  if (zero_stage < 0 || zero_stage > 3) {
    return bad(absl::StrFormat("zero_stage %d is not supported; use 0, 1, 2 or 3", zero_stage));
  }
  if (zeropp.secondary_partition_size < 0 || zeropp.secondary_partition_size > (1 << 20)) {
    return bad(absl::StrFormat(
        "zeropp.secondary_partition_size %d is outside [0, 1048576]; give 0 (off) or the ranks "
        "per node",
        zeropp.secondary_partition_size));
  }
  if (zeropp.secondary_partition_size > 0 && zero_stage != 3) {
    return bad(absl::StrFormat(
        "zeropp.secondary_partition_size (hpZ) keeps a secondary copy of stage 3's param shards, "
        "but zero_stage is %d; use zero_stage 3 or set it to 0",
        zero_stage));
  }
  if (zeropp.quantized_weights && zero_stage != 3) {
    return bad(absl::StrFormat(
        "zeropp.quantized_weights (qwZ) quantizes stage 3's param all-gathers, but zero_stage is "
        "%d; use zero_stage 3 or turn it off",
        zero_stage));
  }
  if (zeropp.quantized_grad_bits != 0 && zeropp.quantized_grad_bits != 4 &&
      zeropp.quantized_grad_bits != 8) {
    return bad(
        absl::StrFormat("zeropp.quantized_grad_bits %d is not supported; use 0 (off), 8 or 4",
                        zeropp.quantized_grad_bits));
  }
  if (zeropp.quantized_grad_bits != 0 && zero_stage < 2) {
    return bad(absl::StrFormat(
        "zeropp.quantized_grad_bits (qgZ) quantizes the gradient reduce-scatters of stages 2 and "
        "3, but zero_stage is %d; use zero_stage 2 or 3, or set it to 0",
        zero_stage));
  }
  // Enums can hold any value of their underlying type (a cast, a corrupt
  // config): check each against the values the engine knows.
  if (precision != Precision::kFp32 && precision != Precision::kBf16Mixed &&
      precision != Precision::kFp16Mixed) {
    return bad(
        absl::StrFormat("precision %d is not a Precision; use kFp32, kBf16Mixed or "
                        "kFp16Mixed",
                        static_cast<int>(precision)));
  }
  if (grad_dtype.has_value() && *grad_dtype != DType::kFloat32 && *grad_dtype != DType::kBFloat16 &&
      *grad_dtype != DType::kFloat16) {
    return bad(
        absl::StrFormat("grad_dtype %d is not fp32, bf16 or fp16", static_cast<int>(*grad_dtype)));
  }
  const DType g = effective_grad_dtype();
  if (g != DType::kFloat32 && g != param_dtype()) {
    return bad(absl::StrFormat(
        "grad_dtype %s with %s precision; use fp32 gradients or the param dtype (%s)", DTypeName(g),
        PrecisionName(precision), DTypeName(param_dtype())));
  }
  const OptimizerSpec& o = optimizer;
  if (o.kind != OptimizerKind::kAdamW && o.kind != OptimizerKind::kAdamL2) {
    return bad(absl::StrFormat("optimizer.kind %d is not an OptimizerKind; use kAdamW or kAdamL2",
                               static_cast<int>(o.kind)));
  }
  if (!(o.lr >= 0) || !IsFinite(o.lr)) {
    return bad(absl::StrFormat("optimizer.lr %g must be a finite number >= 0", o.lr));
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1)) {
    return bad(absl::StrFormat("optimizer.beta1 %g must be in [0, 1)", o.beta1));
  }
  if (!(o.beta2 >= 0 && o.beta2 < 1)) {
    return bad(absl::StrFormat("optimizer.beta2 %g must be in [0, 1)", o.beta2));
  }
  if (!(o.eps > 0) || !IsFinite(o.eps)) {
    return bad(absl::StrFormat(
        "optimizer.eps %g must be a finite number > 0 (it keeps padding at zero)", o.eps));
  }
  if (!(o.weight_decay >= 0) || !IsFinite(o.weight_decay)) {
    return bad(
        absl::StrFormat("optimizer.weight_decay %g must be a finite number >= 0", o.weight_decay));
  }
  if (schedule.kind != LrSchedule::Kind::kConstant &&
      schedule.kind != LrSchedule::Kind::kWarmupCosine) {
    return bad(
        absl::StrFormat("schedule.kind %d is not an LrSchedule::Kind; use kConstant or "
                        "kWarmupCosine",
                        static_cast<int>(schedule.kind)));
  }
  if (schedule.kind == LrSchedule::Kind::kWarmupCosine) {
    if (schedule.warmup_steps < 0 || schedule.total_steps <= schedule.warmup_steps ||
        schedule.total_steps > kMaxSteps) {
      return bad(absl::StrFormat(
          "warmup-cosine schedule needs 0 <= schedule.warmup_steps < schedule.total_steps <= "
          "2^50 (got %d and %d)",
          schedule.warmup_steps, schedule.total_steps));
    }
    if (!(schedule.min_lr_ratio >= 0 && schedule.min_lr_ratio <= 1)) {
      return bad(
          absl::StrFormat("schedule.min_lr_ratio %g must be in [0, 1]", schedule.min_lr_ratio));
    }
  }
  if (!(max_grad_norm >= 0) || !IsFinite(max_grad_norm)) {
    return bad(absl::StrFormat(
        "max_grad_norm %g must be a finite number >= 0 (0 turns clipping off)", max_grad_norm));
  }
  if (grad_accum_steps < 1 || grad_accum_steps > kMaxGradAccumSteps) {
    return bad(absl::StrFormat("grad_accum_steps %d must be in [1, %d]", grad_accum_steps,
                               kMaxGradAccumSteps));
  }
  if (num_grad_buffers < 1 || num_grad_buffers > kMaxGradBuffers) {
    return bad(absl::StrFormat("num_grad_buffers %d must be in [1, %d]", num_grad_buffers,
                               kMaxGradBuffers));
  }
  if (max_gathered_units < 1 || max_gathered_units > kMaxPrefetchUnits) {
    return bad(absl::StrFormat("max_gathered_units %d must be in [1, %d]", max_gathered_units,
                               kMaxPrefetchUnits));
  }
  if (prefetch_units < 0 || prefetch_units > kMaxPrefetchUnits) {
    return bad(
        absl::StrFormat("prefetch_units %d must be in [0, %d]", prefetch_units, kMaxPrefetchUnits));
  }
  if (max_live_gather_bytes < 0) {
    return bad(absl::StrFormat("max_live_gather_bytes %d must be >= 0", max_live_gather_bytes));
  }
  if (persistent_unit_numel < 0) {
    return bad(absl::StrFormat("persistent_unit_numel %d must be >= 0", persistent_unit_numel));
  }
  const MemoryTier tier = offload.optimizer;
  if (tier != MemoryTier::kDevice && tier != MemoryTier::kHost && tier != MemoryTier::kNvme) {
    return bad(absl::StrFormat("offload.optimizer %d is not a MemoryTier; use device, host or nvme",
                               static_cast<int>(tier)));
  }
  if (offload.grads != MemoryTier::kDevice && offload.grads != MemoryTier::kHost) {
    return bad(
        absl::StrFormat("offload.grads %s must be device or host", MemoryTierName(offload.grads)));
  }
  if (offload.grads == MemoryTier::kHost && tier == MemoryTier::kDevice) {
    return bad(
        "offload.grads host needs the optimizer state off the device (offload.optimizer host or "
        "nvme): the gradients' host copy is what the host update reads");
  }
  if (offload.params != MemoryTier::kDevice && offload.params != MemoryTier::kHost &&
      offload.params != MemoryTier::kNvme) {
    return bad(absl::StrFormat("offload.params %d is not a MemoryTier; use device, host or nvme",
                               static_cast<int>(offload.params)));
  }
  // The params' tier: the message names only the conditions not met.
  if (offload.params != MemoryTier::kDevice) {
    std::vector<std::string> unmet;
    if (zero_stage != 3) {
      unmet.push_back(
          absl::StrFormat("zero_stage 3 (got %d: only stage 3 shards the params)", zero_stage));
    }
    if (offload.params == MemoryTier::kNvme && tier != MemoryTier::kNvme) {
      unmet.push_back(absl::StrFormat(
          "the optimizer state on nvme too (offload.optimizer nvme, got %s: the param shards "
          "share its swap directory and its streamed update)",
          MemoryTierName(tier)));
    }
    if (offload.params == MemoryTier::kHost && tier == MemoryTier::kDevice) {
      unmet.push_back(
          "the optimizer state off the device (offload.optimizer host or nvme, got device: the "
          "host update writes the params)");
    }
    if (offload.params == MemoryTier::kNvme && persistent_unit_numel != 0) {
      unmet.push_back(absl::StrFormat(
          "persistent_unit_numel 0 (got %d: every unit's params sharded, none kept whole on the "
          "device)",
          persistent_unit_numel));
    }
    if (!unmet.empty()) {
      return bad(absl::StrFormat("offload.params %s needs %s", MemoryTierName(offload.params),
                                 absl::StrJoin(unmet, " and ")));
    }
  }
  if (offload.chunk_numel < 1024 || offload.chunk_numel > (int64_t{1} << 30) ||
      offload.chunk_numel % 1024 != 0) {
    return bad(absl::StrFormat("offload.chunk_numel %d must be a multiple of 1024 in [1024, 2^30]",
                               offload.chunk_numel));
  }
  const LossScaleSpec& ls = loss_scale;
  if (!(ls.initial_scale > 0) || !IsFinite(ls.initial_scale)) {
    return bad(absl::StrFormat("loss_scale.initial_scale %g must be a finite number > 0",
                               ls.initial_scale));
  }
  if (!(ls.min_scale > 0) || ls.min_scale > ls.initial_scale) {
    return bad(absl::StrFormat("loss_scale.min_scale %g must be in (0, initial_scale %g]",
                               ls.min_scale, ls.initial_scale));
  }
  if (!(ls.growth_factor >= 1) || !IsFinite(ls.growth_factor)) {
    return bad(absl::StrFormat("loss_scale.growth_factor %g must be a finite number >= 1",
                               ls.growth_factor));
  }
  if (!(ls.backoff_factor > 0 && ls.backoff_factor < 1)) {
    return bad(
        absl::StrFormat("loss_scale.backoff_factor %g must be in (0, 1)", ls.backoff_factor));
  }
  if (ls.growth_interval < 1 || ls.growth_interval > kMaxSteps) {
    return bad(
        absl::StrFormat("loss_scale.growth_interval %d must be in [1, 2^50]", ls.growth_interval));
  }
  if (ls.hysteresis < 1 || ls.hysteresis > kMaxHysteresis) {
    return bad(absl::StrFormat("loss_scale.hysteresis %d must be in [1, %d]", ls.hysteresis,
                               kMaxHysteresis));
  }
  if (ls.max_skips_at_min_scale < 1) {
    return bad(absl::StrFormat("loss_scale.max_skips_at_min_scale %d must be >= 1",
                               ls.max_skips_at_min_scale));
  }
  return absl::OkStatus();
}

}  // namespace zeroshard
