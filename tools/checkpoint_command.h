// `zeroshard inspect` and `zeroshard export`: a checkpoint read without an
// engine (docs/checkpoint.md).
#ifndef ZEROSHARD_TOOLS_CHECKPOINT_COMMAND_H_
#define ZEROSHARD_TOOLS_CHECKPOINT_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

namespace zeroshard::tools {

// `zeroshard inspect DIR`: verifies every checksum and prints the step,
// world size, stage, precision, params, bytes per rank and the trainer
// state. Exit 0 when sound; 1 with one line per problem on `err`; 2 for bad
// usage or an unreadable manifest.
int RunInspect(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// `zeroshard export DIR --out FILE [--dtype fp32|bf16]`: the consolidated
// weights as a safetensors file, streamed unit by unit. Exit 0, or 2 with
// one line on `err`.
int RunExport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace zeroshard::tools

#endif  // ZEROSHARD_TOOLS_CHECKPOINT_COMMAND_H_
