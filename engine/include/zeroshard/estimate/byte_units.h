// Byte sizes as people write them ("80GiB", "1TiB", "40GB", "512MiB") and as
// the estimator prints them. GiB = 2^30 bytes; GB = 10^9 bytes (the ZeRO
// paper's unit).
#ifndef ZEROSHARD_ESTIMATE_BYTE_UNITS_H_
#define ZEROSHARD_ESTIMATE_BYTE_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;
inline constexpr int64_t kTiB = int64_t{1} << 40;

// Parses a byte count: a decimal number followed by B, KiB, MiB, GiB, TiB
// (powers of 2), KB, MB, GB, TB (powers of 10), or no suffix (bytes).
// Case-insensitive; "80G" means 80 GiB. InvalidArgument, naming `what`
// (e.g. "--gpu-mem"), for anything else, for sizes below `min_bytes` (1:
// a positive size; 0 where zero is allowed, as --reserve) and for sizes
// above 2^62 bytes.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text, absl::string_view what,
                                      int64_t min_bytes = 1);

// Parses a positive count such as "7.5e9", "7500000000", "7.5B", "175B",
// "350M" (K, M, B/G, T as powers of 10). The result must be an integer.
absl::StatusOr<int64_t> ParseCount(absl::string_view text, absl::string_view what);

// bytes / 2^30 with one decimal, e.g. "94.1".
std::string FormatGiB(int64_t bytes);

// A number for a message, as a person would write it: whole numbers below
// 2^63 in full ("1000000", "1000001"), others in the fewest significant
// digits that read back as the same double ("0.001", "1.7e+308"); "inf" and
// "nan" as such. Never "1e+06" for a range bound or a value next to it.
std::string FormatNumber(double value);

}  // namespace zeroshard

#endif  // ZEROSHARD_ESTIMATE_BYTE_UNITS_H_
