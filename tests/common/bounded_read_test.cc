// ReadRegularFile: what a reader of untrusted files may and may not open,
// and how much it reads; QuoteForMessage: short, printable quotes.
#include "engine/src/common/bounded_read.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

class BoundedReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zs_bounded_read_XXXXXX";
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

TEST_F(BoundedReadTest, ReadsARegularFileOrASymlinkToOneWhole) {
  const std::string bytes =
      RandomBytes(100000 + ::zeroshard::testing::Seed() % 1000, ::zeroshard::testing::Seed());
  const std::string path = Write("data", bytes);
  absl::StatusOr<std::string> got = ReadRegularFile(path, bytes.size(), "a test file");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  got = ReadRegularFile(link, bytes.size(), "a test file");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
  got = ReadRegularFile(Write("empty", ""), 0, "a test file");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
}

TEST_F(BoundedReadTest, RefusesAFileLargerThanTheBoundWithoutReadingIt) {
  const std::string bytes = RandomBytes(4097, ::zeroshard::testing::Seed());
  absl::StatusOr<std::string> got = ReadRegularFile(Write("big", bytes), 4096, "a short file");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(got.status().message().find("4097 bytes, but a short file is at most 4096 bytes"),
            std::string::npos)
      << got.status();
}

TEST_F(BoundedReadTest, RefusesFifosDevicesAndDirectoriesWithoutBlocking) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  // No writer ever opens the FIFO: a reader that opened it would block here.
  absl::StatusOr<std::string> got = ReadRegularFile(fifo, 1 << 20, "a test file");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find("a FIFO"), std::string::npos) << got.status();
  // A symlink to a FIFO is refused the same way.
  const std::string link = dir_ + "/fifo_link";
  ASSERT_EQ(symlink(fifo.c_str(), link.c_str()), 0);
  got = ReadRegularFile(link, 1 << 20, "a test file");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  got = ReadRegularFile("/dev/zero", 1 << 20, "a test file");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_NE(got.status().message().find("a character device"), std::string::npos);
  got = ReadRegularFile(dir_, 1 << 20, "a test file");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  got = ReadRegularFile(dir_ + "/missing", 1 << 20, "a test file");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
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
}  // namespace zeroshard::internal
