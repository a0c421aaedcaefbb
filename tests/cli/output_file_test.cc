// cli::OutputFile (cli/output_file.h): what is written arrives whole, append
// keeps and truncate replaces, and every failure (a full disk at the last
// flush, a missing directory, a file where a directory should be) is an
// error naming the flag, the file and the cause.
#include "cli/output_file.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::cli {
namespace {

using ::zeroshard::testing::Seed;

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/zs_output_file_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string RandomText(std::mt19937_64& rng) {
    std::string text(1 + rng() % 100000, ' ');
    for (char& c : text) c = static_cast<char>('a' + rng() % 26);
    return text;
  }

  std::string dir_;
};

TEST_F(OutputFileTest, WritesWholeAndAppendKeepsWhatTruncateReplaces) {
  std::mt19937_64 rng(Seed());
  const std::string path = dir_ + "/out.json";
  const std::string first = RandomText(rng), second = RandomText(rng);
  ASSERT_TRUE(WriteOutputFile("--result-json", path, first).ok());
  EXPECT_EQ(Read(path), first);
  {
    absl::StatusOr<OutputFile> file =
        OutputFile::Open("--log-json", path, OutputFile::Mode::kAppend);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE(file->Write(second).ok());
    ASSERT_TRUE(file->Flush().ok());
    EXPECT_EQ(Read(path), first + second);  // flushed: visible before the close
    ASSERT_TRUE(file->Close().ok());
  }
  ASSERT_TRUE(WriteOutputFile("--result-json", path, second).ok());
  EXPECT_EQ(Read(path), second);
}

TEST_F(OutputFileTest, AFullDiskIsAnErrorAtTheLastFlush) {
  std::mt19937_64 rng(Seed());
  // A few bytes stay in the buffer until Close: the error must come from it.
  const std::string text = RandomText(rng).substr(0, 1 + rng() % 64);
  absl::StatusOr<OutputFile> file = OutputFile::Open("--result-json", "/dev/full");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->Write(text).ok());
  const absl::Status closed = file->Close();
  EXPECT_EQ(closed.code(), absl::StatusCode::kResourceExhausted) << closed;
  EXPECT_NE(closed.message().find("--result-json /dev/full"), std::string::npos) << closed;
  EXPECT_NE(closed.message().find("No space left on device"), std::string::npos) << closed;
  const absl::Status whole = WriteOutputFile("--svg", "/dev/full", text);
  EXPECT_EQ(whole.code(), absl::StatusCode::kResourceExhausted) << whole;
  EXPECT_NE(whole.message().find("--svg /dev/full"), std::string::npos) << whole;
}

TEST_F(OutputFileTest, AMissingDirectoryIsNamed) {
  const std::string missing = absl::StrCat(dir_, "/nodir", Seed() % 1000);
  const absl::Status s = WriteOutputFile("--result-json", missing + "/x.json", "{}");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("the directory " + missing + " does not exist"), std::string::npos)
      << s;
}

TEST_F(OutputFileTest, AFileWhereADirectoryShouldBeOrADirectoryIsRefused) {
  const std::string file = dir_ + "/afile";
  ASSERT_TRUE(WriteOutputFile("", file, "x").ok());
  const absl::Status under = WriteOutputFile("--log-json", file + "/x.jsonl", "{}");
  EXPECT_EQ(under.code(), absl::StatusCode::kFailedPrecondition) << under;
  EXPECT_NE(under.message().find("not a directory"), std::string::npos) << under;
  const absl::Status is_dir = WriteOutputFile("--log-json", dir_, "{}");
  EXPECT_EQ(is_dir.code(), absl::StatusCode::kFailedPrecondition) << is_dir;
  EXPECT_NE(is_dir.message().find("is a directory"), std::string::npos) << is_dir;
}

}  // namespace
}  // namespace zeroshard::cli
