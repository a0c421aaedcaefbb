// SwapFiles' checksums (issue 34, engine/src/offload/swap_files.h): swap data
// damaged in place by another program (1e30 floats written with pwrite on
// its own file descriptor) in the header page, the first data page or the
// last one is DataLoss of the next read (CheckFiles for the header) naming
// the file, the tensor and the page's file offset; an undamaged round trip
// and never-written pages pass; with verify off the same damage goes unseen
// (the bytes read are the damaged ones: the check is what catches it).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/src/offload/io_engine.h"
#include "engine/src/offload/swap_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

using ::testing::HasSubstr;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/zs_swap_crc_test.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
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

AlignedBuffer MustAllocate(int64_t bytes) {
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  return std::move(buffer).value();
}

void FillRandom(std::mt19937_64& rng, void* data, int64_t bytes) {
  auto* out = static_cast<unsigned char*>(data);
  for (int64_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(rng());
}

// Another program writes `count` floats of 1e30 at byte `offset` of the
// file, through its own descriptor (buffered; the kernel writes the dirty
// pages back before a direct read of them).
void DamageInPlace(const std::string& path, int64_t offset, int count) {
  const std::vector<float> huge(static_cast<size_t>(count), 1e30f);
  const int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  const ssize_t n = pwrite(fd, huge.data(), huge.size() * sizeof(float), offset);
  ASSERT_EQ(n, static_cast<ssize_t>(huge.size() * sizeof(float))) << std::strerror(errno);
  ASSERT_EQ(close(fd), 0);
}

enum class Site { kHeader, kFirstPage, kLastPage };

const char* SiteName(Site site) {
  return site == Site::kHeader      ? "header page"
         : site == Site::kFirstPage ? "first page"
                                    : "last page";
}

struct Case {
  bool allow_io_uring;
  Site site;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.allow_io_uring ? "io_uring allowed, " : "thread pool, ") << SiteName(c.site);
}

class SwapFilesCrcTest : public ::testing::TestWithParam<Case> {};

INSTANTIATE_TEST_SUITE_P(
    BackendsAndSites, SwapFilesCrcTest,
    ::testing::Values(Case{false, Site::kHeader}, Case{false, Site::kFirstPage},
                      Case{false, Site::kLastPage}, Case{true, Site::kHeader},
                      Case{true, Site::kFirstPage}, Case{true, Site::kLastPage}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.allow_io_uring ? "IoUringAllowed_" : "ThreadPool_";
      for (char c : std::string(SiteName(info.param.site))) name += c == ' ' ? '_' : c;
      return name;
    });

SwapOptions Options(const std::string& dir, bool allow_io_uring, bool verify) {
  SwapOptions options;
  options.dir = dir;
  options.rank = 0;
  options.allow_io_uring = allow_io_uring;
  options.verify = verify;
  return options;
}

// The tensor: more than one I/O piece (kIoPieceBytes), so the first and the
// last page are checked by different pieces, and not a whole number of pages.
constexpr int64_t kTensorBytes = kIoPieceBytes + 5 * kSwapAlignment + 123;

