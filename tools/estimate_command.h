// `zeroshard estimate`: memory plan and automatic ZeRO / offload / tp x pp
// choice for a model on a cluster (docs/estimator.md).
#ifndef ZEROSHARD_TOOLS_ESTIMATE_COMMAND_H_
#define ZEROSHARD_TOOLS_ESTIMATE_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/estimate/planner.h"

namespace zeroshard::tools {

// Exit codes of every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitNoFit = 1;     // valid input, but no configuration fits
inline constexpr int kExitBadInput = 2;  // usage error or unreadable input; one line on `err`

// Runs `zeroshard estimate` with the arguments after the subcommand name.
// Writes the report to `out`, errors (one line) to `err`; returns the exit
// code.
int RunEstimate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The usage text of `zeroshard estimate --help`.
std::string EstimateUsage();

}  // namespace zeroshard::tools

#endif  // ZEROSHARD_TOOLS_ESTIMATE_COMMAND_H_
