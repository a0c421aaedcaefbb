// The command-line flags of the tools, the examples and the benchmarks: one
// parser, one set of value rules and one wording of their errors, so that
// `--steps 0` is refused the same way by mlp_demo, step_bench and
// `zeroshard estimate`. Not part of the installed library (cli/ is built for
// tools/, examples/ and perf/ only); it includes public headers only.
//
// Two levels:
//  - value rules, for a program that walks its own arguments:
//      ParseIntFlag      an integer in [lo, hi]
//                        "--tp: '5000' is not an integer in [1, 1024]"
//      ParseIntListFlag  a comma-separated list of such integers
//                        "--ranks: '0' in '1,0' is not an integer in [1, 64]"
//      ParseSizeFlag     a byte size ("16MiB", "1GB", "4096"), the estimator's
//                        rule (zeroshard/estimate/byte_units.h), in [min, max] bytes
//      ParseNumberFlag   a finite number in [lo, hi] (with its unit)
//      ParseChoiceFlag   one of a fixed set of words
//  - FlagSet, which walks argv (--name value, --name=value, switches,
//    --help / -h) and applies those rules to the flags it was given.
#ifndef ZEROSHARD_CLI_FLAGS_H_
#define ZEROSHARD_CLI_FLAGS_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard {
namespace cli {

// Largest bound a flag may give: "no upper bound" in the messages.
inline constexpr int64_t kNoUpperBound = std::numeric_limits<int64_t>::max();

// The upper bound of count flags (steps, ranks, a model's sizes) where the
// program has no tighter one: far above any sensible run, low enough that a
// product of two stays far inside int64_t.
inline constexpr int64_t kMaxCount = int64_t{1} << 30;

// `text` as a decimal integer in [lo, hi]. InvalidArgument otherwise:
// "<flag>: '<text>' is not an integer in [lo, hi]<note>" (with hi ==
// kNoUpperBound: "... is not an integer >= lo<note>"). `flag` is the name as
// the user wrote it ("--steps").
absl::StatusOr<int64_t> ParseIntFlag(absl::string_view flag, absl::string_view text, int64_t lo,
                                     int64_t hi, absl::string_view note = "");

// `text` as a comma-separated list of integers in [lo, hi] (at least one; no
// empty items). InvalidArgument naming the first bad item:
// "<flag>: '<item>' in '<text>' is not an integer in [lo, hi]".
absl::StatusOr<std::vector<int64_t>> ParseIntListFlag(absl::string_view flag,
                                                      absl::string_view text, int64_t lo,
                                                      int64_t hi);

// `text` as a byte size (ParseByteSize's rule: a number and an optional unit
// B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; "16M" = 16 MiB), in [min_bytes,
// max_bytes]. InvalidArgument naming the flag: ParseByteSize's message for
// what is not a size, "<flag>: '<text>' is <n> bytes, above the largest
// allowed, <max>" above max_bytes.
absl::StatusOr<int64_t> ParseSizeFlag(absl::string_view flag, absl::string_view text,
                                      int64_t min_bytes = 1, int64_t max_bytes = kNoUpperBound);

// `text` as a finite number in [lo, hi] (in (lo, hi] with lo_open), quoted
// as the user gave it when refused, with `unit` when one is given:
// "<flag>: '<text>' is outside [lo, hi] (<unit>); give a number in that
// range", or "... is not a number in [lo, hi] ...".
absl::StatusOr<double> ParseNumberFlag(absl::string_view flag, absl::string_view text, double lo,
                                       double hi, bool lo_open = false,
                                       absl::string_view unit = "");

// The index of `text` in `choices`. InvalidArgument otherwise:
// "<flag>: '<text>' is not a, b or c".
absl::StatusOr<int> ParseChoiceFlag(absl::string_view flag, absl::string_view text,
                                    const std::vector<std::string>& choices);

// The flags of a command that reads them by name after the walk (the
// `zeroshard` subcommands, where which flags are given together matters):
// each of `value_flags` takes a value (--name value or --name=value), each of
// `switch_flags` none (stored as "1"); names include their dashes ("--gpus",
// "-h"). A flag may be given once. InvalidArgument: "unknown argument 'x'; see
// `<help_command>`", "--x needs a value", "--x takes no value", "--x is given
// twice".
absl::StatusOr<std::map<std::string, std::string>> ParseFlagMap(
    const std::vector<std::string>& args, const std::set<std::string>& value_flags,
    const std::set<std::string>& switch_flags, absl::string_view help_command);

// The flags one program takes, each with its rule and where its value goes.
// Register them, then Parse(argc, argv): values are written in argument
// order (a flag given twice keeps the last value). Names are given without
// the dashes ("micro-batch"); messages name them with ("--micro-batch").
class FlagSet {
 public:
  // An integer in [lo, hi] into *out (any integer type wide enough for hi).
  template <typename T>
  FlagSet& Int(const std::string& name, T* out, int64_t lo, int64_t hi) {
    static_assert(std::is_integral_v<T>, "Int() writes an integer");
    return Add(name, [out, lo, hi, name](const std::string& value) -> absl::Status {
      absl::StatusOr<int64_t> v = ParseIntFlag(Dashed(name), value, lo, hi);
      if (!v.ok()) return v.status();
      *out = static_cast<T>(*v);
      return absl::OkStatus();
    });
  }

