// The on-disk format of a checkpoint (docs/checkpoint.md):
//
//   <dir>/latest                      the name of the newest complete step ("step_00000100\n")
//   <dir>/step_00000100/manifest.json what the run was and where everything is
//   <dir>/step_00000100/rank_00003.bin one file per rank of the run that wrote it
//   <dir>/step_00000100.partial/      a step being written (or abandoned by a crash)
//
// A rank file, little-endian:
//   header  64 bytes: magic "ZSHARD01", version, rank, world, units, tensors (3),
//           chunk elements, data bytes
//   data    for each unit, for each tensor (fp32 master, Adam m, Adam v): the
//           rank's shard of the unit's flat segment, shard_numel[u] floats
//           (segment coordinates [rank * shard_numel[u], (rank + 1) * shard_numel[u]))
//   index   one CRC32C per chunk of chunk_elements floats of each (unit, tensor)
//   trailer 24 bytes: index offset, index entries, magic "ZSHARDEN"
// Param offsets within a unit's segment do not depend on the world size
// (FlatLayout), so a rank of any other world size finds the elements it
// owns by their segment coordinates.
#ifndef ZEROSHARD_CHECKPOINT_FORMAT_H_
#define ZEROSHARD_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::internal {

inline constexpr char kManifestName[] = "manifest.json";
inline constexpr char kLatestName[] = "latest";
inline constexpr int kFormatVersion = 1;
inline constexpr int kTensorsPerUnit = 3;  // master, adam_m, adam_v
inline constexpr const char* kTensorNames[kTensorsPerUnit] = {"master", "adam_m", "adam_v"};
// Elements per checksum chunk: a rank reading part of a shard reads whole
// chunks around it (at most 256 KiB more per range) and verifies them.
inline constexpr int64_t kChunkElements = 65536;
inline constexpr int64_t kHeaderBytes = 64;
inline constexpr int64_t kTrailerBytes = 24;
// The most a reader reads of the files it finds by name: `latest` holds one
// step name; a manifest holds the run's description, one record per rank
// file (about 20 bytes per unit each) and the trainer's state. Save refuses
// a trainer state past kMaxTrainerStateBytes and a manifest past
// kMaxManifestBytes (65,536 ranks x 160 units fit), so every manifest it
// writes is read back.
inline constexpr int64_t kMaxLatestBytes = 256;
inline constexpr int64_t kMaxManifestBytes = int64_t{256} << 20;
inline constexpr int64_t kMaxTrainerStateBytes = int64_t{1} << 20;
// JSON nesting: a trainer state at most kMaxTrainerStateDepth levels deep, a
// whole manifest at most kMaxManifestDepth (its own 5 levels around the
// trainer state). Writing and checksumming JSON recurses once per level, so
// a deeper document is refused before it is walked.
inline constexpr int kMaxTrainerStateDepth = 32;
inline constexpr int kMaxManifestDepth = kMaxTrainerStateDepth + 8;

// "step_00000100", "rank_00003.bin".
std::string StepDirName(int64_t step);
std::string RankFileName(int rank);
// The step of a step directory's name ("step_00000100" -> 100), or -1 for
// any other name (with a suffix, a sign, spaces, past 2^50).
int64_t ParseStepDirName(const std::string& name);
// The step directory the text of a `latest` file names: one step name,
// optionally followed by a newline (what CommitCheckpointDirectory writes;
// surrounding whitespace is tolerated). DataLoss naming `path` and quoting at
// most a short, escaped prefix of the text otherwise.
absl::StatusOr<std::string> ParseLatest(const std::string& text, const std::string& path);

// One rank file's entry in the manifest.
struct FileRecord {
  std::string name;
  int64_t bytes = 0;
  uint32_t crc32c = 0;                // the whole file
  uint32_t index_crc32c = 0;          // the chunk index
  std::vector<uint32_t> unit_crc32c;  // each unit's data in this file (all three tensors)
};

// manifest.json, parsed.
struct Manifest {
  int version = kFormatVersion;
  int64_t step = 0;
  int64_t applied_steps = 0;  // updates applied (Adam bias correction)
  int64_t skipped_steps = 0;
  int world_size = 1;
  TrainSpec train;  // every field of TrainSpecFieldTable
  // The fields of `train` this manifest does not record (written before the
  // field was; `train` holds its default): Load reports no change of them.
  std::vector<std::string> unrecorded_train_fields;
  double loss_scale = 1.0;
  int hysteresis_left = 1;
  int64_t clean_steps = 0;
  int skips_at_min_scale = 0;
  ModelSpec model;
  uint64_t model_fingerprint = 0;
  std::vector<int64_t> used_numel;   // per unit: end of its last param in the segment
  std::vector<int64_t> shard_numel;  // per unit: elements per rank in the writing run
  int64_t chunk_elements = kChunkElements;
  std::vector<FileRecord> files;  // world_size entries, rank order
  std::string trainer_state;      // a JSON object, as text
};

