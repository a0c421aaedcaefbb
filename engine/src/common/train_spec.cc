#include "zeroshard/train_spec.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace zeroshard {

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16Mixed:
      return "bf16";
  }
  return "?";
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16Mixed;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown precision '%s'; expected fp32 or bf16", name));
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
  return precision == Precision::kFp32 ? DType::kFloat32 : DType::kBFloat16;
}

DType TrainSpec::effective_grad_dtype() const {
  return grad_dtype.has_value() ? *grad_dtype : param_dtype();
}

absl::Status TrainSpec::Validate() const {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("train spec: " + what);
  };
  if (zero_stage < 0 || zero_stage > 2) {
    return bad(absl::StrFormat("zero_stage %d is not supported; use 0, 1 or 2", zero_stage));
  }
  const DType g = effective_grad_dtype();
  if (precision == Precision::kFp32 && g != DType::kFloat32) {
    return bad(
        absl::StrFormat("grad_dtype %s with fp32 precision; use fp32 gradients", DTypeName(g)));
  }
  if (g != DType::kFloat32 && g != DType::kBFloat16) {
    return bad(absl::StrFormat("grad_dtype %s; use fp32 or bf16", DTypeName(g)));
  }
  const OptimizerSpec& o = optimizer;
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) return bad(absl::StrFormat("lr %g must be >= 0", o.lr));
  if (!(o.beta1 >= 0 && o.beta1 < 1))
    return bad(absl::StrFormat("beta1 %g must be in [0, 1)", o.beta1));
  if (!(o.beta2 >= 0 && o.beta2 < 1))
    return bad(absl::StrFormat("beta2 %g must be in [0, 1)", o.beta2));
  if (!(o.eps > 0))
    return bad(absl::StrFormat("eps %g must be > 0 (it keeps padding at zero)", o.eps));
  if (!(o.weight_decay >= 0))
    return bad(absl::StrFormat("weight_decay %g must be >= 0", o.weight_decay));
  if (schedule.kind == LrSchedule::Kind::kWarmupCosine) {
    if (schedule.warmup_steps < 0 || schedule.total_steps <= schedule.warmup_steps) {
      return bad(absl::StrFormat(
          "warmup-cosine schedule needs 0 <= warmup_steps < total_steps (got %d and %d)",
          schedule.warmup_steps, schedule.total_steps));
    }
    if (!(schedule.min_lr_ratio >= 0 && schedule.min_lr_ratio <= 1)) {
      return bad(absl::StrFormat("min_lr_ratio %g must be in [0, 1]", schedule.min_lr_ratio));
    }
  }
  if (!(max_grad_norm >= 0))
    return bad(absl::StrFormat("max_grad_norm %g must be >= 0", max_grad_norm));
  if (grad_accum_steps < 1)
    return bad(absl::StrFormat("grad_accum_steps %d must be >= 1", grad_accum_steps));
  if (num_grad_buffers < 1)
    return bad(absl::StrFormat("num_grad_buffers %d must be >= 1", num_grad_buffers));
  return absl::OkStatus();
}

}  // namespace zeroshard
