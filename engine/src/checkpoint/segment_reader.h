// Reading a checkpoint by segment coordinates, whatever world size wrote it.
//
// A unit's flat segment is laid out the same at every world size
// (FlatLayout); the writing run's rank r holds elements
// [r * shard_numel[u], (r + 1) * shard_numel[u]) of it. SegmentReader finds
// which old ranks' shards overlap a range and reads each overlap from that
// rank's file, verified (RankFileReader). Engine::Load reads the range a new
// rank owns; `zeroshard export` reads each unit whole.
#ifndef ZEROSHARD_CHECKPOINT_SEGMENT_READER_H_
#define ZEROSHARD_CHECKPOINT_SEGMENT_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/src/checkpoint/format.h"

namespace zeroshard::internal {

class SegmentReader {
 public:
  // Reads the checkpoint in `step_dir` whose manifest is `manifest` (which
  // must outlive the reader). Rank files are opened (and their header,
  // trailer and index checked) when first needed.
  SegmentReader(std::string step_dir, const Manifest& manifest);
  ~SegmentReader();

  // Elements [begin, end) of unit `unit`'s segment into out[t][0, end -
  // begin) for every tensor t (master, adam_m, adam_v) whose out[t] is not
  // null. Elements at or past the unit's used_numel (padding) are not
  // written. An old shard that lies inside [begin, end) whole, when every
  // tensor is wanted, is read whole and checked against its unit CRC32C too
  // (RankFileReader::ReadUnit); any other part, chunk by chunk, each chunk
  // checked against the index. Errors of RankFileReader (DataLoss,
  // NotFound, FailedPrecondition naming the file); InvalidArgument for a
  // unit or range outside the manifest's.
  absl::Status Read(int unit, int64_t begin, int64_t end, float* const out[kTensorsPerUnit]);

  // Old ranks whose file Read has opened so far (for tests and reports).
  int files_opened() const;

 private:
  absl::StatusOr<RankFileReader*> File(int rank);

  std::string step_dir_;
  const Manifest& manifest_;
  std::vector<std::unique_ptr<RankFileReader>> files_;
  std::vector<float> whole_[kTensorsPerUnit];
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_CHECKPOINT_SEGMENT_READER_H_
