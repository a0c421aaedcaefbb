#include "engine/src/comm/process_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "absl/strings/str_format.h"

namespace zeroshard {
namespace internal {
namespace {

// Whole small file (/proc files have no size, so read until the end); false
// when it cannot be opened or read, with errno saying why.
bool ReadSmallFile(const std::string& path, std::string* text) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  text->clear();
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      text->append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int saved = errno;
    close(fd);
    errno = saved;
    return n == 0;
  }
}

uint64_t Fnv1a(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

bool ParseProcStat(const std::string& text, char* state, uint64_t* start_ticks) {
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so the
  // fields start after the last ')'. Field 3 is the state, field 22 the
  // start time.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int index = 3; index <= 22; ++index) {
    if (!(fields >> field)) return false;
    if (index == 3) {
      if (field.size() != 1) return false;
      *state = field[0];
    }
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long ticks = std::strtoull(field.c_str(), &end, 10);
  if (errno != 0 || end == field.c_str() || *end != '\0') return false;
  *start_ticks = ticks;
  return true;
}

ProcessIdentity ThisProcess() {
  ProcessIdentity self;
  self.pid = static_cast<int64_t>(getpid());
  if (gethostname(self.host, sizeof(self.host) - 1) != 0) {
    std::snprintf(self.host, sizeof(self.host), "?");
  }
  std::string stat_text;
  char state = 0;
  std::string boot_id;
  struct stat pid_ns {};
  if (ReadSmallFile("/proc/self/stat", &stat_text) &&
      ParseProcStat(stat_text, &state, &self.start_ticks) &&
      ReadSmallFile("/proc/sys/kernel/random/boot_id", &boot_id) &&
      stat("/proc/self/ns/pid", &pid_ns) == 0) {
    uint64_t h = 0xcbf29ce484222325ull;
    h = Fnv1a(h, boot_id.data(), boot_id.size());
    h = Fnv1a(h, &pid_ns.st_dev, sizeof(pid_ns.st_dev));
    h = Fnv1a(h, &pid_ns.st_ino, sizeof(pid_ns.st_ino));
    self.machine = h == 0 ? 1 : h;
  }
  return self;
}

ProcessState ProbeProcess(const ProcessIdentity& peer, const ProcessIdentity& self) {
  if (peer.machine == 0 || peer.machine != self.machine) return ProcessState::kUnknown;
  std::string text;
  if (!ReadSmallFile(absl::StrFormat("/proc/%d/stat", peer.pid), &text)) {
    return errno == ENOENT || errno == ESRCH ? ProcessState::kGone : ProcessState::kUnknown;
  }
  char state = 0;
  uint64_t start_ticks = 0;
  // An empty read: the process vanished between open and read.
  if (text.empty()) return ProcessState::kGone;
  if (!ParseProcStat(text, &state, &start_ticks)) return ProcessState::kUnknown;
  if (start_ticks != peer.start_ticks) return ProcessState::kGone;  // the pid was reused
  switch (state) {
    case 'Z':
    case 'X':
    case 'x':
      return ProcessState::kGone;
    case 'T':
    case 't':
      return ProcessState::kStopped;
    default:
      return ProcessState::kRunning;
  }
}

std::string DescribeProcess(const ProcessIdentity& process) {
  return absl::StrFormat("pid %d on %s", process.pid, process.host);
}

std::string DescribePeer(int peer, const ProcessIdentity& process) {
  if (process.world_rank >= 0 && process.world_rank != peer) {
    return absl::StrFormat("rank %d (world rank %d, %s)", peer, process.world_rank,
                           DescribeProcess(process));
  }
  return absl::StrFormat("rank %d (%s)", peer, DescribeProcess(process));
}

std::string DescribeState(ProcessState state) {
  switch (state) {
    case ProcessState::kRunning:
      return "is alive and running but has not done its part (stuck in other work, deadlocked, "
             "or slower than the timeout)";
    case ProcessState::kStopped:
      return "is stopped (SIGSTOP, a debugger or job control), so it cannot take part";
    case ProcessState::kGone:
      return "died: its process is gone (killed or crashed)";
    case ProcessState::kUnknown:
      break;
  }
  return "runs on another machine, where this rank cannot tell a dead process from a stuck one";
}

}  // namespace internal
}  // namespace zeroshard
