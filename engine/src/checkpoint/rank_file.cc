#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "kernels/cpu/crc32c.h"
#include "zeroshard/quote.h"
#include "zeroshard/status.h"

// The rank files: their exact header and trailer and the streaming writer
// (the verifying reader is rank_file_reader.cc).
namespace zeroshard::internal {
namespace {

constexpr char kHeaderMagic[8] = {'Z', 'S', 'H', 'A', 'R', 'D', '0', '1'};
constexpr char kTrailerMagic[8] = {'Z', 'S', 'H', 'A', 'R', 'D', 'E', 'N'};

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t rank;
  uint32_t world;
  uint32_t units;
  uint32_t tensors;
  uint32_t chunk_elements;
  uint64_t data_bytes;
  uint8_t reserved[24];
};
static_assert(sizeof(FileHeader) == kHeaderBytes, "the header is 64 bytes");

struct FileTrailer {
  uint64_t index_offset;
  uint64_t index_entries;
  char magic[8];
};
static_assert(sizeof(FileTrailer) == kTrailerBytes, "the trailer is 24 bytes");

}  // namespace

absl::Status DamagedRankFile(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrFormat(
      "%s: %s; the file is damaged: load an earlier checkpoint (docs/checkpoint.md)", path, what));
}

std::string RankFileHeader(int rank, int world, const std::vector<int64_t>& shard_numel,
                           int64_t chunk_elements) {
  FileHeader header{};
  std::memcpy(header.magic, kHeaderMagic, sizeof(header.magic));
  header.version = kFormatVersion;
  header.rank = static_cast<uint32_t>(rank);
  header.world = static_cast<uint32_t>(world);
  header.units = static_cast<uint32_t>(shard_numel.size());
  header.tensors = kTensorsPerUnit;
  header.chunk_elements = static_cast<uint32_t>(chunk_elements);
  int64_t floats = 0;
  for (int64_t n : shard_numel) floats += kTensorsPerUnit * n;
  header.data_bytes = static_cast<uint64_t>(floats) * sizeof(float);
  return std::string(reinterpret_cast<const char*>(&header), sizeof(header));
}

std::string RankFileTrailer(const std::vector<int64_t>& shard_numel, int64_t chunk_elements) {
  FileTrailer trailer{};
  int64_t floats = 0;
  for (int64_t n : shard_numel) floats += kTensorsPerUnit * n;
  trailer.index_offset = static_cast<uint64_t>(kHeaderBytes + floats * 4);
  trailer.index_entries = static_cast<uint64_t>(IndexEntries(shard_numel, chunk_elements));
  std::memcpy(trailer.magic, kTrailerMagic, sizeof(trailer.magic));
  return std::string(reinterpret_cast<const char*>(&trailer), sizeof(trailer));
}

