// The memory this machine offers a run, and the one refusal of a run whose
// estimate does not fit it: mlp_demo and gpt_train check their flags'
// sizes against it before they allocate anything.
#ifndef ZEROSHARD_EXAMPLES_COMMON_MACHINE_MEMORY_H_
#define ZEROSHARD_EXAMPLES_COMMON_MACHINE_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace zeroshard {
namespace examples {

struct MachineMemory {
  int64_t bytes = 0;   // what a run may take
  std::string source;  // where the figure comes from, for messages
};

// MemAvailable from /proc/meminfo (what can be allocated now without
// swapping), else the physical memory (sysconf(_SC_PHYS_PAGES) x the page
// size); bytes 0 when neither can be read.
MachineMemory ReadMachineMemory();

// OK when `estimate_bytes` (double: a configuration past 2^63 bytes is still
// a number) is at most machine.bytes, or machine.bytes is 0 (unknown).
// Otherwise ResourceExhausted, one line: "the run needs about
// <estimate> (<breakdown>) but this machine has <bytes> (<source>); lower
// <what_to_lower>".
absl::Status CheckFitsMachine(double estimate_bytes, const std::string& breakdown,
                              const MachineMemory& machine, const std::string& what_to_lower);

// "7.4 GiB": `bytes` in the largest binary unit that leaves at least 1
// (bytes past 2^63 included).
std::string FormatBytes(double bytes);

}  // namespace examples
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_COMMON_MACHINE_MEMORY_H_
