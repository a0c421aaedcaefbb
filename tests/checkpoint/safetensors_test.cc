// safetensors headers: random round trips through a file, checked field by
// field against the JSON read independently; the alignment of the data; and
// every refusal of the writer and of the reader.
#include "engine/src/checkpoint/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/test_env.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

using ::testing::HasSubstr;
using testing::Seed;
using testing::SeedTrace;

int64_t ElementBytes(const std::string& dtype) { return dtype == "F32" ? 4 : 2; }

int64_t TensorBytes(const SafetensorsTensor& t) {
  int64_t bytes = ElementBytes(t.dtype);
  for (const int64_t d : t.shape) bytes *= d;
  return bytes;
}

size_t Uniform(std::mt19937_64& rng, size_t lo, size_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<size_t>(lo, hi)(rng);
}

// A random UTF-8 string: ASCII, characters JSON must escape (quote,
// backslash, control characters) and 2-, 3- and 4-byte sequences.
std::string RandomText(std::mt19937_64& rng, size_t min_pieces, size_t max_pieces) {
  static const char* const kPieces[] = {"a",
                                        "b",
                                        "z",
                                        "Q",
                                        "0",
                                        "7",
                                        ".",
                                        "_",
                                        "-",
                                        "/",
                                        " ",
                                        "\"",
                                        "\\",
                                        "\n",
                                        "\t",
                                        "\x01",
                                        "\x7f",
                                        "\xc3\xa9",
                                        "\xe2\x82\xac",
                                        "\xf0\x9f\x98\x80",
                                        "layers",
                                        "weight",
                                        "__"};
  std::string text;
  const size_t pieces = Uniform(rng, min_pieces, max_pieces);
  for (size_t i = 0; i < pieces; ++i) text += kPieces[Uniform(rng, 0, std::size(kPieces) - 1)];
  return text;
}

std::vector<SafetensorsTensor> RandomTensors(std::mt19937_64& rng, size_t count) {
  static const char* const kDtypes[] = {"F32", "BF16", "F16"};
  std::set<std::string> names;
  std::vector<SafetensorsTensor> tensors;
  while (tensors.size() < count) {
    SafetensorsTensor t;
    t.name = RandomText(rng, 1, 12);
    if (t.name == "__metadata__" || !names.insert(t.name).second) continue;
    t.dtype = kDtypes[Uniform(rng, 0, 2)];
    t.shape.resize(Uniform(rng, 0, 4));  // rank 0 is a scalar
    for (int64_t& d : t.shape) d = static_cast<int64_t>(Uniform(rng, 1, 9));
    tensors.push_back(t);
  }
  return tensors;
}

