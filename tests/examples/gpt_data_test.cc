// The GPT example's data (examples/gpt/text_data.h): the corpus reader and
// its split, the shuffled stream of windows, the validation windows and the
// distributed sampler's dealing of the stream. Fresh random text and tokens
// every run (tests/test_seed.h); the shipped text is tests/data/gpt_text.txt.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/gpt/text_data.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::gpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

std::vector<uint8_t> RandomTokens(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> t(n);
  for (uint8_t& b : t) b = static_cast<uint8_t>(rng() & 0xff);
  return t;
}

// Random text: lines of random lower-case words; with `fortune`, records of
// 1-4 lines each ended by a "%" line.
std::string RandomText(std::mt19937_64& rng, int records, bool fortune) {
  std::string text;
  for (int r = 0; r < records; ++r) {
    const int lines = 1 + static_cast<int>(rng() % 4);
    for (int l = 0; l < lines; ++l) {
      const int words = 1 + static_cast<int>(rng() % 9);
      for (int w = 0; w < words; ++w) {
        if (w > 0) text += ' ';
        const int letters = 1 + static_cast<int>(rng() % 8);
        for (int c = 0; c < letters; ++c) text += static_cast<char>('a' + rng() % 26);
      }
      text += '\n';
    }
    if (fortune) text += "%\n";
  }
  return text;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "gpt_data_test_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary) << bytes;
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string AsString(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

bool IsRecordEnd(const std::string& t, size_t p) {
  return p >= 2 && t[p - 1] == '\n' && t[p - 2] == '%' && (p == 2 || t[p - 3] == '\n');
}

// ---- The window stream --------------------------------------------------

TEST(WindowSamplerTest, TargetsAreTheInputsShiftedByOne) {
  std::mt19937_64 rng(Seed());
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t seq = 1 + static_cast<int64_t>(rng() % 40);
    const std::vector<uint8_t> raw = RandomTokens(rng, seq + 1 + rng() % 2000);
    auto sampler = WindowSampler::Create(&raw, seq, rng());
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    EXPECT_EQ(sampler->windows_per_epoch(), (static_cast<int64_t>(raw.size()) - 1) / seq);
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 7);
    const int64_t first = static_cast<int64_t>(rng() % 5000);
    std::vector<int32_t> tokens(batch * seq, -1), targets(batch * seq, -1);
    sampler->Fill(first, batch, tokens.data(), targets.data());
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t w = sampler->WindowAt(first + b);
      ASSERT_GE(w, 0);
      ASSERT_LT(w, sampler->windows_per_epoch());
      for (int64_t j = 0; j < seq; ++j) {
        ASSERT_EQ(tokens[b * seq + j], raw[w * seq + j])
            << "row " << b << " j " << j << " " << SeedTrace();
        ASSERT_EQ(targets[b * seq + j], raw[w * seq + j + 1]) << "row " << b << " j " << j;
        if (j + 1 < seq) {
          ASSERT_EQ(targets[b * seq + j], tokens[b * seq + j + 1]);
        }
      }
    }
  }
}

TEST(WindowSamplerTest, EveryEpochIsAPermutationOfAllWindows) {
  std::mt19937_64 rng(Seed() + 1);
  // 1, 2, 3 and 4^k +- 1 windows: the Feistel domain's edges.
  std::vector<int64_t> counts = {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 1023, 1025};
  for (int i = 0; i < 6; ++i) counts.push_back(1 + static_cast<int64_t>(rng() % 5000));
  for (const int64_t windows : counts) {
    const int64_t seq = 1 + static_cast<int64_t>(rng() % 5);
    const std::vector<uint8_t> raw = RandomTokens(rng, windows * seq + 1 + rng() % seq);
    auto sampler = WindowSampler::Create(&raw, seq, rng());
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    ASSERT_EQ(sampler->windows_per_epoch(), windows);
    std::vector<int64_t> previous;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> order(windows);
      std::vector<int> seen(windows, 0);
      for (int64_t p = 0; p < windows; ++p) {
        order[p] = sampler->WindowAt(epoch * windows + p);
        ASSERT_GE(order[p], 0);
        ASSERT_LT(order[p], windows);
        ++seen[order[p]];
      }
      for (int64_t w = 0; w < windows; ++w) {
        ASSERT_EQ(seen[w], 1) << "window " << w << " of " << windows << " in epoch " << epoch << " "
                              << SeedTrace();
      }
      // A shuffle, and a new one each epoch (equal by chance: < 1/100!).
      if (windows >= 100) {
        std::vector<int64_t> identity(windows);
        for (int64_t w = 0; w < windows; ++w) identity[w] = w;
        EXPECT_NE(order, identity) << windows << " windows, epoch " << epoch;
        if (!previous.empty()) {
          EXPECT_NE(order, previous) << windows << " windows";
        }
      }
      previous = order;
    }
  }
}

