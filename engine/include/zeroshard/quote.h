// QuoteForMessage: how zeroshard quotes text it did not write (a file's
// field, a flag's value, a checkpoint's bytes) in an error message. Public
// so that programs on the library (the command line's machine-profile
// reader) write such messages the same way.
#ifndef ZEROSHARD_QUOTE_H_
#define ZEROSHARD_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace zeroshard {

// `text` for an error message, in single quotes: at most `max_chars`
// characters, control and non-ASCII bytes escaped (\n, \x01), and, when it
// was cut, "..." and the full length appended ("'{\"schema\": 1'... (4096
// bytes)"). Untrusted input never makes a message long or unprintable.
// Defined in the engine's zs_common library.
std::string QuoteForMessage(absl::string_view text, size_t max_chars = 64);

}  // namespace zeroshard

#endif  // ZEROSHARD_QUOTE_H_
