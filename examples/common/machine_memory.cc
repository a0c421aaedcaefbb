#include "examples/common/machine_memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"

namespace zeroshard {
namespace examples {

MachineMemory ReadMachineMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key, unit;
    long long kib = 0;
    if (fields >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB" && kib > 0) {
      return {static_cast<int64_t>(kib) * 1024, "MemAvailable in /proc/meminfo"};
    }
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0) {
    return {static_cast<int64_t>(pages) * page_size, "physical memory, sysconf(_SC_PHYS_PAGES)"};
  }
  return {0, "unknown"};
}

std::string FormatBytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit + 1 < static_cast<int>(sizeof(kUnits) / sizeof(kUnits[0]))) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

absl::Status CheckFitsMachine(double estimate_bytes, const std::string& breakdown,
                              const MachineMemory& machine, const std::string& what_to_lower) {
  if (machine.bytes <= 0 || estimate_bytes <= static_cast<double>(machine.bytes)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the run needs about %s (%s) but this machine has %s (%s); lower %s",
      FormatBytes(estimate_bytes), breakdown, FormatBytes(static_cast<double>(machine.bytes)),
      machine.source, what_to_lower));
}

}  // namespace examples
}  // namespace zeroshard
