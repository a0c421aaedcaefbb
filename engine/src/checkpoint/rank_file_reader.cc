#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "kernels/cpu/crc32c.h"
#include "zeroshard/status.h"

// The verifying reader of rank files (Load, inspect and export through
// SegmentReader) and the whole-file check of inspect: nothing is read from
// a rank file before its header, trailer and chunk index are checked, and
// no chunk is returned before its CRC32C is.
namespace zeroshard::internal {
namespace {

// Bytes read per pass when checksumming a whole file.
constexpr size_t kVerifyBlockBytes = size_t{4} << 20;

}  // namespace

RankFileReader::RankFileReader(RankFileReader&& other) noexcept { *this = std::move(other); }

RankFileReader& RankFileReader::operator=(RankFileReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    rank_ = other.rank_;
    fd_ = other.fd_;
    other.fd_ = -1;
    manifest_ = other.manifest_;
    index_ = std::move(other.index_);
    chunk_ = std::move(other.chunk_);
  }
  return *this;
}

RankFileReader::~RankFileReader() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<RankFileReader> RankFileReader::Open(const std::string& step_dir,
                                                    const Manifest& manifest, int rank) {
  RankFileReader reader;
  reader.manifest_ = &manifest;
  reader.rank_ = rank;
  reader.path_ = JoinPath(step_dir, RankFileName(rank));
  const FileRecord& rec = manifest.files[rank];
  const std::string& path = reader.path_;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    const int error = errno;
    const std::string text = absl::StrFormat(
        "stat %s: %s (errno %d); the manifest lists it: the checkpoint is incomplete (copied "
        "without all rank files?)",
        path, std::strerror(error), error);
    return error == ENOENT ? absl::NotFoundError(text) : absl::InternalError(text);
  }
  if (!S_ISREG(st.st_mode)) {
    return DamagedRankFile(
        path, "it is not a regular file (a FIFO, device or directory); it is not read");
  }
  ZS_ASSIGN_OR_RETURN(const bool inside, ResolvesInside(path, step_dir));
  if (!inside) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s resolves to %s, outside %s; a checkpoint's files must be inside its step "
        "directory: copy the file there",
        path, ResolvedPath(path), step_dir));
  }
  if (st.st_size != rec.bytes) {
    return DamagedRankFile(path,
                           absl::StrFormat("it has %d bytes, the manifest says %d (truncated or "
                                           "partly copied)",
                                           static_cast<int64_t>(st.st_size), rec.bytes));
  }
  // O_NONBLOCK and the fstat: a path swapped for a FIFO since the stat is
  // refused, not waited on.
  reader.fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (reader.fd_ < 0) {
    return absl::InternalError(
        absl::StrFormat("open %s: %s (errno %d)", path, std::strerror(errno), errno));
  }
  struct stat opened {};
  if (fstat(reader.fd_, &opened) != 0 || !S_ISREG(opened.st_mode) || opened.st_size != rec.bytes) {
    return DamagedRankFile(path, "it changed while it was opened");
  }
  std::string header(kHeaderBytes, '\0');
  ZS_RETURN_IF_ERROR(ReadAt(reader.fd_, 0, header.data(), header.size(), path));
  ZS_RETURN_IF_ERROR(CheckRankFileHeader(header, manifest, rank, path));
  std::string trailer(kTrailerBytes, '\0');
  ZS_RETURN_IF_ERROR(
      ReadAt(reader.fd_, rec.bytes - kTrailerBytes, trailer.data(), trailer.size(), path));
  ZS_RETURN_IF_ERROR(CheckRankFileTrailer(trailer, manifest, path));
  const int64_t entries = IndexEntries(manifest.shard_numel, manifest.chunk_elements);
  const int64_t index_offset = kHeaderBytes + DataBytes(manifest);
  reader.index_.resize(static_cast<size_t>(entries));
  ZS_RETURN_IF_ERROR(ReadAt(reader.fd_, index_offset, reader.index_.data(),
                            reader.index_.size() * sizeof(uint32_t), path));
  const uint32_t index_crc =
      kernels::Crc32c(reader.index_.data(), reader.index_.size() * sizeof(uint32_t));
  if (index_crc != rec.index_crc32c) {
    return DamagedRankFile(
        path,
        absl::StrFormat("crc mismatch in its chunk index (bytes [%d, %d)): expected "
                        "0x%08x, got 0x%08x",
                        index_offset, index_offset + entries * 4, rec.index_crc32c, index_crc));
  }
  return reader;
}

