// What example programs and benchmarks share (examples/common): the
// command-line shape of mlp_demo and the runtime benchmarks:
// --name value or --name=value, plus --help / -h.
#ifndef ZEROSHARD_EXAMPLES_COMMON_FLAGS_H_
#define ZEROSHARD_EXAMPLES_COMMON_FLAGS_H_

#include <functional>
#include <set>
#include <string>

#include "absl/status/status.h"

namespace zeroshard {
namespace examples {

// Calls set(name, value) for each flag of argv[1..] in order (name without
// the dashes). On --help or -h sets *help and stops. InvalidArgument for an
// argument that is not a flag or a flag without a value; set's own error
// otherwise (it should name the flag).
// `switches` name flags that take no value (set() gets "true"; --name=value
// still passes a value).
absl::Status ForEachFlag(
    int argc, char** argv, bool* help,
    const std::function<absl::Status(const std::string& name, const std::string& value)>& set,
    const std::set<std::string>& switches = {});

}  // namespace examples
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_COMMON_FLAGS_H_
