// The `zeroshard` command line: dispatches to subcommands.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/output_file.h"
#include "tools/checkpoint_command.h"
#include "tools/estimate_command.h"

namespace {

const char kUsage[] =
    "usage: zeroshard <command> [options]\n"
    "\n"
    "commands:\n"
    "  estimate   per-GPU memory plan and automatic ZeRO / offload / tp x pp choice;\n"
    "             with --machine, the calibrated step time of an engine run\n"
    "  calibrate  measure this machine (sgemm, element-wise, optimizer, collectives)\n"
    "             and write a machine profile for `estimate --machine`\n"
    "  inspect    verify a checkpoint's checksums and print what it holds\n"
    "  export     write a checkpoint's weights as a safetensors file\n"
    "\n"
    "`zeroshard <command> --help` describes a command.\n";

// `zeroshard calibrate` is the binary zeroshard-calibrate beside this one:
// it links BLAS, the engine and MPI, which `zeroshard estimate` must not
// need. Replaces this process (so that under mpirun each rank is it).
int ExecCalibrate(char** argv) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = '\0';
    dir = self;
    dir = dir.substr(0, dir.rfind('/'));
  }
  const std::string path = dir + "/zeroshard-calibrate";
  argv[1] = const_cast<char*>(path.c_str());
  execv(path.c_str(), argv + 1);
  std::cerr << "zeroshard calibrate: cannot run " << path << ": " << std::strerror(errno)
            << "; build it (cmake --build BUILD --target zeroshard_calibrate; it needs BLAS)\n";
  return zeroshard::tools::kExitBadInput;
}

// `code`, unless what went to stdout did not all arrive (a full disk, a
// closed pipe): then 1, with the error on stderr (`zeroshard estimate --json
// > /dev/full` is not a silent success).
int CheckedStandardOutput(int code) {
  const absl::Status out = zeroshard::cli::FlushStandardOutput();
  if (out.ok()) return code;
  std::cerr << "zeroshard: " << out.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return zeroshard::tools::kExitBadInput;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return zeroshard::tools::kExitOk;
  }
  if (args[0] == "estimate") {
    const int code = zeroshard::tools::RunEstimate(
        std::vector<std::string>(args.begin() + 1, args.end()), std::cout, std::cerr);
    std::exit(CheckedStandardOutput(code));
  }
  if (args[0] == "calibrate") return ExecCalibrate(argv);
  if (args[0] == "inspect" || args[0] == "export") {
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    const int code = args[0] == "inspect" ? zeroshard::tools::RunInspect(rest, std::cout, std::cerr)
                                          : zeroshard::tools::RunExport(rest, std::cout, std::cerr);
    std::exit(CheckedStandardOutput(code));
  }
  std::cerr << "zeroshard: unknown command '" << args[0] << "'; see `zeroshard --help`\n";
  return zeroshard::tools::kExitBadInput;
}
