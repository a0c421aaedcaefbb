// SwapFiles (engine/src/offload/swap_files.h): round trips of random bytes
// through both backends, many transfers in flight, refused arguments, the
// faults of issue 21 (a truncated or removed file, a full disk), the stale,
// foreign and live files' rules, and O_DIRECT on a regular file.
#include "engine/src/offload/swap_files.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/src/offload/io_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// A fresh directory, removed with its content at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& under = "/tmp") {
    std::string pattern = under + "/zs_swap_test.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp under " << under << ": " << std::strerror(errno);
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

void FillRandom(std::mt19937_64& rng, void* data, int64_t bytes) {
  auto* out = static_cast<unsigned char*>(data);
  for (int64_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(rng());
}

AlignedBuffer MustAllocate(int64_t bytes) {
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  return std::move(buffer).value();
}

SwapOptions Options(const std::string& dir, bool allow_io_uring) {
  SwapOptions options;
  options.dir = dir;
  options.rank = 3;
  options.io_threads = 2;
  options.allow_io_uring = allow_io_uring;
  return options;
}

// Three tensors of random sizes, not multiples of the alignment, one above
// a few pieces (kIoPieceBytes) so a transfer splits.
std::vector<SwapTensor> RandomTensors(std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> small(1, 300000);
  return {{"master", small(rng)}, {"adam_m", 3 * kIoPieceBytes + 12345}, {"adam_v", small(rng)}};
}

// ---------------------------------------------------------------------------
// Both backends: the pool forced, and io_uring where it initialises.

class SwapFilesBackendTest : public ::testing::TestWithParam<bool> {
 protected:
  bool allow_io_uring() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Backends, SwapFilesBackendTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "IoUringAllowed" : "ThreadPool";
                         });

TEST_P(SwapFilesBackendTest, DescribeNamesTheBackendAndWhy) {
  TempDir dir;
  auto files = SwapFiles::Create(Options(dir.path(), allow_io_uring()), {{"master", 4096}});
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string line = (*files)->describe();
  std::printf("describe() on %s: %s\n", dir.path().c_str(), line.c_str());
  if (!allow_io_uring()) {
    EXPECT_EQ((*files)->backend(), IoBackend::kThreadPool);
    EXPECT_THAT(line, HasSubstr("thread pool of 2 (io_uring not requested)"));
  } else if ((*files)->backend() == IoBackend::kIoUring) {
    EXPECT_THAT(line, HasSubstr("io_uring (queue depth "));
  } else {
    // io_uring did not run here: the line must say why, never silently.
    EXPECT_THAT(line, ::testing::AnyOf(HasSubstr("io_uring_queue_init: "),
                                       HasSubstr("built without liburing")))
        << line;
  }
}

TEST_P(SwapFilesBackendTest, RandomBytesRoundTripAndFreshFilesReadZeros) {
  std::mt19937_64 rng(Seed());
  TempDir dir;
  const std::vector<SwapTensor> tensors = RandomTensors(rng);
  auto created = SwapFiles::Create(Options(dir.path(), allow_io_uring()), tensors);
  ASSERT_TRUE(created.ok()) << created.status();
  SwapFiles& files = **created;
  for (int t = 0; t < files.num_tensors(); ++t) {
    const int64_t size = files.rounded_bytes(t);
    EXPECT_EQ(size, RoundUpToSwapAlignment(tensors[t].bytes));
    AlignedBuffer written = MustAllocate(size), read = MustAllocate(size);
    // Fresh: zeros (the random fill must be overwritten).
    FillRandom(rng, read.data(), size);
    ASSERT_TRUE(files.Read(t, 0, read.data(), size).ok());
    EXPECT_TRUE(std::all_of(static_cast<char*>(read.data()), static_cast<char*>(read.data()) + size,
                            [](char c) { return c == 0; }))
        << files.path(t);
    // Random chunks written in random order, read back whole.
    FillRandom(rng, written.data(), size);
    std::vector<std::pair<int64_t, int64_t>> chunks;
    std::uniform_int_distribution<int64_t> pages(1, 700);
    for (int64_t at = 0; at < size;) {
      const int64_t bytes = std::min(size - at, pages(rng) * kSwapAlignment);
      chunks.push_back({at, bytes});
      at += bytes;
    }
    std::shuffle(chunks.begin(), chunks.end(), rng);
    for (const auto& [at, bytes] : chunks) {
      ASSERT_TRUE(files.Write(t, at, static_cast<char*>(written.data()) + at, bytes).ok());
    }
    FillRandom(rng, read.data(), size);
    ASSERT_TRUE(files.Read(t, 0, read.data(), size).ok());
    ASSERT_EQ(std::memcmp(written.data(), read.data(), static_cast<size_t>(size)), 0)
        << files.path(t) << " " << SeedTrace();
  }
  EXPECT_TRUE(files.CheckFiles().ok()) << files.CheckFiles();
}

