// CommOptions: the collective timeout, from the caller or the environment.
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

// "[0.1 s, 1000000 s]": seconds, as the flag and the variable take them.
std::string RangeText() {
  return absl::StrFormat("[%g s, %.0f s]", absl::ToDoubleSeconds(kMinCommTimeout),
                         absl::ToDoubleSeconds(kMaxCommTimeout));
}

// A timeout in range, or why not; `value` says it as the caller gave it.
absl::Status CheckRange(absl::Duration timeout, const std::string& value) {
  if (timeout < kMinCommTimeout) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is shorter than the least collective timeout %s: a healthy collective on a loaded "
        "machine can wait that long for a peer the scheduler has not run; give a timeout in %s",
        value, absl::FormatDuration(kMinCommTimeout), RangeText()));
  }
  if (timeout > kMaxCommTimeout) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is longer than the largest collective timeout %.0f s (11.6 days); give a timeout in "
        "%s",
        value, absl::ToDoubleSeconds(kMaxCommTimeout), RangeText()));
  }
  return absl::OkStatus();
}

}  // namespace

const char* CollectiveTopologyName(CollectiveTopology topology) {
  switch (topology) {
    case CollectiveTopology::kAuto:
      return "auto";
    case CollectiveTopology::kFlat:
      return "flat";
    case CollectiveTopology::kHierarchical:
      return "hierarchical";
  }
  return "unknown";
}

absl::StatusOr<absl::Duration> ParseCommTimeout(absl::string_view text, absl::string_view what) {
  const std::string stripped(absl::StripAsciiWhitespace(text));
  const std::string value = absl::StrFormat("%s '%s'", what, text);
  absl::Duration timeout;
  double seconds = 0;
  // A bare number is seconds; otherwise a duration with its unit ("90s").
  bool parsed = false;
  if (absl::SimpleAtod(stripped, &seconds)) {
    // NaN and inf are not timeouts; a finite number too large for a
    // Duration is "too long" below, not a parse error.
    parsed = std::isfinite(seconds);
    if (parsed) {
      timeout = seconds > absl::ToDoubleSeconds(kMaxCommTimeout) ? absl::InfiniteDuration()
                                                                 : absl::Seconds(seconds);
    }
  } else {
    parsed = absl::ParseDuration(stripped, &timeout);
  }
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not a timeout; write seconds (\"30\", \"2.5\") or a duration (\"90s\", \"2m\") in "
        "%s",
        value, RangeText()));
  }
  ZS_RETURN_IF_ERROR(CheckRange(timeout, value));
  return timeout;
}

absl::StatusOr<absl::Duration> ResolveCommTimeout(const CommOptions& options) {
  if (options.timeout != absl::ZeroDuration()) {
    ZS_RETURN_IF_ERROR(CheckRange(
        options.timeout,
        absl::StrFormat("CommOptions::timeout %s", absl::FormatDuration(options.timeout))));
    return options.timeout;
  }
  const char* env = std::getenv(kCommTimeoutEnvVar);
  if (env == nullptr || *env == '\0') return kDefaultCommTimeout;
  absl::StatusOr<absl::Duration> timeout =
      ParseCommTimeout(env, absl::StrCat("environment variable ", kCommTimeoutEnvVar));
  if (!timeout.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s, or unset it for the default %s",
                                                      timeout.status().message(),
                                                      absl::FormatDuration(kDefaultCommTimeout)));
  }
  return timeout;
}

}  // namespace zeroshard
