// Writing and reading the header of a safetensors file (Hugging Face's format,
// https://huggingface.co/docs/safetensors), which checkpoints use so that any
// safetensors reader (Python, Rust, the Hub) can open them.
//
// A file is: an 8-byte little-endian unsigned header length N; N bytes of
// UTF-8 JSON
//   {"__metadata__": {"key": "value", ...},
//    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
// padded with spaces; then the tensors' bytes, back to back, row-major, little
// endian. Offsets are relative to the start of the data (byte 8 + N); the
// ranges must tile [0, data bytes) exactly, in any order in the JSON.
//
// Only the header is handled here: callers write or read the data.
#ifndef ZEROSHARD_CHECKPOINT_SAFETENSORS_H_
#define ZEROSHARD_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard::internal {

// The largest header either function accepts, as in the reference (Rust)
// implementation: 100 MB, so a corrupt length cannot make a reader allocate
// the whole file.
inline constexpr int64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor to write. dtype is "F32", "BF16" or "F16" (the dtypes zeroshard
// stores); an empty shape is a scalar (one element).
struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// The file's header (length prefix + padded JSON) for `tensors` stored back to
// back in the given order; the data follows it. The returned string's size is
// a multiple of 8, so the data starts 8-byte aligned; the JSON lists
// "__metadata__" first (left out when `metadata` is empty), then the tensors
// in the given order.
// InvalidArgument for an empty or duplicate name, the name "__metadata__", a
// name or metadata string that is not valid UTF-8, an unknown dtype, a
// non-positive dimension, sizes past 2^63 - 1 bytes, or a header past
// kSafetensorsMaxHeaderBytes. Whatever it returns, ParseSafetensorsHeader
// reads back into the same tensors and metadata (it is checked before return).
absl::StatusOr<std::string> SafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata);

// One tensor as the header describes it: its bytes are [begin, end) relative
// to SafetensorsIndex::data_start.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = 0;
};

// A parsed header. data_start is 8 + N (the file offset of the data); tensors
// are sorted by begin, i.e. in the order of their data in the file (ties,
// which only zero-sized tensors can have, by name).
struct SafetensorsIndex {
  int64_t data_start = 0;
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// How many bytes from the start of a file of `file_size` bytes hold its
// header, 8 + N, read from `prefix` (at least the file's first 8 bytes): read
// that many, then call ParseSafetensorsHeader. `source` (the file's path) is
// named in errors. InvalidArgument when the prefix is shorter than 8 bytes, N
// is past the end of the file or past kSafetensorsMaxHeaderBytes.
absl::StatusOr<int64_t> SafetensorsHeaderSize(absl::string_view prefix, int64_t file_size,
                                              absl::string_view source = "safetensors file");

// Parses and validates a safetensors file's header: `head` holds at least the
// first 8 + N bytes of a file of `file_size` bytes (SafetensorsHeaderSize says
// how many; more are ignored). Refuses with InvalidArgument naming `source`
// and the field: a head shorter than 8 + N, a header length past the file,
// JSON that is malformed, not an object or does not start with '{', a
// duplicate key, a missing, unknown or mistyped field, an empty tensor name,
// an unknown dtype, a negative dimension, a shape whose byte size does not
// match data_offsets, overlapping or out-of-file ranges, data that does not
// cover [0, file_size - 8 - N) exactly. Dimensions of 0 are accepted (other
// writers produce empty tensors; SafetensorsHeader does not).
absl::StatusOr<SafetensorsIndex> ParseSafetensorsHeader(
    absl::string_view head, int64_t file_size, absl::string_view source = "safetensors file");

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_CHECKPOINT_SAFETENSORS_H_
