#include "cli/flags.h"

#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "zeroshard/estimate/byte_units.h"

namespace zeroshard {
namespace cli {
namespace {

std::string IntRange(int64_t lo, int64_t hi) {
  return hi == kNoUpperBound ? absl::StrCat(">= ", lo) : absl::StrCat("in [", lo, ", ", hi, "]");
}

}  // namespace

absl::StatusOr<int64_t> ParseIntFlag(absl::string_view flag, absl::string_view text, int64_t lo,
                                     int64_t hi, absl::string_view note) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", text, "' is not an integer ", IntRange(lo, hi), note));
  }
  return v;
}

absl::StatusOr<std::vector<int64_t>> ParseIntListFlag(absl::string_view flag,
                                                      absl::string_view text, int64_t lo,
                                                      int64_t hi) {
  std::vector<int64_t> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", item, "' in '", text,
                                                     "' is not an integer ", IntRange(lo, hi),
                                                     "; give a comma-separated list"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<int64_t> ParseSizeFlag(absl::string_view flag, absl::string_view text,
                                      int64_t min_bytes, int64_t max_bytes) {
  absl::StatusOr<int64_t> bytes = ParseByteSize(text, flag, min_bytes);
  if (!bytes.ok()) return bytes.status();
  if (*bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", text, "' is ", *bytes,
                                                   " bytes, above the largest allowed, ", max_bytes,
                                                   " (", FormatGiB(max_bytes), " GiB)"));
  }
  return bytes;
}

absl::StatusOr<double> ParseNumberFlag(absl::string_view flag, absl::string_view text, double lo,
                                       double hi, bool lo_open, absl::string_view unit) {
  double v = 0;
  const bool number = absl::SimpleAtod(text, &v) && std::isfinite(v);
  if (!number || v < lo || (lo_open && v == lo) || v > hi) {
    // The value as given: "1000001", not the "1e+06" of a formatted double.
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", text, "' is ", number ? "outside " : "not a number in ", lo_open ? "(" : "[",
        FormatNumber(lo), ", ", FormatNumber(hi), "]", unit.empty() ? "" : " (", unit,
        unit.empty() ? "" : ")", "; give a number in that range"));
  }
  return v;
}

absl::StatusOr<int> ParseChoiceFlag(absl::string_view flag, absl::string_view text,
                                    const std::vector<std::string>& choices) {
  for (size_t i = 0; i < choices.size(); ++i) {
    if (text == choices[i]) return static_cast<int>(i);
  }
  // "a or b", "a, b or c": as the tools have always said it.
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) {
    absl::StrAppend(&list, i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ", choices[i]);
  }
  return absl::InvalidArgumentError(absl::StrCat(flag, ": '", text, "' is not ", list));
}

absl::StatusOr<std::map<std::string, std::string>> ParseFlagMap(
    const std::vector<std::string>& args, const std::set<std::string>& value_flags,
    const std::set<std::string>& switch_flags, absl::string_view help_command) {
  std::map<std::string, std::string> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> value;
    const size_t eq = name.find('=');
    if (name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (switch_flags.count(name) != 0) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " takes no value"));
      }
      value = "1";
    } else if (value_flags.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", args[i], "'; see `", help_command, "`"));
    } else if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
      }
      value = args[++i];
    }
    if (!flags.emplace(name, *value).second) {
      return absl::InvalidArgumentError(absl::StrCat(name, " is given twice"));
    }
  }
  return flags;
}

std::string FlagSet::Dashed(absl::string_view name) { return absl::StrCat("--", name); }

FlagSet& FlagSet::Add(const std::string& name,
                      std::function<absl::Status(const std::string&)> set) {
  if (!setters_.emplace(name, std::move(set)).second) duplicates_.insert(name);
  return *this;
}

FlagSet& FlagSet::Size(const std::string& name, int64_t* out, int64_t min_bytes,
                       int64_t max_bytes) {
  return Add(name, [out, min_bytes, max_bytes, name](const std::string& value) -> absl::Status {
    absl::StatusOr<int64_t> v = ParseSizeFlag(Dashed(name), value, min_bytes, max_bytes);
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::Number(const std::string& name, double* out, double lo, double hi, bool lo_open) {
  return Add(name, [out, lo, hi, lo_open, name](const std::string& value) -> absl::Status {
    absl::StatusOr<double> v = ParseNumberFlag(Dashed(name), value, lo, hi, lo_open);
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::String(const std::string& name, std::string* out) {
  return Add(name, [out, name](const std::string& value) -> absl::Status {
    if (value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(Dashed(name), ": the value is empty"));
    }
    *out = value;
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::Choice(const std::string& name, std::vector<std::string> choices, int* out) {
  return Add(name, [out, name, choices = std::move(choices)](const std::string& value) {
    absl::StatusOr<int> v = ParseChoiceFlag(Dashed(name), value, choices);
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::Switch(const std::string& name, bool* out) {
  switches_.insert(name);
  return Add(name, [out, name](const std::string& value) -> absl::Status {
    if (value != "true" && value != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat(Dashed(name), ": '", value, "' given to a switch, which takes no value"));
    }
    *out = true;
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::Custom(const std::string& name,
                         std::function<absl::Status(const std::string&)> set) {
  return Add(name, std::move(set));
}

absl::Status FlagSet::Parse(int argc, char** argv, bool* help) const {
  *help = false;
  if (!duplicates_.empty()) {
    return absl::InternalError(
        absl::StrCat("flag ", Dashed(*duplicates_.begin()), " is registered twice"));
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return absl::OkStatus();
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    arg = arg.substr(2);
    std::string value;
    const size_t eq = arg.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const auto it = setters_.find(arg);
    if (it == setters_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", Dashed(arg)));
    }
    if (!inline_value) {
      if (switches_.count(arg) != 0) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag ", Dashed(arg), " needs a value"));
      }
    }
    if (absl::Status s = it->second(value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace cli
}  // namespace zeroshard
