#include "zeroshard/quote.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace zeroshard {

std::string QuoteForMessage(absl::string_view text, size_t max_chars) {
  const absl::string_view head = text.substr(0, max_chars);
  std::string quoted = absl::StrCat("'", absl::CHexEscape(head), "'");
  if (head.size() < text.size()) {
    absl::StrAppend(&quoted, "... (", text.size(), " bytes)");
  }
  return quoted;
}

}  // namespace zeroshard
