// CommOptions: the collective timeout, from the caller or the environment.
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "zeroshard/communicator.h"

namespace zeroshard {

absl::StatusOr<absl::Duration> ResolveCommTimeout(const CommOptions& options) {
  if (options.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("communicator timeout %s is negative; give a positive duration, or zero "
                        "for $%s (default %s)",
                        absl::FormatDuration(options.timeout), kCommTimeoutEnvVar,
                        absl::FormatDuration(kDefaultCommTimeout)));
  }
  if (options.timeout > absl::ZeroDuration()) return options.timeout;
  const char* env = std::getenv(kCommTimeoutEnvVar);
  if (env == nullptr || *env == '\0') return kDefaultCommTimeout;
  const std::string text(absl::StripAsciiWhitespace(env));
  absl::Duration timeout;
  double seconds = 0;
  // A bare number is seconds; otherwise a duration with its unit ("90s").
  bool parsed = false;
  if (absl::SimpleAtod(text, &seconds)) {
    parsed = std::isfinite(seconds) && seconds < 1e9;
    if (parsed) timeout = absl::Seconds(seconds);
  } else {
    parsed = absl::ParseDuration(text, &timeout);
  }
  if (!parsed || !(timeout > absl::ZeroDuration()) || timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "environment variable %s='%s' is not a positive timeout; write seconds (\"30\", \"2.5\") "
        "or a duration (\"90s\", \"2m\"), or unset it for the default %s",
        kCommTimeoutEnvVar, env, absl::FormatDuration(kDefaultCommTimeout)));
  }
  return timeout;
}

}  // namespace zeroshard
