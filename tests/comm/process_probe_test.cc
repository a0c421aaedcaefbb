// The process probe the mpi backend uses to tell a dead peer from a stuck
// one: real child processes, stopped, killed and reaped.
#include "engine/src/comm/process_probe.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace zeroshard::internal {
namespace {

TEST(ProcStat, ParsesStateAndStartTimeAfterTheLastParenthesis) {
  // Field 22 is the start time; the command name may hold ") " itself.
  const std::string text =
      "4242 (odd) name) (x) T 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654321 20 21\n";
  char state = 0;
  uint64_t start = 0;
  ASSERT_TRUE(ParseProcStat(text, &state, &start));
  EXPECT_EQ(state, 'T');
  EXPECT_EQ(start, 987654321u);
  EXPECT_FALSE(ParseProcStat("4242 (truncated) S 1 2", &state, &start));
  EXPECT_FALSE(ParseProcStat("no parenthesis", &state, &start));
  EXPECT_FALSE(
      ParseProcStat("1 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 5", &state, &start));
}

// The identity of a child as the child itself would report it.
ProcessIdentity ChildIdentity(pid_t pid, const ProcessIdentity& self) {
  ProcessIdentity child = self;
  child.pid = pid;
  // Read the child's start time the way ThisProcess() reads its own.
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  EXPECT_NE(f, nullptr);
  char text[1024] = {};
  if (f != nullptr) {
    const size_t n = std::fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    std::fclose(f);
  }
  char state = 0;
  EXPECT_TRUE(ParseProcStat(text, &state, &child.start_ticks)) << text;
  return child;
}

ProcessState WaitForState(const ProcessIdentity& peer, const ProcessIdentity& self,
                          ProcessState wanted) {
  ProcessState state = ProbeProcess(peer, self);
  for (int i = 0; i < 500 && state != wanted; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    state = ProbeProcess(peer, self);
  }
  return state;
}

TEST(ProcessProbe, RunningStoppedKilledAndReaped) {
  const ProcessIdentity self = ThisProcess();
  if (self.machine == 0) GTEST_SKIP() << "/proc cannot identify this machine";
  EXPECT_EQ(ProbeProcess(self, self), ProcessState::kRunning);
  EXPECT_NE(DescribeProcess(self).find(std::to_string(getpid())), std::string::npos);

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    while (true) pause();  // only async-signal-safe calls in the child
  }
  const ProcessIdentity child = ChildIdentity(pid, self);
  EXPECT_EQ(ProbeProcess(child, self), ProcessState::kRunning);

  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  EXPECT_EQ(WaitForState(child, self, ProcessState::kStopped), ProcessState::kStopped);
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  EXPECT_EQ(WaitForState(child, self, ProcessState::kRunning), ProcessState::kRunning);

  // Killed but not yet reaped: a zombie is gone too.
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(WaitForState(child, self, ProcessState::kGone), ProcessState::kGone);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_EQ(ProbeProcess(child, self), ProcessState::kGone);

  // A reused pid (another start time) is not the peer.
  ProcessIdentity impostor = self;
  impostor.start_ticks += 1;
  EXPECT_EQ(ProbeProcess(impostor, self), ProcessState::kGone);
  // Another machine: nothing can be said.
  ProcessIdentity remote = self;
  remote.machine ^= 0x5a5a;
  EXPECT_EQ(ProbeProcess(remote, self), ProcessState::kUnknown);
  ProcessIdentity unknown = self;
  unknown.machine = 0;
  EXPECT_EQ(ProbeProcess(unknown, unknown), ProcessState::kUnknown);
  EXPECT_NE(DescribeState(ProcessState::kUnknown).find("another machine"), std::string::npos);
  EXPECT_NE(DescribeState(ProcessState::kStopped).find("stopped"), std::string::npos);
  EXPECT_NE(DescribeState(ProcessState::kGone).find("died"), std::string::npos);
}

}  // namespace
}  // namespace zeroshard::internal
