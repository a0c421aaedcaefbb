#include "engine/src/checkpoint/segment_reader.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

SegmentReader::SegmentReader(std::string step_dir, const Manifest& manifest)
    : step_dir_(std::move(step_dir)),
      manifest_(manifest),
      files_(static_cast<size_t>(manifest.world_size)) {}

SegmentReader::~SegmentReader() = default;

int SegmentReader::files_opened() const {
  int opened = 0;
  for (const auto& f : files_) opened += f != nullptr;
  return opened;
}

absl::StatusOr<RankFileReader*> SegmentReader::File(int rank) {
  if (files_[rank] == nullptr) {
    ZS_ASSIGN_OR_RETURN(RankFileReader reader, RankFileReader::Open(step_dir_, manifest_, rank));
    files_[rank] = std::make_unique<RankFileReader>(std::move(reader));
  }
  return files_[rank].get();
}

absl::Status SegmentReader::Read(int unit, int64_t begin, int64_t end,
                                 float* const out[kTensorsPerUnit]) {
  if (unit < 0 || unit >= static_cast<int>(manifest_.shard_numel.size()) || begin < 0 ||
      end < begin) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint %s: no range [%d, %d) of unit %d to read", step_dir_, begin, end, unit));
  }
  const int64_t shard = manifest_.shard_numel[unit];
  const int64_t used = manifest_.used_numel[unit];
  bool every_tensor = true;
  for (int t = 0; t < kTensorsPerUnit; ++t) every_tensor = every_tensor && out[t] != nullptr;
  // Old rank r's shard is [r * shard, (r + 1) * shard): only the ranks whose
  // shard meets [begin, min(end, used)).
  const int64_t last = std::min(end, used);
  if (shard <= 0 || begin >= last) return absl::OkStatus();
  const int first_rank = static_cast<int>(begin / shard);
  const int end_rank =
      static_cast<int>(std::min<int64_t>(manifest_.world_size, (last + shard - 1) / shard));
  for (int r = first_rank; r < end_rank; ++r) {
    const int64_t from = std::max(begin, r * shard);
    const int64_t to = std::min(last, (r + 1) * shard);
    if (from >= to) continue;
    ZS_ASSIGN_OR_RETURN(RankFileReader * file, File(r));
    // A shard inside the range whole (every shard, at the same world size)
    // is read whole, so that its unit checksum is checked too.
    const bool whole = every_tensor && begin <= r * shard && (r + 1) * shard <= end;
    if (whole) ZS_RETURN_IF_ERROR(file->ReadUnit(unit, whole_));
    for (int t = 0; t < kTensorsPerUnit; ++t) {
      if (out[t] == nullptr) continue;
      float* dst = out[t] + (from - begin);
      if (whole) {
        std::memcpy(dst, whole_[t].data() + (from - r * shard),
                    static_cast<size_t>(to - from) * sizeof(float));
      } else {
        ZS_RETURN_IF_ERROR(file->Read(unit, t, from - r * shard, to - r * shard, dst));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
