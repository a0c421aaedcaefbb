// InputFile and ReadInputFile (zeroshard/input_file.h): what a reader of
// files a user names may and may not open, how much it reads, and what its
// messages say; QuoteForMessage: short, printable quotes.
#include "zeroshard/input_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/quote.h"

namespace zeroshard {
namespace {

class InputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zs_input_file_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string dir_;
};

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

bool Has(const absl::Status& s, const std::string& part) {
  return s.message().find(part) != absl::string_view::npos;
}

TEST_F(InputFileTest, ReadsARegularFileOrASymlinkToOneWhole) {
  const std::string bytes =
      RandomBytes(100000 + ::zeroshard::testing::Seed() % 1000, ::zeroshard::testing::Seed());
  const std::string path = Write("data", bytes);
  absl::StatusOr<std::string> got = ReadInputFile(path, "a test file", bytes.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  got = ReadInputFile(link, "a test file", bytes.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
  got = ReadInputFile(Write("empty", ""), "a test file", 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
}

TEST_F(InputFileTest, RefusesAFileOverTheCapNamingBothSizes) {
  const std::string bytes = RandomBytes(4097, ::zeroshard::testing::Seed());
  absl::StatusOr<std::string> got = ReadInputFile(Write("big", bytes), "a short file", 4096);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(Has(got.status(), "4097 bytes, but a short file is at most 4096 bytes"))
      << got.status();
}

TEST_F(InputFileTest, RefusesFifosDevicesAndDirectoriesWithoutBlocking) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  // No writer ever opens the FIFO: a reader that opened it would block here.
  absl::StatusOr<std::string> got = ReadInputFile(fifo, "the --spec file", 1 << 20);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(got.status(), fifo + ": a FIFO (named pipe), where the --spec file must be a "
                                       "regular file; it is not read"))
      << got.status();
  // A symlink to a FIFO is refused the same way, and says where it points.
  const std::string link = dir_ + "/fifo_link";
  ASSERT_EQ(symlink(fifo.c_str(), link.c_str()), 0);
  got = ReadInputFile(link, "the --spec file", 1 << 20);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_TRUE(Has(got.status(), link + " (a symlink to " + fifo + "): a FIFO")) << got.status();
  for (const char* device : {"/dev/zero", "/dev/urandom", "/dev/null"}) {
    got = ReadInputFile(device, "the --data corpus", 1 << 20);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
    EXPECT_TRUE(Has(got.status(), std::string(device) + ": a character device, where the --data "
                                                        "corpus must be a regular file"))
        << got.status();
  }
  got = ReadInputFile(dir_, "a test file", 1 << 20);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_TRUE(Has(got.status(), dir_ + ": a directory")) << got.status();
  // Open refuses them alike: nothing reaches ReadAt.
  absl::StatusOr<InputFile> opened = InputFile::Open(fifo, "a test file", kNoInputSizeCap);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition) << opened.status();
}

TEST_F(InputFileTest, MissingFilesAndDanglingSymlinksAreNotFoundNamingThePath) {
  absl::Status missing = ReadInputFile(dir_ + "/missing", "the --spec file", 1 << 20).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_TRUE(Has(missing, dir_ + "/missing")) << missing;
  EXPECT_TRUE(Has(missing, "check the path of the --spec file")) << missing;
  const std::string link = dir_ + "/dangling";
  ASSERT_EQ(symlink((dir_ + "/nowhere").c_str(), link.c_str()), 0);
  missing = InputFile::Open(link, "the --machine profile", 1 << 20).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_TRUE(Has(missing, link + " (a symlink to " + dir_ + "/nowhere)")) << missing;
  // A path through a file (not a directory) is missing too.
  const std::string file = Write("plain", "x");
  missing = InputFile::Open(file + "/config.json", "a test file", 1 << 20).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
}

TEST_F(InputFileTest, AnUnreadableFileIsPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads any file: nothing to deny";
  const std::string path = Write("secret", "x");
  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  const absl::Status denied = ReadInputFile(path, "the --config file", 1 << 20).status();
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << denied;
  EXPECT_TRUE(Has(denied, path)) << denied;
  EXPECT_TRUE(Has(denied, "the --config file")) << denied;
}

TEST_F(InputFileTest, ReadAtReadsExactRangesWithinTheSize) {
  const uint64_t seed = ::zeroshard::testing::Seed();
  const std::string bytes = RandomBytes(65536 + seed % 4096, seed);
  absl::StatusOr<InputFile> file =
      InputFile::Open(Write("weights", bytes), "the weights", kNoInputSizeCap);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), static_cast<int64_t>(bytes.size()));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 20; ++i) {
    const int64_t offset = static_cast<int64_t>(rng() % bytes.size());
    const int64_t n = static_cast<int64_t>(rng() % (bytes.size() - offset + 1));
    std::string got(static_cast<size_t>(n), '\0');
    ASSERT_TRUE(file->ReadAt(offset, got.data(), n).ok());
    EXPECT_EQ(got, bytes.substr(offset, n)) << "offset " << offset << " bytes " << n;
  }
  char byte = 0;
  const absl::Status past = file->ReadAt(file->size(), &byte, 1);
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
  EXPECT_TRUE(Has(past, "the weights")) << past;
  EXPECT_EQ(file->ReadAt(-1, &byte, 1).code(), absl::StatusCode::kOutOfRange);
  // A moved-from file is not read again; the moved-to one is.
  InputFile moved = *std::move(file);
  EXPECT_TRUE(moved.ReadAt(0, &byte, 1).ok());
  EXPECT_EQ(byte, bytes[0]);
}

TEST_F(InputFileTest, AFileThatShrinksOrGrowsPastTheCapWhileReadIsRefused) {
  const std::string path = Write("changing", std::string(8192, 'a'));
  absl::StatusOr<InputFile> file = InputFile::Open(path, "the --config file", 10000);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  std::string all(8192, '\0');
  const absl::Status shrunk = file->ReadAt(0, all.data(), 8192);
  EXPECT_EQ(shrunk.code(), absl::StatusCode::kDataLoss) << shrunk;
  EXPECT_TRUE(Has(shrunk, "shrank")) << shrunk;
  EXPECT_EQ(file->ReadAll().status().code(), absl::StatusCode::kDataLoss);

  ASSERT_EQ(truncate(path.c_str(), 8192), 0);
  file = InputFile::Open(path, "the --config file", 10000);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(truncate(path.c_str(), 9000), 0);  // grew within the cap: read whole
  absl::StatusOr<std::string> grown = file->ReadAll();
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->size(), 9000u);
  ASSERT_EQ(truncate(path.c_str(), 20000), 0);  // past it: refused
  const absl::Status over = file->ReadAll().status();
  EXPECT_EQ(over.code(), absl::StatusCode::kOutOfRange) << over;
  EXPECT_TRUE(Has(over, "grew past 10000 bytes")) << over;
}

TEST(QuoteForMessageTest, CutsLongTextAndEscapesWhatIsNotPrintable) {
  const std::string long_text(50 << 20, 'x');
  const std::string quoted = QuoteForMessage(long_text);
  EXPECT_LT(quoted.size(), 100u);
  EXPECT_NE(quoted.find("... (52428800 bytes)"), std::string::npos) << quoted;
  EXPECT_EQ(QuoteForMessage("step_1\n\x01"), "'step_1\\n\\x01'");
  EXPECT_EQ(QuoteForMessage("root:x:0:0:root:/root:/bin/bash\n", 8), "'root:x:0'... (32 bytes)");
}

}  // namespace
}  // namespace zeroshard