  // A comma-separated list of integers in [lo, hi]; replaces *out.
  template <typename T>
  FlagSet& IntList(const std::string& name, std::vector<T>* out, int64_t lo, int64_t hi) {
    static_assert(std::is_integral_v<T>, "IntList() writes integers");
    return Add(name, [out, lo, hi, name](const std::string& value) -> absl::Status {
      absl::StatusOr<std::vector<int64_t>> v = ParseIntListFlag(Dashed(name), value, lo, hi);
      if (!v.ok()) return v.status();
      out->assign(v->begin(), v->end());
      return absl::OkStatus();
    });
  }

  // A byte size in [min_bytes, max_bytes] ("16MiB", "4096").
  FlagSet& Size(const std::string& name, int64_t* out, int64_t min_bytes = 1,
                int64_t max_bytes = kNoUpperBound);
  // A finite number in [lo, hi] (in (lo, hi] with lo_open).
  FlagSet& Number(const std::string& name, double* out, double lo, double hi, bool lo_open = false);
  // Any non-empty text.
  FlagSet& String(const std::string& name, std::string* out);
  // One of `choices`; *out gets its index.
  FlagSet& Choice(const std::string& name, std::vector<std::string> choices, int* out);
  // A flag that takes no value: sets *out to true (--name=true and --name=1
  // are accepted too).
  FlagSet& Switch(const std::string& name, bool* out);
  // Anything else: `set` gets the value and returns its own error (it should
  // name the flag, as Dashed(name) does).
  FlagSet& Custom(const std::string& name, std::function<absl::Status(const std::string&)> set);

  // Walks argv[1..]: --name value or --name=value (a switch takes none),
  // --help or -h sets *help and stops. InvalidArgument for an argument that
  // is not a flag ("unexpected argument 'x'"), an unknown flag ("unknown flag
  // --x"), a flag without its value ("flag --x needs a value") or a value
  // its rule refuses (the rule's message).
  absl::Status Parse(int argc, char** argv, bool* help) const;

  // "--" + name.
  static std::string Dashed(absl::string_view name);

 private:
  FlagSet& Add(const std::string& name, std::function<absl::Status(const std::string&)> set);

  std::map<std::string, std::function<absl::Status(const std::string&)>> setters_;
  std::set<std::string> switches_;
  std::set<std::string> duplicates_;  // registered twice: Parse() refuses to run
};

}  // namespace cli
}  // namespace zeroshard

#endif  // ZEROSHARD_CLI_FLAGS_H_