TEST(WindowSamplerTest, TheSeedDecidesTheOrder) {
  std::mt19937_64 rng(Seed() + 2);
  const int64_t seq = 8;
  const std::vector<uint8_t> raw = RandomTokens(rng, 300 * seq + 1);
  const uint64_t seed = rng();
  auto a = WindowSampler::Create(&raw, seq, seed);
  auto same = WindowSampler::Create(&raw, seq, seed);
  auto other = WindowSampler::Create(&raw, seq, seed ^ (1ull << (rng() % 64)));
  ASSERT_TRUE(a.ok() && same.ok() && other.ok());
  const int64_t n = 2 * a->windows_per_epoch() + 17;  // into a third epoch
  std::vector<int32_t> ta(n * seq), ya(n * seq), ts(n * seq), ys(n * seq), to(n * seq), yo(n * seq);
  a->Fill(0, n, ta.data(), ya.data());
  same->Fill(0, n, ts.data(), ys.data());
  other->Fill(0, n, to.data(), yo.data());
  EXPECT_EQ(ta, ts) << SeedTrace();
  EXPECT_EQ(ya, ys);
  EXPECT_NE(ta, to) << "seeds differing in one bit gave the same order; " << SeedTrace();
  // Fill is a pure function of the stream index: one window at a time, from
  // any starting point, gives the same rows.
  for (int64_t k = 0; k < n; k += 1 + static_cast<int64_t>(rng() % 50)) {
    std::vector<int32_t> t(seq), y(seq);
    a->Fill(k, 1, t.data(), y.data());
    ASSERT_TRUE(std::equal(t.begin(), t.end(), ta.begin() + k * seq)) << "index " << k;
    ASSERT_TRUE(std::equal(y.begin(), y.end(), ya.begin() + k * seq)) << "index " << k;
  }
}

TEST(WindowSamplerTest, CreateRefusesTooFewTokens) {
  const std::vector<uint8_t> raw(16, 'x');
  EXPECT_TRUE(WindowSampler::Create(&raw, 15, 1).ok());
  const auto too_short = WindowSampler::Create(&raw, 16, 1);
  ASSERT_FALSE(too_short.ok());
  EXPECT_EQ(too_short.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_short.status().message(), HasSubstr("16 tokens, seq 16"));
  EXPECT_FALSE(WindowSampler::Create(&raw, 0, 1).ok());
  EXPECT_FALSE(WindowSampler::Create(nullptr, 4, 1).ok());
}

TEST(ValWindowsTest, InOrderAndCountedByHand) {
  std::mt19937_64 rng(Seed() + 3);
  // Hand counts: seq + 1 tokens hold one window, 2 seq still one, 2 seq + 1
  // two; fewer than seq + 1 none.
  EXPECT_EQ(ValWindows(std::vector<uint8_t>(10), 10), 0);
  EXPECT_EQ(ValWindows(std::vector<uint8_t>(11), 10), 1);
  EXPECT_EQ(ValWindows(std::vector<uint8_t>(20), 10), 1);
  EXPECT_EQ(ValWindows(std::vector<uint8_t>(21), 10), 2);
  const int64_t seq = 1 + static_cast<int64_t>(rng() % 30);
  const std::vector<uint8_t> val = RandomTokens(rng, seq + 1 + rng() % 500);
  const int64_t windows = ValWindows(val, seq);
  ASSERT_EQ(windows, (static_cast<int64_t>(val.size()) - 1) / seq);
  for (int64_t i = 0; i < windows; ++i) {
    std::vector<int32_t> t(seq), y(seq);
    FillValWindow(val, seq, i, t.data(), y.data());
    for (int64_t j = 0; j < seq; ++j) {
      ASSERT_EQ(t[j], val[i * seq + j]) << "window " << i << " " << SeedTrace();
      ASSERT_EQ(y[j], val[i * seq + j + 1]) << "window " << i;
    }
  }
}

