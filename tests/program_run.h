// Runs a built program for the tests of the command-line tools and examples
// as a user would, but watched: no shell (fork and execv, so that wait4's
// ru_maxrss is the program's own peak), stdin from /dev/null, stdout to
// /dev/null, stderr kept, and a guard that kills the program once it runs
// past a time limit or its resident set grows past a memory limit, so that
// a program that blocks (on a FIFO) or reads without end (/dev/zero) fails
// its test quickly instead of hanging it or eating the machine's memory.
#ifndef ZEROSHARD_TESTS_PROGRAM_RUN_H_
#define ZEROSHARD_TESTS_PROGRAM_RUN_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/command_runner.h"

namespace zeroshard::testing {

struct ProgramRun {
  int exit_code = -1;  // -1 when the program did not exit (killed, or could not start)
  std::string err;     // its stderr
  double seconds = 0;
  int64_t max_rss_kib = 0;  // the program's peak resident set (wait4)
  // Why the guard killed it ("ran past 5 s", "resident set past ... KiB"),
  // empty when it ended on its own.
  std::string killed;
};

struct ProgramLimits {
  double kill_after_seconds = 300;
  int64_t kill_above_rss_kib = 0;  // 0: no memory limit
};

// The resident set of a running process in KiB (/proc/<pid>/statm), 0 when
// it cannot be read.
inline int64_t ResidentKib(pid_t pid) {
  std::ifstream statm("/proc/" + std::to_string(pid) + "/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * (sysconf(_SC_PAGESIZE) / 1024);
}

// Runs `args` (args[0] the program's path) under `limits`.
inline ProgramRun RunProgram(const std::vector<std::string>& args, ProgramLimits limits = {}) {
  const std::string err_path = TestTempPath("program_stderr.txt");
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ProgramRun r;
  const auto begin = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    const int in = open("/dev/null", O_RDONLY);
    const int out = open("/dev/null", O_WRONLY);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (pid > 0) {
    while (true) {
      const pid_t done = wait4(pid, &status, WNOHANG, &usage);
      if (done == pid || done < 0) break;
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      const int64_t rss = ResidentKib(pid);
      if (elapsed > limits.kill_after_seconds) {
        r.killed = "ran past " + std::to_string(limits.kill_after_seconds) + " s";
      } else if (limits.kill_above_rss_kib > 0 && rss > limits.kill_above_rss_kib) {
        r.killed = "resident set " + std::to_string(rss) + " KiB, past " +
                   std::to_string(limits.kill_above_rss_kib) + " KiB";
      }
      if (!r.killed.empty()) {
        kill(pid, SIGKILL);
        wait4(pid, &status, 0, &usage);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    r.exit_code = WIFEXITED(status) && r.killed.empty() ? WEXITSTATUS(status) : -1;
    r.max_rss_kib = usage.ru_maxrss;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::ifstream in(err_path);
  std::stringstream text;
  text << in.rdbuf();
  r.err = text.str();
  std::remove(err_path.c_str());
  return r;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_PROGRAM_RUN_H_
