// The process probe the mpi backend uses to tell a dead peer from a stuck
// one: real child processes, stopped, killed and reaped.
#include "engine/src/comm/process_probe.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "engine/src/comm/peer_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zeroshard::internal {
namespace {

using ::testing::HasSubstr;

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

// The nccl backend's view of its peers (NCCL itself cannot say which one
// is missing): peer processes on this machine probed through /proc.
TEST(PeerWatch, AKilledPeerProcessFailsTheWaitAtOnceNamingItsRank) {
  const ProcessIdentity self = ThisProcess();
  if (self.machine == 0) GTEST_SKIP() << "/proc cannot identify this machine";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    while (true) pause();
  }
  const ProcessIdentity child = ChildIdentity(pid, self);
  // This process is rank 1 of 3, the child rank 2; rank 0 is this process
  // again (a stand-in that stays alive).
  PeerWatch watch(1, {self, self, child});
  EXPECT_TRUE(watch.CheckPeers("nccl comm rank 1").ok());
  EXPECT_THAT(watch.DescribePeers(), HasSubstr(absl::StrFormat("rank 2 (pid %d", pid)));
  EXPECT_THAT(watch.DescribePeers(), HasSubstr("is alive and running"));

  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  ASSERT_EQ(WaitForState(child, self, ProcessState::kStopped), ProcessState::kStopped);
  EXPECT_TRUE(watch.CheckPeers("nccl comm rank 1").ok()) << "a stopped peer may still continue";
  EXPECT_THAT(watch.DescribePeers(), HasSubstr("is stopped"));

  ASSERT_EQ(kill(pid, SIGKILL), 0);
  absl::Status status;
  for (int i = 0; i < 200 && status.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    status = watch.CheckPeers("nccl comm rank 1: AllReduce #3 (count 16, fp32)");
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrFormat("nccl comm rank 1: AllReduce #3 (count 16, fp32): rank 2 "
                                        "(pid %d",
                                        pid)));
  EXPECT_THAT(status.message(), HasSubstr("died: its process is gone"));
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
}

// Ranks as threads of one process: a rank whose work failed is named.
TEST(PeerWatch, AFailedThreadRankIsNamedAndTheOthersAreNot) {
  auto table = std::make_shared<PeerWatch::ThreadTable>(4);
  PeerWatch watch(0, 4, table);
  EXPECT_TRUE(watch.CheckPeers("nccl comm rank 0").ok());
  table->MarkFailed(0);  // this rank's own failure is not a peer's
  EXPECT_TRUE(watch.CheckPeers("nccl comm rank 0").ok());
  table->MarkFailed(3);
  const absl::Status status = watch.CheckPeers("nccl comm rank 0: Broadcast #9");
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(), HasSubstr("nccl comm rank 0: Broadcast #9: rank 3 left the group"));
  EXPECT_THAT(watch.DescribePeers(), HasSubstr("rank 3 failed"));
  EXPECT_THAT(watch.DescribePeers(), HasSubstr("rank 1 is a thread of this process, still"));
  // Nothing known: nothing said, nothing failed.
  PeerWatch blind(0, 4);
  EXPECT_TRUE(blind.CheckPeers("x").ok());
  EXPECT_EQ(blind.DescribePeers(), "");
}

// A peer of a Split group is named by its world rank too, so that a
// message names the process the job knows (the world rank mpirun printed).
TEST(ProcessProbeTest, APeerOfASplitGroupIsNamedByItsWorldRankToo) {
  ProcessIdentity p;
  p.pid = 4242;
  std::snprintf(p.host, sizeof(p.host), "node7");
  p.world_rank = 2;
  EXPECT_EQ(DescribePeer(0, p), "rank 0 (world rank 2, pid 4242 on node7)");
  EXPECT_EQ(DescribePeer(2, p), "rank 2 (pid 4242 on node7)");
  p.world_rank = -1;  // local ranks: threads of one process
  EXPECT_EQ(DescribePeer(1, p), "rank 1 (pid 4242 on node7)");
}

}  // namespace
}  // namespace zeroshard::internal
