// What a byte of engine memory holds. The planner reports its sizes by
// category and the device's MemoryLedger records live and peak bytes by
// category, so a plan and a measurement compare category by category.
#ifndef ZEROSHARD_MEMORY_CATEGORY_H_
#define ZEROSHARD_MEMORY_CATEGORY_H_

namespace zeroshard {

enum class MemoryCategory : int {
  kParams = 0,      // working-precision parameters (fp32, bf16 or fp16)
  kGradients,       // gradient accumulation buffers
  kMasterParams,    // fp32 master copy (mixed precision only)
  kOptimizerState,  // Adam m and v
  kCommBuffers,     // gradient staging buckets, gather buffers
  kActivations,
  kWorkspace,
  kCount
};
inline constexpr int kNumMemoryCategories = static_cast<int>(MemoryCategory::kCount);

// Where a buffer lives (TrainSpec::offload, docs/offload.md): the device
// (GPU memory, or the CPU rank's own memory), the host tier (pinned host
// memory beside a GPU; plain host memory beside a CPU device), or NVMe swap
// files under OffloadSpec::dir. Each tier has its own MemoryLedger
// (Engine::tier_ledger) and the plan lists each buffer's tier.
enum class MemoryTier : int { kDevice = 0, kHost, kNvme, kCount };
inline constexpr int kNumMemoryTiers = static_cast<int>(MemoryTier::kCount);
// "device", "host", "nvme"; "?" for a value outside the enum.
const char* MemoryTierName(MemoryTier tier);

// "params", "grads", "master", "optimizer", "buffers", "activations",
// "workspace"; "?" for a value outside the enum.
const char* MemoryCategoryName(MemoryCategory category);
// params, grads, master and optimizer state: what the ZeRO formulas count.
bool IsModelState(MemoryCategory category);

}  // namespace zeroshard

#endif  // ZEROSHARD_MEMORY_CATEGORY_H_