std::map<std::string, std::string> RandomMetadata(std::mt19937_64& rng) {
  std::map<std::string, std::string> metadata;
  const size_t entries = Uniform(rng, 0, 4);
  for (size_t i = 0; i < entries; ++i) metadata[RandomText(rng, 0, 6)] = RandomText(rng, 0, 10);
  return metadata;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

uint64_t LittleEndian64(const std::string& bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

// Writes header + data, reads the file back as a checkpoint reader would (the
// first 8 bytes, then the header, then each tensor's range), and compares
// every field with what was written and with the JSON as nlohmann reads it.
TEST(SafetensorsTest, RandomTensorsRoundTripThroughAFile) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  const std::string path =
      absl::StrCat(::testing::TempDir(), "zs_safetensors_test_", getpid(), ".safetensors");
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const std::vector<SafetensorsTensor> tensors = RandomTensors(rng, Uniform(rng, 0, 24));
    const std::map<std::string, std::string> metadata = RandomMetadata(rng);
    const absl::StatusOr<std::string> header = SafetensorsHeader(tensors, metadata);
    ASSERT_TRUE(header.ok()) << header.status();

    // Expected ranges: back to back in the given order.
    std::vector<int64_t> begins, ends;
    int64_t data_bytes = 0;
    for (const SafetensorsTensor& t : tensors) {
      begins.push_back(data_bytes);
      data_bytes += TensorBytes(t);
      ends.push_back(data_bytes);
    }
    std::string data(data_bytes, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << *header << data;
      ASSERT_TRUE(out.good()) << "cannot write " << path;
    }

    // The layout, read without the code under test.
    ASSERT_EQ(header->size() % 8, 0u) << "the data must start 8-byte aligned";
    const uint64_t n = LittleEndian64(*header);
    ASSERT_EQ(n + 8, header->size());
    const std::string json_text = header->substr(8);
    const size_t last_brace = json_text.rfind('}');
    ASSERT_NE(last_brace, std::string::npos);
    EXPECT_LT(json_text.size() - last_brace - 1, 8u) << "more padding than alignment needs";
    EXPECT_EQ(json_text.find_first_not_of(' ', last_brace + 1), std::string::npos)
        << "padding must be spaces";
    const nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << json_text;
    EXPECT_EQ(doc.size(), tensors.size() + (metadata.empty() ? 0 : 1));
    for (size_t i = 0; i < tensors.size(); ++i) {
      ASSERT_TRUE(doc.contains(tensors[i].name)) << tensors[i].name;
      const nlohmann::json& entry = doc.at(tensors[i].name);
      EXPECT_EQ(entry.at("dtype"), tensors[i].dtype);
      EXPECT_EQ(entry.at("shape").get<std::vector<int64_t>>(), tensors[i].shape);
      EXPECT_EQ(entry.at("data_offsets").get<std::vector<int64_t>>(),
                (std::vector<int64_t>{begins[i], ends[i]}));
    }
    if (!metadata.empty()) {
      using StringMap = std::map<std::string, std::string>;
      EXPECT_EQ(doc.at("__metadata__").get<StringMap>(), metadata);
    }

    // The reader's path: 8 bytes, then the header, then the ranges.
    const std::string file = ReadFile(path);
    const int64_t file_size = static_cast<int64_t>(file.size());
    ASSERT_EQ(file_size, static_cast<int64_t>(header->size()) + data_bytes);
    const absl::StatusOr<int64_t> header_size = SafetensorsHeaderSize(file.substr(0, 8), file_size);
    ASSERT_TRUE(header_size.ok()) << header_size.status();
    ASSERT_EQ(*header_size, static_cast<int64_t>(header->size()));
    const absl::StatusOr<SafetensorsIndex> index =
        ParseSafetensorsHeader(file.substr(0, *header_size), file_size);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(index->data_start, static_cast<int64_t>(header->size()));
    EXPECT_EQ(index->metadata, metadata);
    ASSERT_EQ(index->tensors.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const SafetensorsEntry& e = index->tensors[i];
      EXPECT_EQ(e.name, tensors[i].name);
      EXPECT_EQ(e.dtype, tensors[i].dtype);
      EXPECT_EQ(e.shape, tensors[i].shape);
      EXPECT_EQ(e.begin, begins[i]);
      EXPECT_EQ(e.end, ends[i]);
      EXPECT_EQ(file.substr(index->data_start + e.begin, e.end - e.begin),
                data.substr(begins[i], ends[i] - begins[i]))
          << "bytes of tensor " << e.name;
    }
    // The whole file as the head gives the same index.
    const absl::StatusOr<SafetensorsIndex> whole = ParseSafetensorsHeader(file, file_size);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(whole->tensors.size(), index->tensors.size());
  }
  std::remove(path.c_str());
}

// Every padding length (0..7) occurs: the data start stays 8-byte aligned.
TEST(SafetensorsTest, DataStartsEightByteAlignedForEveryHeaderLength) {
  std::set<size_t> padding_seen;
  for (size_t name_length = 1; name_length <= 24; ++name_length) {
    const absl::StatusOr<std::string> header =
        SafetensorsHeader({{std::string(name_length, 'w'), "BF16", {3}}}, {});
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->size() % 8, 0u) << "name of " << name_length << " bytes";
    padding_seen.insert(header->size() - 1 - header->rfind('}'));
    const absl::StatusOr<SafetensorsIndex> index =
        ParseSafetensorsHeader(*header, static_cast<int64_t>(header->size()) + 6);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(index->data_start % 8, 0);
  }
  EXPECT_EQ(padding_seen.size(), 8u);
}

// A file from elsewhere: keys in any order (the data order is not the JSON
// order), no padding, an empty tensor (a 0 dimension), no metadata.
std::string HeadOf(const std::string& json_text) {
  std::string head(8, '\0');
  uint64_t n = json_text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) head[i] = static_cast<char>(n & 0xff);
  return head + json_text;
}

