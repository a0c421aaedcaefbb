// libFuzzer target: bytes as the argument list of `zeroshard estimate`
// through tools::RunEstimate (tools/estimate_command.h), which parses the
// flags, reads the model and runs the planner. Arguments are separated by
// newlines or NULs (the seed corpus has one argument per line; paths are
// relative to the repository root, where the fuzzer runs). Output goes to
// streams that discard it; `--svg FILE` and `--svg=FILE` are removed first,
// since they would write files. Besides "no crash, no sanitizer report, no
// hang, bounded memory" it checks that the exit code is a documented one.
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <streambuf>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "tools/estimate_command.h"

namespace {

// Accepts and drops every character, so the report is formatted but not kept.
class DiscardBuffer : public std::streambuf {
 protected:
  int_type overflow(int_type c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// Each newline or NUL ends an argument; text after the last one is the last
// argument when not empty. Empty lines are empty arguments.
std::vector<std::string> SplitArguments(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\n' || c == '\0') {
      args.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) args.push_back(std::move(current));
  return args;
}

// The estimate parser reads `--svg` and the next argument, or `--svg=FILE`, as
// the SVG output path; drop exactly those so no input writes a file.
std::vector<std::string> WithoutSvgOutput(const std::vector<std::string>& args) {
  std::vector<std::string> kept;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--svg") {
      ++i;
      continue;
    }
    if (args[i].rfind("--svg=", 0) == 0) continue;
    kept.push_back(args[i]);
  }
  return kept;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> args = WithoutSvgOutput(SplitArguments(data, size));
  DiscardBuffer discard;
  std::ostream out(&discard);
  std::ostream err(&discard);
  const int code = zeroshard::tools::RunEstimate(args, out, err);
  ZS_FUZZ_CHECK(code == zeroshard::tools::kExitOk || code == zeroshard::tools::kExitNoFit ||
                    code == zeroshard::tools::kExitBadInput,
                "RunEstimate returned an undocumented exit code");
  return 0;
}
