#include "zeroshard/estimate/fine_tuning.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zeroshard {
namespace {

// Glob match of the whole `text`: `*` any run (dots too), `?` one character.
// Linear backtracking to the last star: O(|pattern| x |text|) at worst.
bool GlobMatches(absl::string_view pattern, absl::string_view text) {
  size_t p = 0, t = 0;
  size_t star = absl::string_view::npos, star_text = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_text = t;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      t = ++star_text;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

bool FreezePatternMatches(absl::string_view pattern, absl::string_view unit,
                          absl::string_view name) {
  const std::string full = absl::StrCat(unit, ".", name);
  return GlobMatches(pattern, full) || GlobMatches(absl::StrCat(pattern, ".*"), full);
}

absl::Status FreezeParams(ModelSpec& spec, absl::string_view pattern) {
  // The owners whose tensor a matched param holds: a tie is one tensor, so
  // its owner and every alias are frozen together.
  std::map<std::pair<std::string, std::string>, bool> owners_to_freeze;
  int64_t matched = 0;
  for (UnitSpec& unit : spec.units) {
    for (ParamSpec& p : unit.params) {
      if (!FreezePatternMatches(pattern, unit.name, p.name)) continue;
      ++matched;
      p.trainable = false;
      if (p.tied_to.has_value()) {
        owners_to_freeze[{p.tied_to->unit, p.tied_to->param}] = true;
      } else {
        owners_to_freeze[{unit.name, p.name}] = true;
      }
    }
  }
  if (matched == 0) {
    std::string example = "(the model has no params)";
    if (!spec.units.empty() && !spec.units[0].params.empty()) {
      example = absl::StrCat("e.g. '", spec.units[0].name, ".", spec.units[0].params[0].name, "'");
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "freeze pattern '%s' matches no param; a pattern is a glob (* any run, ? one character) "
        "over unit.param names, %s, and matches what it names and everything below it",
        pattern, example));
  }
  for (UnitSpec& unit : spec.units) {
    for (ParamSpec& p : unit.params) {
      const std::pair<std::string, std::string> owner =
          p.tied_to.has_value() ? std::make_pair(p.tied_to->unit, p.tied_to->param)
                                : std::make_pair(unit.name, p.name);
      if (owners_to_freeze.count(owner) != 0) p.trainable = false;
    }
  }
  return absl::OkStatus();
}

ParamCounts CountParams(const ModelSpec& spec) {
  ParamCounts counts;
  for (const UnitSpec& unit : spec.units) {
    for (const ParamSpec& p : unit.params) {
      if (p.tied_to.has_value()) continue;
      (p.trainable ? counts.trainable : counts.frozen) += p.NumElements();
    }
  }
  return counts;
}

}  // namespace zeroshard