TEST(SafetensorsTest, ReadsTensorsInDataOrderWhateverTheJsonOrder) {
  SCOPED_TRACE(SeedTrace());
  std::mt19937_64 rng(Seed());
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<SafetensorsTensor> tensors = RandomTensors(rng, Uniform(rng, 1, 12));
    std::vector<int64_t> begins;
    int64_t offset = 0;
    std::vector<std::string> entries;
    for (const SafetensorsTensor& t : tensors) {
      begins.push_back(offset);
      nlohmann::json entry = {{"dtype", t.dtype},
                              {"shape", t.shape},
                              {"data_offsets", {offset, offset + TensorBytes(t)}}};
      entries.push_back(nlohmann::json(t.name).dump() + ":" + entry.dump());
      offset += TensorBytes(t);
    }
    entries.push_back(R"("empty":{"dtype":"F16","shape":[4,0],"data_offsets":[0,0]})");
    std::shuffle(entries.begin(), entries.end(), rng);
    std::string json_text = "{";
    for (size_t i = 0; i < entries.size(); ++i) json_text += (i ? "," : "") + entries[i];
    json_text += "}";
    const std::string head = HeadOf(json_text);
    const absl::StatusOr<SafetensorsIndex> index =
        ParseSafetensorsHeader(head, static_cast<int64_t>(head.size()) + offset);
    ASSERT_TRUE(index.ok()) << index.status() << "\n" << json_text;
    ASSERT_EQ(index->tensors.size(), tensors.size() + 1);
    size_t k = 0;
    for (const SafetensorsEntry& e : index->tensors) {
      if (e.name == "empty" && e.begin == e.end) continue;  // sorts at 0, among the first
      ASSERT_LT(k, tensors.size());
      EXPECT_EQ(e.name, tensors[k].name);
      EXPECT_EQ(e.begin, begins[k]);
      ++k;
    }
    EXPECT_EQ(k, tensors.size());
    EXPECT_EQ(index->data_start, static_cast<int64_t>(head.size()));
    EXPECT_TRUE(index->metadata.empty());
  }
}

// A checkpoint file of a large model holds tens of thousands of tensors: the
// header is written and read in time linear in their number (a quadratic
// parse, nlohmann's parser callback, took 2.6 s here for 20000 tensors; now 0.06 s).
TEST(SafetensorsTest, HeadersOfManyTensorsAreWrittenAndReadQuickly) {
  constexpr int kTensors = 20000;
  std::vector<SafetensorsTensor> tensors;
  int64_t data_bytes = 0;
  for (int i = 0; i < kTensors; ++i) {
    tensors.push_back(
        {absl::StrCat("model.layers.", i, ".mlp.weight"), i % 2 ? "BF16" : "F32", {4096, 11008}});
    data_bytes += TensorBytes(tensors.back());
  }
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<std::string> header = SafetensorsHeader(tensors, {{"step", "1000"}});
  ASSERT_TRUE(header.ok()) << header.status();
  const auto written = std::chrono::steady_clock::now();
  const absl::StatusOr<SafetensorsIndex> index =
      ParseSafetensorsHeader(*header, static_cast<int64_t>(header->size()) + data_bytes);
  const auto read = std::chrono::steady_clock::now();
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->tensors.size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(index->tensors.back().end, data_bytes);
  const double write_s = std::chrono::duration<double>(written - start).count();
  const double read_s = std::chrono::duration<double>(read - written).count();
  std::printf("%d tensors, %zu-byte header: written in %.3f s, read in %.3f s\n", kTensors,
              header->size(), write_s, read_s);
  EXPECT_LT(write_s, testing::TimeLimit(1.0));
  EXPECT_LT(read_s, testing::TimeLimit(1.0));
}

void ExpectInvalid(const absl::Status& status, const std::vector<std::string>& mentions) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& m : mentions) EXPECT_THAT(std::string(status.message()), HasSubstr(m));
}

