// libFuzzer target: bytes as the start of a safetensors file through
// SafetensorsHeaderSize and ParseSafetensorsHeader
// (engine/src/checkpoint/safetensors.h).
//
// The first input byte chooses how the rest is read:
//   even: the rest is the file itself (the 8-byte length prefix is fuzzed
//         too);
//   odd:  the rest is the header JSON, then a NUL, then the data; the target
//         writes the length prefix from the JSON's size, so that mutations
//         of the JSON are not all refused for a stale length.
// Besides "no crash, no sanitizer report, no hang, bounded memory" it checks
// the reader's contract on every accepted header: SafetensorsHeaderSize
// agrees, a head one byte short is refused, the tensors have known dtypes,
// unique non-empty names and shapes whose byte size (computed here in
// 128 bits) is their range, and the ranges tile the data in order; and the
// writer's: a header whose dimensions are all positive is written back by
// SafetensorsHeader, which the reader reads as the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/src/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using zeroshard::internal::ParseSafetensorsHeader;
using zeroshard::internal::SafetensorsEntry;
using zeroshard::internal::SafetensorsHeader;
using zeroshard::internal::SafetensorsHeaderSize;
using zeroshard::internal::SafetensorsIndex;
using zeroshard::internal::SafetensorsTensor;

std::string FileFromInput(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) return rest;
  const size_t nul = rest.find('\0');
  const std::string json = rest.substr(0, nul);
  std::string file(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i, n >>= 8) file[i] = static_cast<char>(n & 0xff);
  file += json;
  if (nul != std::string::npos) file += rest.substr(nul + 1);
  return file;
}

// The byte size of a tensor, or -1 when it is 2^63 or more.
int64_t BytesOf(const SafetensorsEntry& e) {
  __int128 bytes = e.dtype == "F32" ? 4 : 2;
  for (const int64_t d : e.shape) {
    if (d == 0) return 0;
  }
  for (const int64_t d : e.shape) {
    bytes *= d;  // each factor < 2^63 and bytes < 2^63 here: no overflow in 128 bits
    if (bytes > INT64_MAX) return -1;
  }
  return static_cast<int64_t>(bytes);
}

bool SameTensors(const SafetensorsIndex& a, const SafetensorsIndex& b) {
  if (a.tensors.size() != b.tensors.size() || a.metadata != b.metadata) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const SafetensorsEntry &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.begin != y.begin ||
        x.end != y.end) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = FileFromInput(data, size);
  const auto file_size = static_cast<int64_t>(file.size());
  const absl::StatusOr<int64_t> header_size = SafetensorsHeaderSize(file, file_size);
  const absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsHeader(file, file_size);
  ZS_FUZZ_CHECK(header_size.ok() || !index.ok(),
                "ParseSafetensorsHeader accepted a header whose length SafetensorsHeaderSize "
                "refuses");
  if (!index.ok()) return 0;
  ZS_FUZZ_CHECK(index->data_start == *header_size, "data_start is not 8 + N");
  ZS_FUZZ_CHECK(
      !ParseSafetensorsHeader(absl::string_view(file).substr(0, *header_size - 1), file_size).ok(),
      "a head one byte shorter than the header was accepted");

  int64_t covered = 0;
  bool all_positive = true;
  std::set<std::string> names;
  for (const SafetensorsEntry& e : index->tensors) {
    ZS_FUZZ_CHECK(e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16",
                  "an unknown dtype was accepted");
    ZS_FUZZ_CHECK(!e.name.empty() && e.name != "__metadata__" && names.insert(e.name).second,
                  "an empty, reserved or repeated name was accepted");
    ZS_FUZZ_CHECK(e.begin == covered, "the ranges do not tile the data in order");
    ZS_FUZZ_CHECK(BytesOf(e) == e.end - e.begin, "a shape's byte size differs from its range");
    covered = e.end;
    for (const int64_t d : e.shape) all_positive = all_positive && d > 0;
  }
  ZS_FUZZ_CHECK(covered == file_size - index->data_start, "the tensors do not cover the data");

  // Written back, the same header (SafetensorsHeader refuses 0 dimensions).
  if (!all_positive) return 0;
  std::vector<SafetensorsTensor> tensors;
  for (const SafetensorsEntry& e : index->tensors) tensors.push_back({e.name, e.dtype, e.shape});
  const absl::StatusOr<std::string> header = SafetensorsHeader(tensors, index->metadata);
  ZS_FUZZ_CHECK(header.ok(), "SafetensorsHeader refuses tensors the reader accepted");
  ZS_FUZZ_CHECK(header->size() % 8 == 0, "the data written is not 8-byte aligned");
  const absl::StatusOr<SafetensorsIndex> again =
      ParseSafetensorsHeader(*header, static_cast<int64_t>(header->size()) + covered);
  ZS_FUZZ_CHECK(again.ok() && SameTensors(*index, *again),
                "the header written back does not read as the same tensors");
  return 0;
}