absl::Status RankFileReader::Read(int unit, int tensor, int64_t begin, int64_t end, float* out) {
  const std::vector<int64_t>& shard = manifest_->shard_numel;
  const int64_t chunk = manifest_->chunk_elements;
  const int64_t base = TensorOffset(shard, unit, tensor);
  const int64_t first = FirstChunk(shard, unit, tensor, chunk);
  for (int64_t c = begin / chunk; c * chunk < end; ++c) {
    const int64_t c_begin = c * chunk;
    const int64_t c_end = std::min(c_begin + chunk, shard[unit]);
    chunk_.resize(static_cast<size_t>(c_end - c_begin));
    const int64_t offset = base + c_begin * static_cast<int64_t>(sizeof(float));
    const size_t bytes = chunk_.size() * sizeof(float);
    ZS_RETURN_IF_ERROR(ReadAt(fd_, offset, chunk_.data(), bytes, path_));
    const uint32_t crc = kernels::Crc32c(chunk_.data(), bytes);
    const uint32_t expected = index_[static_cast<size_t>(first + c)];
    if (crc != expected) {
      return DamagedRankFile(
          path_, absl::StrFormat("crc mismatch in unit '%s' tensor %s, bytes [%d, %d): expected "
                                 "0x%08x, got 0x%08x",
                                 manifest_->model.units[unit].name, kTensorNames[tensor], offset,
                                 offset + static_cast<int64_t>(bytes), expected, crc));
    }
    const int64_t from = std::max(begin, c_begin);
    const int64_t to = std::min(end, c_end);
    std::memcpy(out + (from - begin), chunk_.data() + (from - c_begin),
                static_cast<size_t>(to - from) * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status RankFileReader::ReadUnit(int unit, std::vector<float> (&tensors)[kTensorsPerUnit]) {
  const int64_t n = manifest_->shard_numel[unit];
  uint32_t unit_crc = 0;
  for (int t = 0; t < kTensorsPerUnit; ++t) {
    tensors[t].resize(static_cast<size_t>(n));
    ZS_RETURN_IF_ERROR(Read(unit, t, 0, n, tensors[t].data()));
    unit_crc =
        kernels::Crc32cExtend(unit_crc, tensors[t].data(), tensors[t].size() * sizeof(float));
  }
  const uint32_t expected = manifest_->files[rank_].unit_crc32c[unit];
  if (unit_crc != expected) {
    // Every chunk matched its index entry, so the index and the manifest
    // disagree: one of them is not this file's.
    return DamagedRankFile(path_,
                           absl::StrFormat("crc mismatch in unit '%s': expected 0x%08x, got 0x%08x",
                                           manifest_->model.units[unit].name, expected, unit_crc));
  }
  return absl::OkStatus();
}

void VerifyRankFile(const std::string& step_dir, const Manifest& manifest, int rank,
                    std::vector<std::string>* problems) {
  const std::string path = JoinPath(step_dir, RankFileName(rank));
  const FileRecord& rec = manifest.files[rank];
  absl::StatusOr<RankFileReader> reader = RankFileReader::Open(step_dir, manifest, rank);
  if (!reader.ok()) {
    problems->push_back(std::string(reader.status().message()));
    return;
  }
  // Every chunk and every unit's checksum, then the whole file.
  const size_t problems_before = problems->size();
  std::vector<float> tensors[kTensorsPerUnit];
  for (size_t u = 0; u < manifest.model.units.size(); ++u) {
    absl::Status read = reader->ReadUnit(static_cast<int>(u), tensors);
    if (!read.ok()) problems->push_back(std::string(read.message()));
  }
  std::vector<char> block(kVerifyBlockBytes);
  uint32_t crc = 0;
  for (int64_t offset = 0; offset < rec.bytes;) {
    const size_t n = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(block.size()), rec.bytes - offset));
    absl::Status read = ReadAt(reader->fd(), offset, block.data(), n, path);
    if (!read.ok()) {
      problems->push_back(std::string(read.message()));
      return;
    }
    crc = kernels::Crc32cExtend(crc, block.data(), n);
    offset += static_cast<int64_t>(n);
  }
  // One line per problem: a damaged chunk already named changes the whole
  // file's CRC too; alone, this names damage outside the checked parts.
  if (crc != rec.crc32c && problems->size() == problems_before) {
    problems->push_back(absl::StrFormat(
        "%s: crc mismatch over the whole file (outside the chunks, header and trailer checked "
        "above): expected 0x%08x, got 0x%08x",
        path, rec.crc32c, crc));
  }
}

}  // namespace zeroshard::internal