// ---- The distributed sampler --------------------------------------------

TEST(FirstWindowTest, HandCounts) {
  // world 2, accum 3, batch 2: a step is 12 windows; at consumed 24 rank 0
  // takes 24-25, 26-27, 28-29 and rank 1 takes 30-31, 32-33, 34-35.
  EXPECT_EQ(WindowsPerStep(2, 3, 2), 12);
  EXPECT_EQ(FirstWindow(24, 0, 0, 3, 2), 24);
  EXPECT_EQ(FirstWindow(24, 0, 2, 3, 2), 28);
  EXPECT_EQ(FirstWindow(24, 1, 0, 3, 2), 30);
  EXPECT_EQ(FirstWindow(24, 1, 2, 3, 2), 34);
}

TEST(FirstWindowTest, RanksAreDisjointAndCoverEachStep) {
  std::mt19937_64 rng(Seed() + 4);
  for (int world = 1; world <= 4; ++world) {
    for (int accum = 1; accum <= 3; ++accum) {
      const int64_t batch = 1 + static_cast<int64_t>(rng() % 4);
      const int64_t per_step = WindowsPerStep(world, accum, batch);
      ASSERT_EQ(per_step, world * accum * batch);
      for (int64_t step = 0; step < 3; ++step) {
        const int64_t consumed = step * per_step;
        std::vector<int> count(per_step, 0);
        for (int rank = 0; rank < world; ++rank) {
          for (int micro = 0; micro < accum; ++micro) {
            const int64_t first = FirstWindow(consumed, rank, micro, accum, batch);
            // One rank with world * accum micro-batches takes the same.
            EXPECT_EQ(first, FirstWindow(consumed, 0, rank * accum + micro, world * accum, batch));
            for (int64_t b = 0; b < batch; ++b) {
              const int64_t k = first + b - consumed;
              ASSERT_GE(k, 0) << "world " << world << " accum " << accum;
              ASSERT_LT(k, per_step) << "world " << world << " accum " << accum;
              ++count[k];
            }
          }
        }
        for (int64_t k = 0; k < per_step; ++k) {
          ASSERT_EQ(count[k], 1) << "window " << consumed + k << ", world " << world << " accum "
                                 << accum << " batch " << batch;
        }
      }
    }
  }
}

TEST(FirstWindowTest, AResumeAtAnotherWorldSizeContinuesTheStream) {
  std::mt19937_64 rng(Seed() + 5);
  const int64_t seq = 4;
  const std::vector<uint8_t> raw = RandomTokens(rng, 50 * seq + 1);
  auto sampler = WindowSampler::Create(&raw, seq, rng());
  ASSERT_TRUE(sampler.ok());
  // Segments of (world, accum, batch, steps): a run, then resumes on other
  // world sizes and batches. The windows they take, step by step, are the
  // stream's indices 0, 1, 2, ... with none skipped or taken twice, and each
  // micro-batch holds the stream's windows at those indices.
  struct Segment {
    int world, accum;
    int64_t batch, steps;
  };
  const std::vector<Segment> run = {{4, 1, 2, 3}, {2, 2, 2, 2}, {1, 3, 3, 2}, {3, 2, 1, 4}};
  int64_t consumed = 0;
  for (const Segment& s : run) {
    for (int64_t step = 0; step < s.steps; ++step) {
      std::vector<int> count(WindowsPerStep(s.world, s.accum, s.batch), 0);
      for (int rank = 0; rank < s.world; ++rank) {
        for (int micro = 0; micro < s.accum; ++micro) {
          const int64_t first = FirstWindow(consumed, rank, micro, s.accum, s.batch);
          std::vector<int32_t> t(s.batch * seq), y(s.batch * seq);
          sampler->Fill(first, s.batch, t.data(), y.data());
          for (int64_t b = 0; b < s.batch; ++b) {
            const int64_t k = first + b - consumed;
            ASSERT_GE(k, 0) << "world " << s.world;
            ASSERT_LT(k, static_cast<int64_t>(count.size())) << "world " << s.world;
            ++count[k];
            const int64_t w = sampler->WindowAt(first + b);
            ASSERT_EQ(t[b * seq], raw[w * seq]);
          }
        }
      }
      for (size_t k = 0; k < count.size(); ++k) {
        ASSERT_EQ(count[k], 1) << "stream index " << consumed + static_cast<int64_t>(k)
                               << " at world " << s.world;
      }
      consumed += WindowsPerStep(s.world, s.accum, s.batch);
    }
  }
  // 4*1*2*3 + 2*2*2*2 + 1*3*3*2 + 3*2*1*4 = 24 + 16 + 18 + 24.
  EXPECT_EQ(consumed, 82);
}

