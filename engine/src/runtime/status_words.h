// A status as it travels in a collective of int64 words: every rank learns
// every rank's verdict (the checkpoint agreement, Load, the directory
// check), so every rank can return the same status.
#ifndef ZEROSHARD_RUNTIME_STATUS_WORDS_H_
#define ZEROSHARD_RUNTIME_STATUS_WORDS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zeroshard::internal {

// A message, truncated to kMessageWords int64 words.
inline constexpr int kMessageWords = 48;

inline void PackMessage(const std::string& text, int64_t* words) {
  char bytes[kMessageWords * 8] = {};
  std::memcpy(bytes, text.data(), std::min(text.size(), sizeof(bytes) - 1));
  std::memcpy(words, bytes, sizeof(bytes));
}

inline std::string UnpackMessage(const int64_t* words) {
  char bytes[kMessageWords * 8 + 1] = {};
  std::memcpy(bytes, words, kMessageWords * 8);
  return std::string(bytes);
}

// A status: ok flag, code, then its message.
inline constexpr int kStatusWords = 2 + kMessageWords;

inline void PackStatus(const absl::Status& status, int64_t* words) {
  words[0] = status.ok() ? 1 : 0;
  words[1] = static_cast<int64_t>(status.code());
  PackMessage(std::string(status.message()), words + 2);
}

// The status `words` hold, its message after `prefix`.
inline absl::Status UnpackStatus(const int64_t* words, const std::string& prefix) {
  if (words[0] == 1) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(words[1]),
                      absl::StrCat(prefix, UnpackMessage(words + 2)));
}

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_STATUS_WORDS_H_
