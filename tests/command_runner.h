// Runs a shell command line for the tests of the command-line tools and
// examples: its exit code, stdout and stderr apart, and its wall time.
#ifndef ZEROSHARD_TESTS_COMMAND_RUNNER_H_
#define ZEROSHARD_TESTS_COMMAND_RUNNER_H_

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace zeroshard::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the command could not run or did not exit
  std::string out;     // stdout
  std::string err;     // stderr
  double seconds = 0;
};

// A path in $TMPDIR (or /tmp) private to this process: "<dir>/zs_<pid>_<name>".
inline std::string TestTempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/zs_" + std::to_string(getpid()) + "_" +
         name;
}

// Runs `command_line` under /bin/sh; stderr goes through a file of this
// process's own, so tests running at once do not mix their output.
inline CommandResult RunCommand(const std::string& command_line) {
  const std::string err_path = TestTempPath("command_stderr.txt");
  const std::string command = command_line + " 2>" + err_path;
  CommandResult r;
  const auto begin = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::stringstream text;
  text << err.rdbuf();
  r.err = text.str();
  std::remove(err_path.c_str());
  return r;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_COMMAND_RUNNER_H_