TEST_P(SwapFilesBackendTest, ManyTransfersInFlight) {
  std::mt19937_64 rng(Seed());
  TempDir dir;
  // 96 slots of random page counts in one tensor, more than io_uring's
  // queue depth and than the pool's threads; two slots above kIoPieceBytes.
  std::uniform_int_distribution<int64_t> pages(1, 40);
  std::vector<int64_t> slot_bytes(96);
  for (int64_t& b : slot_bytes) b = pages(rng) * kSwapAlignment;
  slot_bytes[7] = kIoPieceBytes + 5 * kSwapAlignment;
  slot_bytes[50] = 2 * kIoPieceBytes;
  std::vector<int64_t> slot_at;
  int64_t total = 0;
  for (int64_t b : slot_bytes) {
    slot_at.push_back(total);
    total += b;
  }
  auto created = SwapFiles::Create(Options(dir.path(), allow_io_uring()), {{"adam_m", total}});
  ASSERT_TRUE(created.ok()) << created.status();
  SwapFiles& files = **created;
  AlignedBuffer written = MustAllocate(total), read = MustAllocate(total);
  FillRandom(rng, written.data(), total);
  FillRandom(rng, read.data(), total);

  std::vector<SwapFiles::Ticket> tickets;
  for (size_t s = 0; s < slot_bytes.size(); ++s) {
    auto ticket = files.WriteAsync(0, slot_at[s], static_cast<char*>(written.data()) + slot_at[s],
                                   slot_bytes[s]);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets.push_back(*ticket);
  }
  ASSERT_TRUE(files.WaitAll().ok());
  // Waited for by WaitAll: gone.
  EXPECT_EQ(files.Wait(tickets[0]).code(), absl::StatusCode::kInvalidArgument);

  tickets.clear();
  for (size_t s = 0; s < slot_bytes.size(); ++s) {
    auto ticket =
        files.ReadAsync(0, slot_at[s], static_cast<char*>(read.data()) + slot_at[s], slot_bytes[s]);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets.push_back(*ticket);
  }
  std::shuffle(tickets.begin(), tickets.end(), rng);
  for (SwapFiles::Ticket ticket : tickets) ASSERT_TRUE(files.Wait(ticket).ok());
  EXPECT_EQ(files.Wait(tickets[0]).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(std::memcmp(written.data(), read.data(), static_cast<size_t>(total)), 0) << SeedTrace();
}

TEST_P(SwapFilesBackendTest, TruncatedFileFailsTheReadNamingIt) {
  std::mt19937_64 rng(Seed());
  TempDir dir;
  const int64_t size = 64 * kSwapAlignment;
  auto created = SwapFiles::Create(Options(dir.path(), allow_io_uring()),
                                   {{"master", size}, {"adam_v", size}});
  ASSERT_TRUE(created.ok()) << created.status();
  SwapFiles& files = **created;
  AlignedBuffer data = MustAllocate(size);
  FillRandom(rng, data.data(), size);
  ASSERT_TRUE(files.Write(1, 0, data.data(), size).ok());

  // Another program cuts the file inside the tensor's data (and at an
  // unaligned length, so a direct read cannot resume past it).
  const int64_t cut = kSwapAlignment + 10 * kSwapAlignment + 123;
  ASSERT_EQ(truncate(files.path(1).c_str(), cut), 0) << std::strerror(errno);
  absl::Status check = files.CheckFiles();
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(check.message(), HasSubstr(files.path(1)));
  EXPECT_THAT(check.message(), HasSubstr(absl::StrCat("truncated to ", cut, " bytes, expected ",
                                                      kSwapAlignment + size)));

  AlignedBuffer read = MustAllocate(size);
  FillRandom(rng, read.data(), size);
  absl::Status status = files.Read(1, 0, read.data(), size);
  ASSERT_FALSE(status.ok()) << "a read past the truncated end must fail, not return zeros";
  EXPECT_THAT(status.message(), HasSubstr(files.path(1)));
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("the file is ", cut, " bytes")));
  // A read wholly past the end fails too (nothing at all comes back).
  status = files.Read(1, 32 * kSwapAlignment, read.data(), 8 * kSwapAlignment);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(files.path(1)));
  // The other file is untouched.
  EXPECT_TRUE(files.Read(0, 0, read.data(), size).ok());
}