TEST(SafetensorsTest, WriterRefusesBadTensorsAndNamesThem) {
  const auto refuse = [](const std::vector<SafetensorsTensor>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         const std::vector<std::string>& mentions) {
    SCOPED_TRACE(mentions.front());
    ExpectInvalid(SafetensorsHeader(tensors, metadata).status(), mentions);
  };
  refuse({{"a", "F32", {2}}, {"", "F32", {2}}}, {}, {"tensor 1 has an empty name"});
  refuse({{"a", "F32", {2}}, {"b", "F16", {1}}, {"a", "BF16", {2}}}, {},
         {"tensors 0 and 2", "\"a\"", "unique"});
  refuse({{"__metadata__", "F32", {2}}}, {}, {"__metadata__", "reserves"});
  refuse({{"w", "F64", {2}}}, {}, {"\"w\"", "\"F64\"", "F32, BF16, F16"});
  refuse({{"w", "f32", {2}}}, {}, {"\"f32\""});
  refuse({{"w", "F32", {4, 0, 2}}}, {}, {"\"w\"", "dimension 1", "[4, 0, 2]", "positive"});
  refuse({{"w", "F32", {-3}}}, {}, {"\"w\"", "-3"});
  refuse({{"huge", "F32", {int64_t{1} << 62, 2}}}, {}, {"\"huge\"", "2^63"});
  // Each fits; together they do not.
  refuse({{"a", "F32", {int64_t{1} << 60}}, {"b", "F32", {int64_t{1} << 60}}}, {},
         {"\"b\"", "2^63"});
  refuse({{"bad\xff", "F32", {2}}}, {}, {"tensor 0", "UTF-8"});
  refuse({{"w", "F32", {2}}}, {{"key", "\xc0\xaf"}}, {"\"key\"", "its value", "UTF-8"});
  refuse({{"w", "F32", {2}}}, {{"\xed\xa0\x80", "v"}}, {"its key", "UTF-8"});
}

TEST(SafetensorsTest, WriterAcceptsValidUtf8OfEveryLength) {
  // U+007F, U+0080, U+07FF, U+0800, U+FFFF, U+10000, U+10FFFF: the edges of
  // each UTF-8 length (the surrogates' neighbours U+D7FF and U+E000 too).
  const std::string name =
      "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xed\x9f\xbf\xee\x80\x80"
      "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
  const absl::StatusOr<std::string> header =
      SafetensorsHeader({{name, "F32", {1}}}, {{name, name}});
  ASSERT_TRUE(header.ok()) << header.status();
  const absl::StatusOr<SafetensorsIndex> index =
      ParseSafetensorsHeader(*header, static_cast<int64_t>(header->size()) + 4);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->tensors.at(0).name, name);
  EXPECT_EQ(index->metadata.at(name), name);
}

// A header from JSON text, and the file size its tensors need beyond it.
struct ReaderCase {
  std::string what;
  std::string head;
  int64_t file_size;
  std::vector<std::string> mentions;
};

ReaderCase Json(const std::string& what, const std::string& json_text, int64_t data_bytes,
                std::vector<std::string> mentions) {
  const std::string head = HeadOf(json_text);
  return {what, head, static_cast<int64_t>(head.size()) + data_bytes, std::move(mentions)};
}

