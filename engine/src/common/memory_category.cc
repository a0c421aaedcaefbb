#include "zeroshard/memory_category.h"

namespace zeroshard {

const char* MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParams:
      return "params";
    case MemoryCategory::kGradients:
      return "grads";
    case MemoryCategory::kMasterParams:
      return "master";
    case MemoryCategory::kOptimizerState:
      return "optimizer";
    case MemoryCategory::kCommBuffers:
      return "buffers";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kWorkspace:
      return "workspace";
    case MemoryCategory::kCount:
      break;
  }
  return "?";
}

const char* MemoryTierName(MemoryTier tier) {
  switch (tier) {
    case MemoryTier::kDevice:
      return "device";
    case MemoryTier::kHost:
      return "host";
    case MemoryTier::kNvme:
      return "nvme";
    case MemoryTier::kCount:
      break;
  }
  return "?";
}

bool IsModelState(MemoryCategory category) {
  return category == MemoryCategory::kParams || category == MemoryCategory::kGradients ||
         category == MemoryCategory::kMasterParams || category == MemoryCategory::kOptimizerState;
}

}  // namespace zeroshard
