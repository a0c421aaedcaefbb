// libFuzzer target: a rank file's 64 header bytes and 24 trailer bytes
// through CheckRankFileHeader and CheckRankFileTrailer
// (engine/src/checkpoint/format.h), the checks RankFileReader::Open makes
// for Load, inspect and export. The input chooses the checkpoint (world
// size, units, shard sizes, chunk elements, rank), then gives the header
// and trailer, either as raw bytes or, to reach near-valid files, as the
// bits to flip in the expected ones. Checked:
//  - the expected bytes are accepted;
//  - anything accepted is exactly the expected bytes (no field unchecked);
//  - a refusal is DataLoss with a short, printable message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/src/checkpoint/format.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace zi = zeroshard::internal;

// Reads the input front to back; past its end, zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::string Bytes(size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(Byte());
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void CheckRefusal(const absl::Status& status, const char* what) {
  ZS_FUZZ_CHECK(absl::IsDataLoss(status), what);
  const std::string message(status.message());
  ZS_FUZZ_CHECK(message.size() < 512, "a refusal's message is not short");
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    ZS_FUZZ_CHECK(byte >= 0x20 && byte < 0x7f, "a refusal's message holds an unprintable byte");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  zi::Manifest m;
  m.world_size = 1 + in.Byte() % 64;
  const int units = 1 + in.Byte() % 8;
  const int rank = in.Byte() % m.world_size;
  static constexpr int64_t kChunks[] = {zi::kChunkElements, 1, 128, 1000, 1 << 20};
  m.chunk_elements = kChunks[in.Byte() % 5];
  for (int u = 0; u < units; ++u) {
    const int64_t quanta = 1 + (in.Byte() | (in.Byte() << 8));
    m.shard_numel.push_back(128 * quanta);
    m.model.units.push_back({"unit" + std::to_string(u), {}});
  }
  const bool flip = in.Byte() & 1;
  const std::string expected_header =
      zi::RankFileHeader(rank, m.world_size, m.shard_numel, m.chunk_elements);
  const std::string expected_trailer = zi::RankFileTrailer(m.shard_numel, m.chunk_elements);
  std::string header = in.Bytes(zi::kHeaderBytes);
  std::string trailer = in.Bytes(zi::kTrailerBytes);
  if (flip) {
    for (size_t i = 0; i < header.size(); ++i) header[i] ^= expected_header[i];
    for (size_t i = 0; i < trailer.size(); ++i) trailer[i] ^= expected_trailer[i];
  }

  ZS_FUZZ_CHECK(zi::CheckRankFileHeader(expected_header, m, rank, "rank.bin").ok(),
                "the expected header is refused");
  ZS_FUZZ_CHECK(zi::CheckRankFileTrailer(expected_trailer, m, "rank.bin").ok(),
                "the expected trailer is refused");
  const absl::Status h = zi::CheckRankFileHeader(header, m, rank, "rank.bin");
  if (h.ok()) {
    ZS_FUZZ_CHECK(header == expected_header, "a header other than the expected one is accepted");
  } else {
    CheckRefusal(h, "a header refusal is not DataLoss");
  }
  const absl::Status t = zi::CheckRankFileTrailer(trailer, m, "rank.bin");
  if (t.ok()) {
    ZS_FUZZ_CHECK(trailer == expected_trailer, "a trailer other than the expected one is accepted");
  } else {
    CheckRefusal(t, "a trailer refusal is not DataLoss");
  }
  return 0;
}