TEST(SafetensorsTest, ReaderRefusesDamagedHeadersAndNamesTheField) {
  const std::string w = R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
  std::string too_long(8, '\0');
  too_long[0] = 43;  // 8 + N = 51 bytes in a file of 50
  std::string past_cap(8, '\0');
  past_cap[4] = 1;  // N = 2^32
  std::vector<ReaderCase> cases = {
      {"file shorter than 8 bytes", std::string(5, '\0'), 5, {"5 bytes", "too short"}},
      {"head shorter than 8 bytes", std::string(4, '\0'), 100, {"4 bytes given"}},
      {"header length past the file", too_long, 50, {"header length 43", "end of the file"}},
      {"header length past the cap", past_cap, int64_t{1} << 40, {"4294967296", "limit"}},
      {"head shorter than 8 + N", HeadOf("{" + w + "}").substr(0, 20), 200, {"read the first"}},
      Json("not starting with '{'", " {" + w + "}", 24, {"start with '{'", "0x20"}),
      Json("an array", "[1,2]", 0, {"start with '{'"}),
      Json("malformed JSON", "{\"w\":{\"dtype\":", 24, {"not valid JSON"}),
      Json("trailing garbage", "{" + w + "}x", 24, {"not valid JSON"}),
      Json("duplicate tensor name", "{" + w + "," + w + "}", 24, {"\"w\"", "twice"}),
      Json("duplicate field",
           R"({"w":{"dtype":"F32","dtype":"F16","shape":[6],"data_offsets":[0,24]}})", 24,
           {"\"dtype\"", "twice"}),
      Json("nested too deeply", R"({"w":{"dtype":"F32","shape":[[6]],"data_offsets":[0,24]}})", 24,
           {"deeper"}),
      Json("metadata not an object", "{\"__metadata__\":[1]," + w + "}", 24,
           {"'__metadata__'", "[1]"}),
      Json("metadata value not a string", "{\"__metadata__\":{\"step\":100}," + w + "}", 24,
           {"\"step\"", "100", "strings"}),
      Json("tensor not an object", R"({"w":[0,24]})", 24, {"tensor \"w\"", "[0,24]"}),
      Json("empty tensor name", R"({"":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", 24,
           {"empty name"}),
      Json("dtype missing", R"({"w":{"shape":[6],"data_offsets":[0,24]}})", 24,
           {"\"w\"", "'dtype' is missing"}),
      Json("shape missing", R"({"w":{"dtype":"F32","data_offsets":[0,24]}})", 24,
           {"'shape' is missing"}),
      Json("data_offsets missing", R"({"w":{"dtype":"F32","shape":[6]}})", 24,
           {"'data_offsets' is missing"}),
      Json("unknown field",
           R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24],"stride":[1]}})", 24,
           {"unknown field \"stride\""}),
      Json("dtype not a string", R"({"w":{"dtype":4,"shape":[6],"data_offsets":[0,24]}})", 24,
           {"'dtype' is 4"}),
      Json("unknown dtype", R"({"w":{"dtype":"F64","shape":[3],"data_offsets":[0,24]}})", 24,
           {"\"F64\"", "F32, BF16, F16"}),
      Json("shape not an array", R"({"w":{"dtype":"F32","shape":6,"data_offsets":[0,24]}})", 24,
           {"'shape' is 6"}),
      Json("negative dimension", R"({"w":{"dtype":"F32","shape":[-6],"data_offsets":[0,24]}})", 24,
           {"'shape' holds -6"}),
      Json("fractional dimension", R"({"w":{"dtype":"F32","shape":[6.0],"data_offsets":[0,24]}})",
           24, {"'shape' holds 6.0"}),
      Json("dimension past 2^63",
           R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,24]}})", 24,
           {"9223372036854775808"}),
      Json("byte size past 2^63",
           R"({"w":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,24]}})", 24,
           {"\"w\"", "past 2^63 - 1 bytes"}),
      Json("byte size wrapping to 0 in 64 bits",
           R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0,
           {"\"w\"", "past 2^63 - 1 bytes"}),
      Json("data_offsets not a pair", R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[24]}})",
           24, {"'data_offsets' is [24]"}),
      Json("data_offsets reversed", R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[24,0]}})",
           24, {"'data_offsets' is [24,0]"}),
      Json("negative offset", R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[-8,16]}})", 24,
           {"'data_offsets' is [-8,16]"}),
      Json("shape does not match offsets",
           R"({"w":{"dtype":"F16","shape":[6],"data_offsets":[0,24]}})", 24,
           {"\"w\"", "12 bytes", "[0, 24]", "hold 24"}),
      Json("overlapping ranges",
           R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
           R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
           24, {"\"b\"", "overlap", "\"a\""}),
      Json("gap between tensors",
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
           24, {"[8, 16)", "between tensors \"a\" and \"b\""}),
      Json("gap before the first tensor",
           R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})", 24,
           {"[0, 16)", "before tensor \"b\""}),
      Json("range past the file", "{" + w + "}", 20, {"\"w\"", "[0, 24]", "20 bytes"}),
      Json("data past the last tensor", "{" + w + "}", 32, {"[24, 32)", "no tensor"}),
      Json("no tensors but data", "{}", 8, {"[0, 8)"}),
  };
  for (const ReaderCase& c : cases) {
    SCOPED_TRACE(c.what);
    const absl::Status status =
        ParseSafetensorsHeader(c.head, c.file_size, "ckpt/x.safetensors").status();
    ExpectInvalid(status, c.mentions);
    EXPECT_THAT(std::string(status.message()), HasSubstr("ckpt/x.safetensors"));
  }
}

TEST(SafetensorsTest, HeaderSizeComesFromTheFirstEightBytes) {
  const absl::StatusOr<std::string> header =
      SafetensorsHeader({{"w", "F32", {2, 3}}}, {{"format", "pt"}});
  ASSERT_TRUE(header.ok()) << header.status();
  const int64_t file_size = static_cast<int64_t>(header->size()) + 24;
  const absl::StatusOr<int64_t> size = SafetensorsHeaderSize(header->substr(0, 8), file_size);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, static_cast<int64_t>(header->size()));
  // The first 8 bytes alone do not make an index.
  ExpectInvalid(ParseSafetensorsHeader(header->substr(0, 8), file_size).status(),
                {"read the first"});
}

}  // namespace
}  // namespace zeroshard::internal
