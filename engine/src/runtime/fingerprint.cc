#include "engine/src/runtime/fingerprint.h"

#include <cstring>
#include <string>

namespace zeroshard::internal {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t Mix(uint64_t h, uint64_t word) { return (h ^ word) * kFnvPrime; }

template <typename T>
uint64_t HashValue(uint64_t h, const T& value) {
  return HashBytes(&value, sizeof(value), h);
}

uint64_t HashString(uint64_t h, const std::string& s) {
  h = HashValue(h, static_cast<uint64_t>(s.size()));
  return HashBytes(s.data(), s.size(), h);
}

}  // namespace

uint64_t HashBytes(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed == 0 ? kFnvOffset : seed;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    h = Mix(h, word);
  }
  for (; i < bytes; ++i) h = Mix(h, p[i]);
  return Mix(h, bytes);
}

uint64_t FingerprintModelSpec(const ModelSpec& spec) {
  uint64_t h = kFnvOffset;
  for (const UnitSpec& unit : spec.units) {
    h = HashString(h, unit.name);
    for (const ParamSpec& p : unit.params) {
      h = HashString(h, p.name);
      for (int64_t d : p.shape) h = HashValue(h, d);
      h = HashValue(h, static_cast<uint8_t>(p.no_decay));
    }
  }
  return h;
}

uint64_t FingerprintLayout(const FlatLayout& layout) {
  uint64_t h = HashValue(kFnvOffset, layout.world_size());
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

uint64_t FingerprintTrainSpec(const TrainSpec& t) {
  uint64_t h = kFnvOffset;
  h = HashValue(h, t.zero_stage);
  h = HashValue(h, static_cast<int>(t.precision));
  h = HashValue(h, static_cast<int>(t.effective_grad_dtype()));
  h = HashValue(h, static_cast<int>(t.optimizer.kind));
  h = HashValue(h, t.optimizer.lr);
  h = HashValue(h, t.optimizer.beta1);
  h = HashValue(h, t.optimizer.beta2);
  h = HashValue(h, t.optimizer.eps);
  h = HashValue(h, t.optimizer.weight_decay);
  h = HashValue(h, static_cast<int>(t.schedule.kind));
  h = HashValue(h, t.schedule.warmup_steps);
  h = HashValue(h, t.schedule.total_steps);
  h = HashValue(h, t.schedule.min_lr_ratio);
  h = HashValue(h, t.max_grad_norm);
  h = HashValue(h, t.grad_accum_steps);
  h = HashValue(h, t.num_grad_buffers);
  h = HashValue(h, t.prefetch_units);
  h = HashValue(h, t.max_live_gather_bytes);
  h = HashValue(h, t.persistent_unit_numel);
  h = HashValue(h, t.loss_scale.initial_scale);
  h = HashValue(h, t.loss_scale.growth_factor);
  h = HashValue(h, t.loss_scale.backoff_factor);
  h = HashValue(h, t.loss_scale.growth_interval);
  h = HashValue(h, t.loss_scale.hysteresis);
  h = HashValue(h, t.loss_scale.min_scale);
  h = HashValue(h, t.loss_scale.max_skips_at_min_scale);
  h = HashValue(h, static_cast<uint8_t>(t.check_collective_sequence));
  return h;
}

}  // namespace zeroshard::internal