TEST_P(SwapFilesBackendTest, MeasureSequentialSecondsRunsThroughTheSamePath) {
  std::mt19937_64 rng(Seed());
  TempDir dir;
  const int64_t size = 3 * kIoPieceBytes + 7 * kSwapAlignment;
  auto created = SwapFiles::Create(Options(dir.path(), allow_io_uring()), {{"master", size}});
  ASSERT_TRUE(created.ok()) << created.status();
  const int64_t chunk = kIoPieceBytes;
  AlignedBuffer buf = MustAllocate(2 * chunk);
  FillRandom(rng, buf.data(), 2 * chunk);
  absl::StatusOr<double> write =
      MeasureSequentialSeconds(**created, 0, buf.data(), chunk, /*write=*/true);
  ASSERT_TRUE(write.ok()) << write.status();
  // Chunk i came from slot i % 2: check the last (partial) chunk's bytes.
  const int64_t last_at = 3 * kIoPieceBytes;
  AlignedBuffer tail = MustAllocate(7 * kSwapAlignment);
  ASSERT_TRUE((*created)->Read(0, last_at, tail.data(), tail.size()).ok());
  EXPECT_EQ(std::memcmp(tail.data(), static_cast<char*>(buf.data()) + chunk,
                        static_cast<size_t>(tail.size())),
            0);
  absl::StatusOr<double> read =
      MeasureSequentialSeconds(**created, 0, buf.data(), chunk, /*write=*/false);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_GT(*write, 0.0);
  EXPECT_GT(*read, 0.0);
  EXPECT_FALSE(MeasureSequentialSeconds(**created, 0, buf.data(), 100, false).ok());
}

// ---------------------------------------------------------------------------