namespace {

// One field of a header or trailer: its bytes, and how to print them.
struct FieldSpan {
  const char* name;
  int begin;
  int end;
  bool text;  // a magic: printed as text; otherwise a little-endian number
};

std::string FieldValue(absl::string_view bytes, const FieldSpan& f) {
  const absl::string_view raw = bytes.substr(f.begin, f.end - f.begin);
  if (f.text) return QuoteForMessage(raw);
  if (f.end - f.begin > 8) {
    return raw.find_first_not_of('\0') == absl::string_view::npos ? "zeros" : "other bytes";
  }
  uint64_t value = 0;
  std::memcpy(&value, raw.data(), raw.size());
  return absl::StrCat(value);
}

// The first field in which `bytes` and `expected` differ, named with its
// byte range in the file (header fields count from 0, trailer fields from
// `offset`).
absl::Status CompareFields(absl::string_view bytes, const std::string& expected,
                           std::initializer_list<FieldSpan> fields, int64_t offset,
                           const char* part, const std::string& path) {
  if (bytes.size() != expected.size()) {
    return DamagedRankFile(
        path, absl::StrFormat("its %s is %d bytes, not %d", part, bytes.size(), expected.size()));
  }
  for (const FieldSpan& f : fields) {
    if (bytes.substr(f.begin, f.end - f.begin) !=
        absl::string_view(expected).substr(f.begin, f.end - f.begin)) {
      return DamagedRankFile(
          path, absl::StrFormat("its %s's %s (bytes [%d, %d)) holds %s, expected %s", part, f.name,
                                offset + f.begin, offset + f.end, FieldValue(bytes, f),
                                FieldValue(expected, f)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRankFileHeader(absl::string_view bytes, const Manifest& m, int rank,
                                 const std::string& path) {
  const std::string expected = RankFileHeader(rank, m.world_size, m.shard_numel, m.chunk_elements);
  return CompareFields(bytes, expected,
                       {{"magic", 0, 8, true},
                        {"format version", 8, 12, false},
                        {"rank", 12, 16, false},
                        {"world size", 16, 20, false},
                        {"unit count", 20, 24, false},
                        {"tensors per unit", 24, 28, false},
                        {"chunk elements", 28, 32, false},
                        {"data bytes", 32, 40, false},
                        {"reserved bytes (zeros)", 40, 64, false}},
                       0, "header", path);
}

absl::Status CheckRankFileTrailer(absl::string_view bytes, const Manifest& m,
                                  const std::string& path) {
  const std::string expected = RankFileTrailer(m.shard_numel, m.chunk_elements);
  const int64_t offset = FileBytes(m.shard_numel, m.chunk_elements) - kTrailerBytes;
  return CompareFields(
      bytes, expected,
      {{"index offset", 0, 8, false}, {"index entries", 8, 16, false}, {"magic", 16, 24, true}},
      offset, "trailer", path);
}

absl::StatusOr<FileRecord> WriteRankFile(const std::string& final_path, int rank, int world,
                                         const std::vector<int64_t>& shard_numel,
                                         const std::vector<float>& data) {
  ZS_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::Create(final_path));
  FileRecord rec;
  rec.name = RankFileName(rank);
  uint32_t file_crc = 0;
  auto put = [&](const void* bytes, size_t n) -> absl::Status {
    file_crc = kernels::Crc32cExtend(file_crc, bytes, n);
    return file.Write(bytes, n);
  };
  const std::string header = RankFileHeader(rank, world, shard_numel, kChunkElements);
  ZS_RETURN_IF_ERROR(put(header.data(), header.size()));
  std::vector<uint32_t> index;
  const float* p = data.data();
  for (size_t u = 0; u < shard_numel.size(); ++u) {
    uint32_t unit_crc = 0;
    for (int t = 0; t < kTensorsPerUnit; ++t) {
      for (int64_t begin = 0; begin < shard_numel[u]; begin += kChunkElements) {
        const int64_t n = std::min(kChunkElements, shard_numel[u] - begin);
        const size_t bytes = static_cast<size_t>(n) * sizeof(float);
        index.push_back(kernels::Crc32c(p, bytes));
        unit_crc = kernels::Crc32cExtend(unit_crc, p, bytes);
        ZS_RETURN_IF_ERROR(put(p, bytes));
        p += n;
      }
    }
    rec.unit_crc32c.push_back(unit_crc);
  }
  rec.index_crc32c = kernels::Crc32c(index.data(), index.size() * sizeof(uint32_t));
  ZS_RETURN_IF_ERROR(put(index.data(), index.size() * sizeof(uint32_t)));
  const std::string trailer = RankFileTrailer(shard_numel, kChunkElements);
  ZS_RETURN_IF_ERROR(put(trailer.data(), trailer.size()));
  ZS_RETURN_IF_ERROR(file.Commit());
  rec.crc32c = file_crc;
  rec.bytes = FileBytes(shard_numel, kChunkElements);
  return rec;
}

}  // namespace zeroshard::internal
