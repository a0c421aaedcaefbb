#include "examples/common/flags.h"

#include "absl/strings/str_cat.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace examples {

absl::Status ForEachFlag(
    int argc, char** argv, bool* help,
    const std::function<absl::Status(const std::string& name, const std::string& value)>& set,
    const std::set<std::string>& switches) {
  *help = false;
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
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (switches.count(arg) != 0) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", arg, " needs a value"));
    }
    ZS_RETURN_IF_ERROR(set(arg, value));
  }
  return absl::OkStatus();
}

}  // namespace examples
}  // namespace zeroshard
