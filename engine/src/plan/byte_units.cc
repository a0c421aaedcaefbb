#include "zeroshard/estimate/byte_units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace zeroshard {
namespace {

// Splits "80GiB" into 80 and "gib". False when there is no leading number.
bool SplitNumber(absl::string_view text, double* number, std::string* suffix) {
  const std::string s(absl::StripAsciiWhitespace(text));
  if (s.empty()) return false;
  const char* begin = s.c_str();
  char* end = nullptr;
  *number = std::strtod(begin, &end);
  if (end == begin) return false;
  *suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(absl::string_view(end)));
  return std::isfinite(*number);
}

constexpr double kMaxBytes = 4.611686018427388e18;  // 2^62

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text, absl::string_view what,
                                      int64_t min_bytes) {
  double number = 0;
  std::string suffix;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: '%s' %s; write a size such as 80GiB, 1TiB, 40GB or 512MiB%s", what,
                        text, why, min_bytes == 0 ? ", or 0" : ""));
  };
  if (!SplitNumber(text, &number, &suffix)) return bad("is not a number with a unit");
  double scale = 0;
  if (suffix.empty() || suffix == "b") {
    scale = 1;
  } else if (suffix == "k" || suffix == "kib") {
    scale = static_cast<double>(kKiB);
  } else if (suffix == "m" || suffix == "mib") {
    scale = static_cast<double>(kMiB);
  } else if (suffix == "g" || suffix == "gib") {
    scale = static_cast<double>(kGiB);
  } else if (suffix == "t" || suffix == "tib") {
    scale = static_cast<double>(kTiB);
  } else if (suffix == "kb") {
    scale = 1e3;
  } else if (suffix == "mb") {
    scale = 1e6;
  } else if (suffix == "gb") {
    scale = 1e9;
  } else if (suffix == "tb") {
    scale = 1e12;
  } else {
    return bad("has an unknown unit");
  }
  const double bytes = number * scale;
  if (!(bytes >= static_cast<double>(min_bytes))) {
    return bad(min_bytes == 1   ? "is not a positive size"
               : min_bytes == 0 ? "is negative"
                                : absl::StrFormat("is below %d bytes", min_bytes));
  }
  if (bytes > kMaxBytes) return bad("is more than 2^62 bytes");
  return static_cast<int64_t>(std::llround(bytes));
}

absl::StatusOr<int64_t> ParseCount(absl::string_view text, absl::string_view what) {
  double number = 0;
  std::string suffix;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: '%s' %s; write a positive count such as 7000000000, 7e9 or 7B", what, text, why));
  };
  if (!SplitNumber(text, &number, &suffix)) return bad("is not a number");
  double scale = 0;
  if (suffix.empty()) {
    scale = 1;
  } else if (suffix == "k") {
    scale = 1e3;
  } else if (suffix == "m") {
    scale = 1e6;
  } else if (suffix == "b" || suffix == "g") {
    scale = 1e9;
  } else if (suffix == "t") {
    scale = 1e12;
  } else {
    return bad("has an unknown suffix");
  }
  const double count = number * scale;
  if (!(count >= 1)) return bad("is not positive");
  if (count > kMaxBytes) return bad("is too large");
  if (std::abs(count - std::round(count)) > 1e-6 * count) return bad("is not a whole number");
  return static_cast<int64_t>(std::llround(count));
}

std::string FormatGiB(int64_t bytes) {
  return absl::StrFormat("%.1f", static_cast<double>(bytes) / static_cast<double>(kGiB));
}

std::string FormatNumber(double value) {
  if (!std::isfinite(value)) return absl::StrFormat("%g", value);
  // Whole numbers below 2^63 print exactly ("%.0f" of a double is exact).
  if (value == std::trunc(value) && std::abs(value) < 9223372036854775808.0) {
    return absl::StrFormat("%.0f", value);
  }
  for (int digits = 1; digits < 17; ++digits) {
    const std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

}  // namespace zeroshard