// ---- The corpus ---------------------------------------------------------

TEST(LoadTextCorpusTest, TheShippedTextSplitsAtARecordEnd) {
  const std::string path = ZS_GPT_TEXT;
  auto corpus = LoadTextCorpus(path, 0.1);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 7000u);
  // The file ends with its "%" line, so nothing is added: train then val is
  // the file, val the last tenth, cut after a "%" line.
  EXPECT_EQ(AsString(corpus->train) + AsString(corpus->val), bytes);
  EXPECT_LE(corpus->val.size(), bytes.size() / 10);
  EXPECT_GT(corpus->val.size(), bytes.size() / 10 - 400);  // records < 400 bytes
  EXPECT_TRUE(IsRecordEnd(AsString(corpus->train), corpus->train.size()));
  EXPECT_THAT(corpus->source, HasSubstr(path + ": 1 file, "));
  EXPECT_TRUE(CheckCorpusFits(*corpus, 128).ok());
  const absl::Status too_long = CheckCorpusFits(*corpus, 1000);
  EXPECT_EQ(too_long.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(too_long.message(), HasSubstr(path));
  EXPECT_THAT(too_long.message(), HasSubstr("seq + 1 = 1001"));
}

// A directory: text files in name order, each split on its own; *.dat,
// links to files read, binary files and sub-directories skipped.
TEST(LoadTextCorpusTest, ADirectoryIsReadInNameOrderAndSplitPerFile) {
  std::mt19937_64 rng(Seed() + 6);
  TempDir dir;
  // Eight text files, written in an order that is not their names' order.
  std::vector<std::string> names;
  for (int i = 0; i < 8; ++i) {
    std::string name;
    for (int c = 0; c < 6; ++c) name += static_cast<char>('a' + rng() % 26);
    names.push_back(name + std::to_string(i));
  }
  std::vector<std::string> texts(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    texts[i] = RandomText(rng, 20 + static_cast<int>(rng() % 40), /*fortune=*/true);
    dir.Write(names[i], texts[i]);
    // strfile's index: binary, and skipped by its name.
    std::string index(24, '\0');
    index += texts[i].substr(0, 3);
    dir.Write(names[i] + ".dat", index);
    fs::create_symlink(dir.path() + "/" + names[i], dir.path() + "/" + names[i] + ".u8");
  }
  dir.Write("binary", std::string("\x7f"
                                  "ELF\0\0\1",
                                  7) +
                          texts[0]);
  fs::create_directory(dir.path() + "/subdir");
  dir.Write("subdir/nested", texts[1]);

  const double val_fraction = 0.15 + 0.3 * static_cast<double>(rng() % 1000) / 1000.0;
  auto corpus = LoadTextCorpus(dir.path(), val_fraction);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  std::vector<size_t> order(names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return names[a] < names[b]; });
  ASSERT_EQ(corpus->files.size(), names.size()) << corpus->source;
  std::string train, val;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& t = texts[order[k]];
    EXPECT_EQ(corpus->files[k], dir.path() + "/" + names[order[k]]);
    // The cut: the first "%"-line end at or after the byte that leaves
    // floor(n * val_fraction) bytes.
    const size_t target = t.size() - static_cast<size_t>(t.size() * val_fraction);
    size_t cut = target;
    while (!IsRecordEnd(t, cut)) ++cut;
    train += t.substr(0, cut);
    val += t.substr(cut);
  }
  EXPECT_EQ(AsString(corpus->train), train) << SeedTrace();
  EXPECT_EQ(AsString(corpus->val), val) << SeedTrace();
  EXPECT_THAT(corpus->source, HasSubstr("8 files"));
  EXPECT_THAT(corpus->source, HasSubstr("skipped 8 *.dat, 8 second names of files read, "
                                        "1 not regular files, 1 not text (binary)"));
}

