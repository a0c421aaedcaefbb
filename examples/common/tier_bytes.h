// The bytes of one rank per memory tier (device, host, NVMe): what the plan
// lists (PlanEngineBuffers) and what the engine's ledgers hold
// (Engine::tier_ledger), side by side, as the example trainers print them
// after a run with the optimizer state offloaded (docs/offload.md).
#ifndef ZEROSHARD_EXAMPLES_COMMON_TIER_BYTES_H_
#define ZEROSHARD_EXAMPLES_COMMON_TIER_BYTES_H_

#include <array>
#include <cstdint>
#include <cstdio>

#include "absl/status/statusor.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/engine.h"
#include "zeroshard/memory_category.h"
#include "zeroshard/status.h"

namespace zeroshard::examples {

inline constexpr int kNumTiers = static_cast<int>(MemoryTier::kCount);

struct TierBytes {
  std::array<int64_t, kNumTiers> plan{};    // BufferPlan::total_bytes(tier)
  std::array<int64_t, kNumTiers> ledger{};  // tier_ledger(tier).current_total()
  bool ledger_equals_plan() const { return plan == ledger; }
};

// This rank's bytes per tier: the plan of `engine`'s model and TrainSpec on
// `world` ranks, and its ledgers now. Call it right after Engine::Create:
// every engine buffer is there, and nothing of the trainer's yet (a trainer
// may keep its activations and workspace on the engine's device, in the
// device ledger).
inline absl::StatusOr<TierBytes> ReadTierBytes(const Engine& engine, int world) {
  ZS_ASSIGN_OR_RETURN(BufferPlan plan, PlanEngineBuffers(engine.model(), engine.train(), world));
  TierBytes out;
  for (int t = 0; t < kNumTiers; ++t) {
    const auto tier = static_cast<MemoryTier>(t);
    out.plan[t] = plan.total_bytes(tier);
    out.ledger[t] = engine.tier_ledger(tier).current_total();
  }
  return out;
}

// "memory per tier (<who>, bytes)", a header, and one line per tier: the
// plan's bytes, the ledger's, and a mark where they differ.
inline void PrintTierBytes(const TierBytes& b, const char* who, std::FILE* out) {
  std::fprintf(out, "memory per tier (%s, bytes)\n  %-6s %14s %14s\n", who, "tier", "plan",
               "ledger");
  for (int t = 0; t < kNumTiers; ++t) {
    std::fprintf(out, "  %-6s %14lld %14lld%s\n", MemoryTierName(static_cast<MemoryTier>(t)),
                 static_cast<long long>(b.plan[t]), static_cast<long long>(b.ledger[t]),
                 b.plan[t] == b.ledger[t] ? "" : "  (ledger != plan)");
  }
}

}  // namespace zeroshard::examples

#endif  // ZEROSHARD_EXAMPLES_COMMON_TIER_BYTES_H_
