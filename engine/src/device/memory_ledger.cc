#include <algorithm>

#include "zeroshard/device.h"

namespace zeroshard {

void MemoryLedger::Add(MemoryCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int c = static_cast<int>(category);
  current_[c] += bytes;
  peak_[c] = std::max(peak_[c], current_[c]);
  current_total_ += bytes;
  peak_total_ = std::max(peak_total_, current_total_);
}

void MemoryLedger::Remove(MemoryCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  current_[static_cast<int>(category)] -= bytes;
  current_total_ -= bytes;
}

int64_t MemoryLedger::current(MemoryCategory category) const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_[static_cast<int>(category)];
}

int64_t MemoryLedger::peak(MemoryCategory category) const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_[static_cast<int>(category)];
}

int64_t MemoryLedger::current_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_total_;
}

int64_t MemoryLedger::peak_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_total_;
}

int64_t MemoryLedger::current_model_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    if (IsModelState(static_cast<MemoryCategory>(c))) total += current_[c];
  }
  return total;
}

}  // namespace zeroshard