TEST(SwapFilesTest, UnalignedOrOutOfRangeArgumentsRefused) {
  TempDir dir;
  auto created =
      SwapFiles::Create(Options(dir.path(), true), {{"master", 10 * kSwapAlignment + 1}});
  ASSERT_TRUE(created.ok()) << created.status();
  SwapFiles& files = **created;
  AlignedBuffer buf = MustAllocate(12 * kSwapAlignment);
  char* base = static_cast<char*>(buf.data());
  struct Case {
    int tensor;
    int64_t offset;
    char* host;
    int64_t bytes;
  };
  const Case cases[] = {
      {0, 100, base, kSwapAlignment},                      // offset
      {0, 0, base, 100},                                   // bytes
      {0, 0, base + 8, kSwapAlignment},                    // host address
      {0, 10 * kSwapAlignment, base, 2 * kSwapAlignment},  // past the rounded size (11 pages)
      {0, 12 * kSwapAlignment, base, 0},                   // offset past the end
      {0, -kSwapAlignment, base, kSwapAlignment},          // negative
      {1, 0, base, kSwapAlignment},                        // no such tensor
  };
  for (const Case& c : cases) {
    for (bool write : {false, true}) {
      absl::StatusOr<SwapFiles::Ticket> ticket =
          write ? files.WriteAsync(c.tensor, c.offset, c.host, c.bytes)
                : files.ReadAsync(c.tensor, c.offset, c.host, c.bytes);
      ASSERT_FALSE(ticket.ok()) << "offset " << c.offset << " bytes " << c.bytes;
      EXPECT_EQ(ticket.status().code(), absl::StatusCode::kInvalidArgument);
      if (c.tensor == 0) {
        EXPECT_THAT(ticket.status().message(), HasSubstr(files.path(0)));
      }
    }
  }
  // The last page (rounded up) is in range.
  EXPECT_TRUE(files.Write(0, 10 * kSwapAlignment, base, kSwapAlignment).ok());
  EXPECT_EQ(files.Wait(12345).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SwapFilesTest, RemovedFileFailsCheckFilesNamingIt) {
  TempDir dir;
  auto created = SwapFiles::Create(Options(dir.path(), true), {{"master", 8192}, {"adam_m", 8192}});
  ASSERT_TRUE(created.ok()) << created.status();
  SwapFiles& files = **created;
  ASSERT_TRUE(files.CheckFiles().ok());
  const std::string removed = files.path(1);
  ASSERT_EQ(unlink(removed.c_str()), 0);
  absl::Status check = files.CheckFiles();
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(check.message(), HasSubstr(removed + " was removed"));
  // A new file of the same name is not ours either.
  std::ofstream(removed) << "someone else's";
  check = files.CheckFiles();
  EXPECT_THAT(check.message(), HasSubstr(removed + " was replaced"));
  created->reset();
  // The destructor removed our file and left the stranger's.
  EXPECT_FALSE(Exists(dir.path() + "/zeroshard-swap.rank3.master.bin"));
  EXPECT_TRUE(Exists(removed));
}

TEST(SwapFilesTest, FilesNamedByRankAndTensorAndRemovedAtDestruction) {
  TempDir dir;
  std::vector<std::string> paths;
  {
    auto created = SwapFiles::Create(Options(dir.path(), true),
                                     {{"master", 5000}, {"adam_m", 0}, {"adam_v", 5000}});
    ASSERT_TRUE(created.ok()) << created.status();
    for (int t = 0; t < 3; ++t) {
      paths.push_back((*created)->path(t));
      EXPECT_TRUE(Exists(paths.back())) << paths.back();
      struct stat st;
      ASSERT_EQ(stat(paths.back().c_str(), &st), 0);
      EXPECT_EQ(st.st_size, kSwapAlignment + RoundUpToSwapAlignment((*created)->bytes(t)));
    }
    EXPECT_EQ(paths[0], dir.path() + "/zeroshard-swap.rank3.master.bin");
    EXPECT_EQ(SwapFiles::DiskBytes({{"master", 5000}, {"adam_m", 0}, {"adam_v", 5000}}),
              3 * 4096 + 2 * 8192);
  }
  for (const std::string& path : paths) EXPECT_FALSE(Exists(path)) << path;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SwapFilesTest, BadDirectoryAndNamesRefused) {
  TempDir dir;
  auto missing = SwapFiles::Create(Options(dir.path() + "/nope", true), {{"master", 1}});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.path() + "/nope"));
  std::ofstream(dir.path() + "/plain") << "x";
  auto not_dir = SwapFiles::Create(Options(dir.path() + "/plain", true), {{"master", 1}});
  EXPECT_EQ(not_dir.status().code(), absl::StatusCode::kFailedPrecondition);
  for (const std::string& name : {std::string(""), std::string("a/b"), std::string("x y")}) {
    EXPECT_EQ(SwapFiles::Create(Options(dir.path(), true), {{name, 1}}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_EQ(SwapFiles::Create(Options(dir.path(), true), {{"m", 1}, {"m", 2}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SwapFiles::Create(Options(dir.path(), true), {{"m", -1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SwapFilesTest, ForeignFileRefusedAndKept) {
  TempDir dir;
  const std::string path = dir.path() + "/zeroshard-swap.rank3.adam_v.bin";
  std::ofstream(path) << "my thesis, do not delete";
  auto created = SwapFiles::Create(Options(dir.path(), true), {{"master", 4096}, {"adam_v", 4096}});
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(created.status().message(), HasSubstr(path));
  EXPECT_THAT(created.status().message(), HasSubstr("remove it or choose another --offload-dir"));
  std::ifstream in(path);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "my thesis, do not delete");
  // Nothing was created before the refusal.
  EXPECT_FALSE(Exists(dir.path() + "/zeroshard-swap.rank3.master.bin"));

  // Not a regular file either.
  ASSERT_EQ(unlink(path.c_str()), 0);
  ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
  created = SwapFiles::Create(Options(dir.path(), true), {{"adam_v", 4096}});
  EXPECT_EQ(created.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(created.status().message(), HasSubstr(path));
}

// Runs `body` in a forked child; returns its pid. The child never returns
// into the test (it _exits).
template <typename Body>
pid_t Fork(Body body) {
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return pid;
}

TEST(SwapFilesTest, LiveOwnerRefusedThenStaleAfterItsDeathReplaced) {
  TempDir dir;
  const std::vector<SwapTensor> tensors = {{"master", 8192}};
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  // A run that holds the files and stays alive until killed.
  const pid_t owner = Fork([&] {
    close(ready[0]);
    auto files = SwapFiles::Create(Options(dir.path(), false), tensors);
    const char byte = files.ok() ? 'y' : 'n';
    if (write(ready[1], &byte, 1) != 1) return 2;
    while (true) pause();
    return 0;
  });
  ASSERT_GT(owner, 0);
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  ASSERT_EQ(byte, 'y') << "the child could not create its swap files";
  const std::string path = dir.path() + "/zeroshard-swap.rank3.master.bin";

  auto refused = SwapFiles::Create(Options(dir.path(), true), tensors);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr(path));
  EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("pid ", owner)));
  EXPECT_TRUE(Exists(path));

  // Killed mid-run: its files stay behind, stale, and are replaced.
  kill(owner, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(waitpid(owner, &wstatus, 0), owner);
  ASSERT_TRUE(Exists(path));
  ::testing::internal::CaptureStderr();
  auto replaced = SwapFiles::Create(Options(dir.path(), true), tensors);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_THAT(err, HasSubstr("replaced stale swap file " + path));
  EXPECT_THAT(err, HasSubstr(absl::StrCat("pid ", owner)));
  EXPECT_TRUE((*replaced)->CheckFiles().ok());
}

TEST(SwapFilesTest, SameProcessSecondCreateRefusedAsLive) {
  TempDir dir;
  auto first = SwapFiles::Create(Options(dir.path(), true), {{"master", 4096}});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SwapFiles::Create(Options(dir.path(), true), {{"master", 4096}});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr((*first)->path(0)));
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("pid ", getpid())));
  EXPECT_TRUE((*first)->CheckFiles().ok()) << "the refused Create must not touch the live files";
  // Another rank in the same directory is fine.
  SwapOptions other = Options(dir.path(), true);
  other.rank = 4;
  EXPECT_TRUE(SwapFiles::Create(other, {{"master", 4096}}).ok());
}

TEST(SwapFilesTest, DeadPidFileReplaced) {
  TempDir dir;
  // A run that exits without its destructor (as a crash would).
  const pid_t dead = Fork([&] {
    auto files = SwapFiles::Create(Options(dir.path(), false), {{"adam_m", 4096}});
    if (!files.ok()) return 1;
    _exit(0);
  });
  int wstatus = 0;
  ASSERT_EQ(waitpid(dead, &wstatus, 0), dead);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  const std::string path = dir.path() + "/zeroshard-swap.rank3.adam_m.bin";
  ASSERT_TRUE(Exists(path));
  std::ifstream in(path);
  std::string magic;
  std::getline(in, magic);
  EXPECT_EQ(magic, "zeroshard swap file v1");
  ::testing::internal::CaptureStderr();
  auto replaced = SwapFiles::Create(Options(dir.path(), true), {{"adam_m", 4096}});
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_THAT(err, HasSubstr("replaced stale swap file " + path + " (written by pid " +
                             std::to_string(dead)));
}

// The header of a swap file by hand, as another process would have written
// it (the format of swap_files.h).
void WriteHeader(const std::string& path, const std::string& pid, const std::string& start_time) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  std::ofstream out(path);
  out << "zeroshard swap file v1\npid " << pid << "\nhost " << host << "\nboot_id " << boot_id
      << "\nstart_time " << start_time << "\nrank 3\ntensor master\nbytes 4096\n";
  out << std::string(4096, '\0');
}

std::string StartTimeOf(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(all.substr(all.rfind(')') + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;
  return field;
}

// Each piece of evidence of a live owner suffices alone: the lock (an owner
// whose pid this machine cannot check, e.g. in another pid namespace), and
// the pid with its start time (a file system that ignores flock); a reused
// pid (other start time) is no evidence.
TEST(SwapFilesTest, LockOrRunningPidEachMarkAnOwnerLive) {
  TempDir dir;
  const std::string path = dir.path() + "/zeroshard-swap.rank3.master.bin";
  const pid_t dead = Fork([] { return 0; });
  int wstatus = 0;
  ASSERT_EQ(waitpid(dead, &wstatus, 0), dead);

  // A dead pid in the header, but the file is locked.
  WriteHeader(path, std::to_string(dead), "1");
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  auto refused = SwapFiles::Create(Options(dir.path(), true), {{"master", 4096}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("pid ", dead)));
  close(fd);

  // Unlocked, but this very process with its start time.
  const std::string self = std::to_string(getpid());
  WriteHeader(path, self, StartTimeOf(self));
  refused = SwapFiles::Create(Options(dir.path(), true), {{"master", 4096}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("pid " + self));

  // Unlocked, this pid but another start time: the pid was reused, stale.
  WriteHeader(path, self, StartTimeOf(self) + "0");
  ::testing::internal::CaptureStderr();
  auto replaced = SwapFiles::Create(Options(dir.path(), true), {{"master", 4096}});
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_THAT(err, HasSubstr("replaced stale swap file " + path));
}

// Where the kernel refuses io_uring (a seccomp filter, as containers set,
// here in a child), the pool runs and describe() gives the reason.
TEST(SwapFilesTest, IoUringRefusedFallsBackToThePoolWithTheReason) {
  TempDir dir;
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = Fork([&] {
    close(out[0]);
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    std::string report;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      report = std::string("seccomp: ") + std::strerror(errno);
    } else {
      auto files = SwapFiles::Create(Options(dir.path(), true), {{"master", 3 * kSwapAlignment}});
      if (!files.ok()) {
        report = std::string(files.status().message());
      } else {
        AlignedBuffer a = MustAllocate(3 * kSwapAlignment), b = MustAllocate(3 * kSwapAlignment);
        std::memset(a.data(), 0x5a, 3 * kSwapAlignment);
        const bool round_trip = (*files)->Write(0, 0, a.data(), a.size()).ok() &&
                                (*files)->Read(0, 0, b.data(), b.size()).ok() &&
                                std::memcmp(a.data(), b.data(), a.size()) == 0;
        report = (*files)->describe() + (round_trip ? " | round trip ok" : " | round trip FAILED");
      }
    }
    return write(out[1], report.data(), report.size()) == static_cast<ssize_t>(report.size()) ? 0
                                                                                              : 1;
  });
  close(out[1]);
  std::string report;
  char chunk[256];
  for (ssize_t n; (n = read(out[0], chunk, sizeof(chunk))) > 0;)
    report.append(chunk, static_cast<size_t>(n));
  close(out[0]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  std::printf("describe() under a seccomp filter on io_uring_setup: %s\n", report.c_str());
  EXPECT_THAT(report, HasSubstr("thread pool of 2 (io_uring_queue_init: Operation not permitted)"));
  EXPECT_THAT(report, HasSubstr("round trip ok"));
}

// A small tmpfs, unmounted (and its mount point removed) even on failure.
class SmallTmpfs {
 public:
  explicit SmallTmpfs(const std::string& size, unsigned long flags = 0) {
    if (mount("tmpfs", dir_.path().c_str(), "tmpfs", flags, ("size=" + size).c_str()) != 0) {
      error_ = std::strerror(errno);
    } else {
      mounted_ = true;
    }
  }
  ~SmallTmpfs() {
    if (mounted_ && umount(dir_.path().c_str()) != 0) {
      ADD_FAILURE() << "umount " << dir_.path() << ": " << std::strerror(errno);
    }
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string error_;
};

// A read-only --offload-dir is PermissionDenied naming it and what to do,
// before anything is created (it was INTERNAL "Read-only file system").
TEST(SwapFilesTest, ReadOnlyDirectoryRefusedAsPermissionDenied) {
  SmallTmpfs fs("4m", MS_RDONLY);
  ASSERT_TRUE(fs.mounted())
      << "mount -t tmpfs -o ro on " << fs.path() << " failed (" << fs.error()
      << "): this test needs root (CAP_SYS_ADMIN) to mount a small file system";
  auto created = SwapFiles::Create(Options(fs.path(), true), {{"adam_v", 8192}});
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kPermissionDenied) << created.status();
  EXPECT_THAT(created.status().message(), HasSubstr("--offload-dir " + fs.path()));
  EXPECT_THAT(created.status().message(), HasSubstr("read-only file system"));
  EXPECT_THAT(created.status().message(), HasSubstr("choose a directory on a writable"));
}

TEST(SwapFilesTest, FullDiskRefusedBeforeCreatingNamingDirAndBytes) {
  SmallTmpfs fs("1m");
  ASSERT_TRUE(fs.mounted())
      << "mount -t tmpfs -o size=1m on " << fs.path() << " failed (" << fs.error()
      << "): this test needs root (CAP_SYS_ADMIN) to mount a small file system";
  const std::vector<SwapTensor> too_big = {{"master", 600000}, {"adam_m", 600000}};
  const int64_t needed = SwapFiles::DiskBytes(too_big);
  auto created = SwapFiles::Create(Options(fs.path(), true), too_big);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(created.status().message(), HasSubstr("--offload-dir " + fs.path()));
  EXPECT_THAT(created.status().message(), HasSubstr(absl::StrCat("need ", needed, " bytes")));
  EXPECT_THAT(created.status().message(), HasSubstr("bytes free"));
  EXPECT_TRUE(std::filesystem::is_empty(fs.path())) << "nothing is created before the check";

  // What fits is created, and the space is reserved at once.
  auto fits = SwapFiles::Create(Options(fs.path(), true), {{"master", 600000}});
  ASSERT_TRUE(fits.ok()) << fits.status();
  std::printf("describe() on a tmpfs: %s\n", (*fits)->describe().c_str());
  auto second = SwapFiles::Create(Options(fs.path(), true), {{"adam_m", 600000}});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  fits->reset();
}

TEST(SwapFilesTest, DirectIoOnARegularFile) {
  TempDir dir("/tmp");
  auto direct = SwapFiles::Create(Options(dir.path(), true), {{"master", 65536}});
  ASSERT_TRUE(direct.ok()) << direct.status();
  const std::string line = (*direct)->describe();
  std::printf("describe() on %s: %s\n", dir.path().c_str(), line.c_str());
  EXPECT_THAT(line, HasSubstr(", O_DIRECT"));
  EXPECT_THAT(line, Not(HasSubstr("buffered")));
  EXPECT_THAT(line, Not(HasSubstr("not reserved")));
  // The file descriptor really has O_DIRECT: an unaligned transfer on it
  // fails in the kernel (EINVAL), which SwapFiles' checks never let through,
  // so ask /proc for the flags instead.
  bool found = false;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(entry.path(), ec) != (*direct)->path(0)) continue;
    std::ifstream info("/proc/self/fdinfo/" + entry.path().filename().string());
    std::string key, flags;
    while (info >> key) {
      if (key == "flags:") {
        info >> flags;
        break;
      }
    }
    EXPECT_NE(std::stoul(flags, nullptr, 8) & O_DIRECT, 0u) << "flags " << flags;
    found = true;
  }
  EXPECT_TRUE(found) << "no open file descriptor on " << (*direct)->path(0);

  SwapOptions buffered = Options(dir.path(), true);
  buffered.direct = false;
  buffered.rank = 9;
  auto plain = SwapFiles::Create(buffered, {{"master", 65536}});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT((*plain)->describe(), HasSubstr("buffered I/O (O_DIRECT not requested)"));
}

}  // namespace
}  // namespace zeroshard::internal