TEST_P(SwapFilesCrcTest, DamageInPlaceIsDataLossNamingFileTensorAndOffset) {
  const Case c = GetParam();
  std::mt19937_64 rng(Seed());
  TempDir dir;
  auto created = SwapFiles::Create(Options(dir.path(), c.allow_io_uring, /*verify=*/true),
                                   {{"master", 3 * kSwapAlignment}, {"adam_v", kTensorBytes}});
  ASSERT_TRUE(created.ok()) << created.status();
  SwapFiles& files = **created;
  ASSERT_TRUE(files.verify());
  const int t = 1;
  const int64_t size = files.rounded_bytes(t);
  AlignedBuffer written = MustAllocate(size), read = MustAllocate(size);

  // Never written: zeros, and they pass.
  ASSERT_TRUE(files.Read(t, 0, read.data(), size).ok()) << SeedTrace();
  // Random bytes in two writes (one async), read back whole: they pass.
  FillRandom(rng, written.data(), size);
  ASSERT_TRUE(files.Write(t, 0, written.data(), kSwapAlignment).ok());
  auto ticket =
      files.WriteAsync(t, kSwapAlignment, static_cast<char*>(written.data()) + kSwapAlignment,
                       size - kSwapAlignment);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_TRUE(files.Wait(*ticket).ok());
  FillRandom(rng, read.data(), size);
  absl::Status clean = files.Read(t, 0, read.data(), size);
  ASSERT_TRUE(clean.ok()) << clean << " " << SeedTrace();
  ASSERT_EQ(std::memcmp(written.data(), read.data(), static_cast<size_t>(size)), 0);
  ASSERT_TRUE(files.CheckFiles().ok()) << files.CheckFiles();

  // The damaged page's file offset (header included) and a random place in
  // it for the 1e30 floats (8 of them: 32 bytes, within the page).
  const int64_t file_size = kSwapAlignment + size;
  const int64_t page = c.site == Site::kHeader      ? 0
                       : c.site == Site::kFirstPage ? kSwapAlignment
                                                    : file_size - kSwapAlignment;
  std::uniform_int_distribution<int64_t> place(0, (kSwapAlignment - 32) / 4);
  const int64_t at = page + 4 * place(rng);
  DamageInPlace(files.path(t), at, 8);
  const std::string where =
      absl::StrCat(SiteName(c.site), " damaged at byte ", at, ", ", SeedTrace());

  if (c.site == Site::kHeader) {
    const absl::Status check = files.CheckFiles();
    EXPECT_EQ(check.code(), absl::StatusCode::kDataLoss) << check << " " << where;
    EXPECT_THAT(check.message(), HasSubstr(files.path(t))) << where;
    EXPECT_THAT(check.message(), HasSubstr("(tensor adam_v)")) << where;
    EXPECT_THAT(check.message(), HasSubstr("header page (offset 0")) << where;
    EXPECT_THAT(check.message(), HasSubstr("resume from the last checkpoint")) << where;
    std::printf("CheckFiles after damage in the header page: %s\n", check.ToString().c_str());
    // The data pages are intact and still read.
    EXPECT_TRUE(files.Read(t, 0, read.data(), size).ok()) << where;
    return;
  }
  // The whole tensor, and then only the damaged page, through ReadAsync.
  absl::Status status = files.Read(t, 0, read.data(), size);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status << " " << where;
  EXPECT_THAT(status.message(), HasSubstr(files.path(t))) << where;
  EXPECT_THAT(status.message(), HasSubstr("(tensor adam_v)")) << where;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("page at file offset ", page, " ")))
      << where;
  EXPECT_THAT(status.message(), HasSubstr("resume from the last checkpoint")) << where;
  std::printf("Read after damage in the %s: %s\n", SiteName(c.site), status.ToString().c_str());
  auto one = files.ReadAsync(t, page - kSwapAlignment, read.data(), kSwapAlignment);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(files.Wait(*one).code(), absl::StatusCode::kDataLoss) << where;
  // The header and the other pages are intact: reads that miss the page
  // pass, and so does CheckFiles.
  const int64_t data_page = page - kSwapAlignment;
  const int64_t before = data_page, after = size - data_page - kSwapAlignment;
  if (before > 0) {
    EXPECT_TRUE(files.Read(t, 0, read.data(), before).ok()) << where;
  }
  if (after > 0) {
    EXPECT_TRUE(files.Read(t, data_page + kSwapAlignment, read.data(), after).ok()) << where;
  }
  EXPECT_TRUE(files.CheckFiles().ok()) << files.CheckFiles() << " " << where;
  // The other file never was damaged.
  EXPECT_TRUE(files.Read(0, 0, read.data(), files.rounded_bytes(0)).ok()) << where;
  // Written again, the page is what this run wrote: it passes.
  ASSERT_TRUE(
      files.Write(t, data_page, static_cast<char*>(written.data()) + data_page, kSwapAlignment)
          .ok());
  EXPECT_TRUE(files.Read(t, 0, read.data(), size).ok()) << where;
}

// The switch works: without verify the same damage is read back as data,
// unseen (the bench's baseline; never for training).
TEST_P(SwapFilesCrcTest, VerifyOffDoesNotCheck) {
  const Case c = GetParam();
  std::mt19937_64 rng(Seed());
  TempDir dir;
  auto created = SwapFiles::Create(Options(dir.path(), c.allow_io_uring, /*verify=*/false),
                                   {{"adam_v", kTensorBytes}});
  ASSERT_TRUE(created.ok()) << created.status();
  SwapFiles& files = **created;
  EXPECT_FALSE(files.verify());
  const int64_t size = files.rounded_bytes(0);
  AlignedBuffer written = MustAllocate(size), read = MustAllocate(size);
  FillRandom(rng, written.data(), size);
  ASSERT_TRUE(files.Write(0, 0, written.data(), size).ok());
  const int64_t page = c.site == Site::kHeader      ? 0
                       : c.site == Site::kFirstPage ? kSwapAlignment
                                                    : size;  // the last page's file offset
  DamageInPlace(files.path(0), page + 64, 8);
  EXPECT_TRUE(files.CheckFiles().ok()) << files.CheckFiles();
  ASSERT_TRUE(files.Read(0, 0, read.data(), size).ok());
  const bool same = std::memcmp(written.data(), read.data(), static_cast<size_t>(size)) == 0;
  EXPECT_EQ(same, c.site == Site::kHeader)
      << "the damage must come back in the data read (else the test damaged nothing)";
}

}  // namespace
}  // namespace zeroshard::internal
