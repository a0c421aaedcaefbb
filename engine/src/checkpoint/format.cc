#include "engine/src/checkpoint/format.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "zeroshard/quote.h"

// The names and byte offsets of the format; manifest.cc reads and writes
// manifest.json, rank_file.cc the rank files.
namespace zeroshard::internal {

std::string StepDirName(int64_t step) { return absl::StrFormat("step_%08d", step); }
std::string RankFileName(int rank) { return absl::StrFormat("rank_%05d.bin", rank); }

int64_t ParseStepDirName(const std::string& name) {
  constexpr char kPrefix[] = "step_";
  constexpr size_t kPrefixLength = sizeof(kPrefix) - 1;
  // Digits only (no sign, no spaces), at most 16 of them (2^50 has 16).
  if (name.size() <= kPrefixLength || name.size() > kPrefixLength + 16 ||
      name.compare(0, kPrefixLength, kPrefix) != 0) {
    return -1;
  }
  int64_t step = 0;
  for (size_t i = kPrefixLength; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step <= (int64_t{1} << 50) ? step : -1;
}

absl::StatusOr<std::string> ParseLatest(const std::string& text, const std::string& path) {
  const std::string name(absl::StripAsciiWhitespace(text));
  if (ParseStepDirName(name) < 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: holds %s, not a step name like step_00000100; the file is damaged: pass a step "
        "directory, or write the name of a complete one into it",
        path, QuoteForMessage(text)));
  }
  return name;
}

int64_t TensorOffset(const std::vector<int64_t>& shard_numel, int unit, int tensor) {
  int64_t floats = 0;
  for (int u = 0; u < unit; ++u) floats += kTensorsPerUnit * shard_numel[u];
  floats += tensor * shard_numel[unit];
  return kHeaderBytes + floats * static_cast<int64_t>(sizeof(float));
}

int64_t FirstChunk(const std::vector<int64_t>& shard_numel, int unit, int tensor,
                   int64_t chunk_elements) {
  int64_t chunks = 0;
  for (int u = 0; u <= unit; ++u) {
    const int64_t c = (shard_numel[u] + chunk_elements - 1) / chunk_elements;
    chunks += u < unit ? kTensorsPerUnit * c : tensor * c;
  }
  return chunks;
}

int64_t IndexEntries(const std::vector<int64_t>& shard_numel, int64_t chunk_elements) {
  return FirstChunk(shard_numel, static_cast<int>(shard_numel.size()) - 1, kTensorsPerUnit,
                    chunk_elements);
}

int64_t DataBytes(const Manifest& manifest) {
  int64_t floats = 0;
  for (int64_t n : manifest.shard_numel) floats += kTensorsPerUnit * n;
  return floats * static_cast<int64_t>(sizeof(float));
}

int64_t FileBytes(const std::vector<int64_t>& shard_numel, int64_t chunk_elements) {
  int64_t floats = 0;
  for (int64_t n : shard_numel) floats += kTensorsPerUnit * n;
  return kHeaderBytes + floats * static_cast<int64_t>(sizeof(float)) +
         IndexEntries(shard_numel, chunk_elements) * static_cast<int64_t>(sizeof(uint32_t)) +
         kTrailerBytes;
}

}  // namespace zeroshard::internal