TEST(LoadTextCorpusTest, EveryRecordIsEndedBeforeTheNextFile) {
  TempDir dir;
  dir.Write("a", "one\n%\ntwo");         // a fortune file missing its last "\n%"
  dir.Write("b", "plain text\nno end");  // plain text missing its last newline
  dir.Write("c", "three\n%\n");
  auto corpus = LoadTextCorpus(dir.path(), 0.01);  // too little to cut: all train
  // Each file's val part is empty, so the whole corpus is train: refused.
  ASSERT_FALSE(corpus.ok());
  EXPECT_THAT(corpus.status().message(), HasSubstr("no validation"));
  std::mt19937_64 rng(Seed() + 7);
  dir.Write("d", RandomText(rng, 30, /*fortune=*/true));
  corpus = LoadTextCorpus(dir.path(), 0.5);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  const std::string train = AsString(corpus->train);
  const std::string val = AsString(corpus->val);
  // a = "one\n%\ntwo\n%\n" (12 bytes): half leaves 6, and byte 6 ends "%\n".
  EXPECT_EQ(train.substr(0, 6), "one\n%\n");
  EXPECT_EQ(val.substr(0, 6), "two\n%\n");
  // b = "plain text\nno end\n" (18 bytes): the cut at 9 moves to the line end.
  EXPECT_EQ(train.substr(6, 11), "plain text\n");
  EXPECT_EQ(val.substr(6, 7), "no end\n");
  // c = "three\n%\n" (8 bytes): no record end from byte 4 on but its last, so
  // all of it is train; then d's parts.
  EXPECT_EQ(train.substr(17, 8), "three\n%\n");
  EXPECT_EQ(train.size() + val.size(), 12u + 18u + 8u + fs::file_size(dir.path() + "/d"));
}

TEST(LoadTextCorpusTest, ErrorsNameThePath) {
  TempDir dir;
  const std::string missing = dir.path() + "/no_such_corpus";
  auto corpus = LoadTextCorpus(missing, 0.1);
  ASSERT_FALSE(corpus.ok());
  EXPECT_EQ(corpus.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(corpus.status().message(), HasSubstr(missing));

  for (const double bad : {0.0, 1.0, -0.5, 2.0}) {
    corpus = LoadTextCorpus(ZS_GPT_TEXT, bad);
    ASSERT_FALSE(corpus.ok()) << bad;
    EXPECT_EQ(corpus.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(corpus.status().message(), HasSubstr(ZS_GPT_TEXT));
  }

  // A directory with nothing but an index.
  fs::create_directory(dir.path() + "/only_dat");
  const std::string only_dat = dir.path() + "/only_dat";
  std::ofstream(only_dat + "/x.dat") << std::string(8, '\0');
  corpus = LoadTextCorpus(only_dat, 0.1);
  ASSERT_FALSE(corpus.ok());
  EXPECT_EQ(corpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(corpus.status().message(), HasSubstr(only_dat + ": no text file"));

  const std::string empty = dir.Write("empty", "");
  corpus = LoadTextCorpus(empty, 0.1);
  ASSERT_FALSE(corpus.ok());
  EXPECT_THAT(corpus.status().message(), HasSubstr(empty + ": empty"));

  const std::string binary = dir.Write("binary", std::string("ab\0cd\n", 6));
  corpus = LoadTextCorpus(binary, 0.1);
  ASSERT_FALSE(corpus.ok());
  EXPECT_THAT(corpus.status().message(), HasSubstr(binary + ": not a text file"));

  const std::string tiny = dir.Write("tiny", "a\n");
  corpus = LoadTextCorpus(tiny, 0.5);
  ASSERT_FALSE(corpus.ok());
  EXPECT_THAT(corpus.status().message(), HasSubstr(tiny + ": val_fraction 0.5 of 2 bytes"));
}

}  // namespace
}  // namespace zeroshard::gpt