std::string ManifestToJson(const Manifest& manifest);
// Whether Save may store `state` as the trainer state: a JSON object of at
// most kMaxTrainerStateBytes, nested at most kMaxTrainerStateDepth deep.
// Returns how many bytes more it takes in manifest.json than "{}" does;
// InvalidArgument saying which rule it breaks (the message starts "Save: ").
absl::StatusOr<int64_t> TrainerStateManifestBytes(const std::string& state);
// Parses and validates manifest.json, starting with its own CRC32C (field
// 'manifest_crc32c'); `source` names it in errors (which name the field and
// say what to do).
absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& source);
// The same without the checksum (the fuzz target's way past it): every field
// is still validated.
absl::StatusOr<Manifest> ParseManifestContent(const std::string& text, const std::string& source);
// What a checkpoint's manifest says of it, as InspectCheckpoint and Load
// return it (`note`: how `latest` was resolved; changed_settings empty).
CheckpointInfo DescribeCheckpoint(const std::string& step_dir, const Manifest& manifest,
                                  const std::string& note);

// Byte offsets within a rank file of the writing layout.
int64_t DataBytes(const Manifest& manifest);
// Offset of tensor `tensor` of unit `unit` (segment element rank*shard is at
// this offset), and its chunk index in the file's index.
int64_t TensorOffset(const std::vector<int64_t>& shard_numel, int unit, int tensor);
int64_t FirstChunk(const std::vector<int64_t>& shard_numel, int unit, int tensor,
                   int64_t chunk_elements);
int64_t IndexEntries(const std::vector<int64_t>& shard_numel, int64_t chunk_elements);
int64_t FileBytes(const std::vector<int64_t>& shard_numel, int64_t chunk_elements);

// The exact 64 header bytes and 24 trailer bytes of rank `rank`'s file in a
// checkpoint of `world` ranks with these shard sizes (the writer writes
// them; every reader compares all of them).
std::string RankFileHeader(int rank, int world, const std::vector<int64_t>& shard_numel,
                           int64_t chunk_elements);
std::string RankFileTrailer(const std::vector<int64_t>& shard_numel, int64_t chunk_elements);
// `bytes` (a rank file's first 64 / last 24 bytes) against the expected:
// DataLoss naming `path`, the field and its byte range, what it holds and
// what was expected (the first field that differs).
absl::Status CheckRankFileHeader(absl::string_view bytes, const Manifest& manifest, int rank,
                                 const std::string& path);
absl::Status CheckRankFileTrailer(absl::string_view bytes, const Manifest& manifest,
                                  const std::string& path);
// DataLoss: "<path>: <what>; the file is damaged: load an earlier
// checkpoint", the wording of every check of a rank file.
absl::Status DamagedRankFile(const std::string& path, const std::string& what);

// Streams one rank's shard into its file, computing the chunk, unit and
// file checksums on the way. `data` is the file's data section (unit-major,
// tensor-minor, shard_numel[u] floats each); the file is written as
// `final_path` + ".tmp", synced and renamed.
absl::StatusOr<FileRecord> WriteRankFile(const std::string& final_path, int rank, int world,
                                         const std::vector<int64_t>& shard_numel,
                                         const std::vector<float>& data);

// Reads elements of one rank file, verifying every chunk it touches
// (rank_file_reader.cc).
class RankFileReader {
 public:
  // Opens rank `rank`'s file of the checkpoint in `step_dir`: a regular file
  // (a symlink must resolve inside `step_dir`), of the size the manifest
  // records, whose 64 header and 24 trailer bytes are exactly those of
  // RankFileHeader / RankFileTrailer and whose chunk index has the
  // manifest's CRC. DataLoss / NotFound / FailedPrecondition naming the file.
  static absl::StatusOr<RankFileReader> Open(const std::string& step_dir, const Manifest& manifest,
                                             int rank);
  RankFileReader(RankFileReader&&) noexcept;
  RankFileReader& operator=(RankFileReader&&) noexcept;
  ~RankFileReader();

  // Copies elements [begin, end) of tensor `tensor` of unit `unit`, in this
  // file's shard coordinates (0 = segment element rank*shard_numel[u]), into
  // `out`. Reads the whole chunks around them and verifies each chunk's
  // CRC32C: DataLoss naming the file, unit, tensor and byte range.
  absl::Status Read(int unit, int tensor, int64_t begin, int64_t end, float* out);
  // The whole shard of unit `unit` in this file, every tensor (padding
  // included), into tensors[t]: every chunk verified, then the unit's CRC32C
  // against the manifest's files[rank].unit_crc32c. DataLoss naming the
  // file and unit.
  absl::Status ReadUnit(int unit, std::vector<float> (&tensors)[kTensorsPerUnit]);

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  RankFileReader() = default;
  std::string path_;
  int rank_ = 0;
  int fd_ = -1;
  const Manifest* manifest_ = nullptr;
  std::vector<uint32_t> index_;
  std::vector<float> chunk_;
};

// Whole-file checks for InspectCheckpoint: RankFileReader::Open, ReadUnit of
// every unit, then the whole file's CRC32C (files[rank].crc32c): one line
// per problem.
void VerifyRankFile(const std::string& step_dir, const Manifest& manifest, int rank,
                    std::vector<std::string>* problems);

// Reads and parses `step_dir`/manifest.json: a regular file inside
// `step_dir` of at most kMaxManifestBytes. FailedPrecondition when it is
// missing (a save that did not finish), DataLoss when it cannot be a
// manifest, then ParseManifest's errors.
absl::StatusOr<Manifest> ReadManifest(const std::string& step_dir);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_CHECKPOINT_FORMAT_H_
