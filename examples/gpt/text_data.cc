#include "examples/gpt/text_data.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "examples/common/rng.h"
#include "zeroshard/input_file.h"

namespace zeroshard {
namespace gpt {
namespace {

namespace fs = std::filesystem;

constexpr char kDefaultCorpusPath[] = "/usr/share/games/fortunes";
constexpr char kCorpusPackage[] = "fortunes";
// Rounds of the Feistel network that shuffles an epoch: a bijection for any
// number; six mix every output bit into every other half twice over.
constexpr int kFeistelRounds = 6;

std::string HumanBytes(size_t n) {
  if (n < 1024) return absl::StrCat(n, " B");
  if (n < 1024 * 1024) return absl::StrFormat("%.1f KiB", n / 1024.0);
  return absl::StrFormat("%.1f MiB", n / (1024.0 * 1024.0));
}

// The bytes of one corpus file, read as every input file is
// (zeroshard/input_file.h): a FIFO or a device is refused before a byte is
// read, and nothing past `budget` bytes, what is left of kMaxCorpusBytes, is
// read at all.
absl::StatusOr<std::vector<uint8_t>> ReadFile(const std::string& file, int64_t budget) {
  absl::StatusOr<InputFile> in = InputFile::Open(file, "a --data corpus file", kNoInputSizeCap);
  if (!in.ok()) return in.status();
  if (in->size() > budget) {
    return absl::OutOfRangeError(absl::StrFormat(
        "gpt corpus: %s has %d bytes, past the corpus's limit of %d bytes (%d already read): the "
        "corpus is held in memory whole; pass a smaller one",
        file, in->size(), kMaxCorpusBytes, kMaxCorpusBytes - budget));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(in->size()));
  if (absl::Status s = in->ReadAt(0, bytes.data(), in->size()); !s.ok()) return s;
  return bytes;
}

// Text: no NUL byte, and at most 1% control bytes other than the ones text
// files use (tab, newline, vertical tab, form feed, carriage return;
// backspace and escape, which fortune files use for overstrike and terminal
// effects). Bytes >= 0x80 (UTF-8 or Latin-1) count as text.
bool IsText(const std::vector<uint8_t>& bytes) {
  size_t control = 0;
  for (uint8_t c : bytes) {
    if (c == 0) return false;
    const bool allowed =
        c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == '\b' || c == 0x1b;
    if ((c < 0x20 && !allowed) || c == 0x7f) ++control;
  }
  return control * 100 <= bytes.size();
}

// A fortune file: a line holding only "%" ends each record.
bool IsFortuneFile(const std::vector<uint8_t>& t) {
  if (t.size() >= 2 && t[0] == '%' && t[1] == '\n') return true;
  for (size_t i = 2; i < t.size(); ++i) {
    if (t[i] == '\n' && t[i - 1] == '%' && t[i - 2] == '\n') return true;
  }
  return false;
}

// True when position p (0 < p <= size) is just after a record: after a "%"
// line in a fortune file, after a newline otherwise.
bool IsRecordEnd(const std::vector<uint8_t>& t, size_t p, bool fortune) {
  if (t[p - 1] != '\n') return false;
  if (!fortune) return true;
  return p >= 2 && t[p - 2] == '%' && (p == 2 || t[p - 3] == '\n');
}

// Ends the file's text with its record terminator (see the header), so that
// the next file's first record does not run into this file's last.
void TerminateLastRecord(std::vector<uint8_t>* t, bool fortune) {
  if (t->empty()) return;
  if (t->back() != '\n') t->push_back('\n');
  if (fortune && !IsRecordEnd(*t, t->size(), true)) {
    t->push_back('%');
    t->push_back('\n');
  }
}

// Where file text t splits: the first record end at or after the byte that
// leaves floor(size * val_fraction) bytes for validation (size: no
// validation bytes in this file).
size_t SplitPoint(const std::vector<uint8_t>& t, double val_fraction, bool fortune) {
  const size_t n = t.size();
  const size_t val_target = static_cast<size_t>(static_cast<double>(n) * val_fraction);
  if (val_target == 0) return n;
  for (size_t p = std::max<size_t>(n - val_target, 1); p < n; ++p) {
    if (IsRecordEnd(t, p, fortune)) return p;
  }
  return n;
}

}  // namespace

const char* DefaultCorpusPath() { return kDefaultCorpusPath; }
const char* CorpusPackage() { return kCorpusPackage; }

absl::StatusOr<TextCorpus> LoadTextCorpus(const std::string& path, double val_fraction) {
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt corpus ", path, ": val_fraction ", val_fraction,
                     " is not in (0, 1); pass the share of the text kept for validation, "
                     "e.g. 0.1"));
  }
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    std::string hint = "pass an existing text file or directory";
    if (path == kDefaultCorpusPath) {
      hint = absl::StrCat("install the Debian package `", kCorpusPackage, "` (apt-get install ",
                          kCorpusPackage, ", or make deps), or ", hint);
    }
    return absl::NotFoundError(absl::StrCat(
        "gpt corpus ", path, ": ", ec ? ec.message() : "no such file or directory", "; ", hint));
  }

  TextCorpus corpus;
  corpus.path = path;
  std::vector<std::vector<uint8_t>> texts;
  std::string skipped;
  if (fs::is_directory(status)) {
    std::vector<fs::directory_entry> entries;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      entries.push_back(*it);
    }
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("gpt corpus ", path, ": cannot list the directory: ", ec.message()));
    }
    std::sort(entries.begin(), entries.end(),
              [](const fs::directory_entry& a, const fs::directory_entry& b) {
                return a.path().filename().string() < b.path().filename().string();
              });
    int dat = 0, not_regular = 0, second_names = 0;
    std::vector<std::string> not_text;
    std::set<fs::path> read;  // canonical paths: a link to a file read is skipped
    int64_t budget = kMaxCorpusBytes;
    for (const fs::directory_entry& entry : entries) {
      const std::string file = entry.path().string();
      if (absl::EndsWith(entry.path().filename().string(), ".dat")) {
        ++dat;
        continue;
      }
      if (!fs::is_regular_file(entry.path(), ec)) {
        ++not_regular;
        continue;
      }
      fs::path canonical = fs::canonical(entry.path(), ec);
      if (ec) canonical = entry.path();
      if (!read.insert(canonical).second) {
        ++second_names;
        continue;
      }
      absl::StatusOr<std::vector<uint8_t>> bytes = ReadFile(file, budget);
      if (!bytes.ok()) return bytes.status();
      if (!IsText(*bytes)) {
        not_text.push_back(entry.path().filename().string());
        continue;
      }
      corpus.files.push_back(file);
      budget -= static_cast<int64_t>(bytes->size());
      texts.push_back(*std::move(bytes));
    }
    std::vector<std::string> parts;
    if (dat > 0) parts.push_back(absl::StrCat(dat, " *.dat"));
    if (second_names > 0)
      parts.push_back(absl::StrCat(second_names, " second names of files read"));
    if (not_regular > 0) parts.push_back(absl::StrCat(not_regular, " not regular files"));
    if (!not_text.empty()) {
      parts.push_back(
          absl::StrCat(not_text.size(), " not text (", absl::StrJoin(not_text, ", "), ")"));
    }
    if (!parts.empty()) skipped = absl::StrCat("; skipped ", absl::StrJoin(parts, ", "));
    if (texts.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("gpt corpus ", path, ": no text file in the directory", skipped,
                       "; pass a directory of text files or a text file"));
    }
  } else {
    absl::StatusOr<std::vector<uint8_t>> bytes = ReadFile(path, kMaxCorpusBytes);
    if (!bytes.ok()) return bytes.status();
    if (!IsText(*bytes)) {
      return absl::FailedPreconditionError(
          absl::StrCat("gpt corpus ", path,
                       ": not a text file (a NUL byte or more than 1% control bytes); "
                       "pass a text file or a directory of text files"));
    }
    corpus.files.push_back(path);
    texts.push_back(*std::move(bytes));
  }

  size_t total = 0;
  for (std::vector<uint8_t>& t : texts) {
    const bool fortune = IsFortuneFile(t);
    TerminateLastRecord(&t, fortune);
    total += t.size();
    const size_t cut = SplitPoint(t, val_fraction, fortune);
    corpus.train.insert(corpus.train.end(), t.begin(), t.begin() + static_cast<ptrdiff_t>(cut));
    corpus.val.insert(corpus.val.end(), t.begin() + static_cast<ptrdiff_t>(cut), t.end());
  }
  const std::string files =
      texts.size() == 1 ? std::string("1 file") : absl::StrCat(texts.size(), " files");
  if (total == 0) {
    return absl::FailedPreconditionError(absl::StrCat("gpt corpus ", path, ": empty (", files,
                                                      ", 0 bytes", skipped,
                                                      "); pass a corpus with text in it"));
  }
  if (corpus.train.empty() || corpus.val.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gpt corpus ", path, ": val_fraction ", val_fraction, " of ", total, " bytes leaves ",
        corpus.train.empty() ? "no training" : "no validation",
        " text (each file splits at a line or '%'-record end); change val_fraction or pass more "
        "text"));
  }
  corpus.source = absl::StrCat(path, ": ", files, ", ", HumanBytes(total), " (train ",
                               HumanBytes(corpus.train.size()), ", val ",
                               HumanBytes(corpus.val.size()), ")", skipped);
  return corpus;
}

absl::Status CheckCorpusFits(const TextCorpus& corpus, int64_t seq) {
  const size_t need = static_cast<size_t>(seq) + 1;
  if (seq < 1 || corpus.train.size() < need || corpus.val.size() < need) {
    return absl::FailedPreconditionError(
        absl::StrCat("gpt corpus ", corpus.path, ": train ", corpus.train.size(), " and val ",
                     corpus.val.size(), " bytes; each must hold one window of seq + 1 = ", seq + 1,
                     " tokens; use a shorter sequence, a larger corpus or another val_fraction"));
  }
  return absl::OkStatus();
}

WindowSampler::WindowSampler(const std::vector<uint8_t>* tokens, int64_t seq, uint64_t seed)
    : tokens_(tokens), seq_(seq), seed_(seed) {
  windows_ = (static_cast<int64_t>(tokens->size()) - 1) / seq;
  half_bits_ = 1;
  while ((int64_t{1} << (2 * half_bits_)) < windows_) ++half_bits_;
}

absl::StatusOr<WindowSampler> WindowSampler::Create(const std::vector<uint8_t>* tokens, int64_t seq,
                                                    uint64_t seed) {
  if (tokens == nullptr || seq < 1 || static_cast<int64_t>(tokens->size()) < seq + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpt WindowSampler: ", tokens == nullptr ? 0 : tokens->size(), " tokens, seq ", seq,
        ": needs seq >= 1 and at least seq + 1 tokens; use a shorter sequence or more text"));
  }
  return WindowSampler(tokens, seq, seed);
}

// Position `index` of the epoch's permutation: a balanced Feistel network on
// [0, 4^half_bits_) keyed by (seed, epoch), walked along its cycle until it
// lands in [0, windows_) (cycle walking: a bijection of the larger domain
// restricted this way is a bijection of the smaller, and 4^half_bits_ <
// 4 * windows_ keeps the walk short). No table: any rank computes any
// index in O(1).
int64_t WindowSampler::WindowAt(int64_t index) const {
  const uint64_t epoch = static_cast<uint64_t>(index / windows_);
  const uint64_t position = static_cast<uint64_t>(index % windows_);
  const uint64_t key = examples::DeriveKey(seed_, epoch);
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t x = position;
  do {
    uint64_t left = x >> half_bits_, right = x & mask;
    for (int round = 0; round < kFeistelRounds; ++round) {
      const uint64_t mixed = examples::SplitMix64(examples::DeriveKey(key, round) ^ right);
      const uint64_t next_right = left ^ (mixed & mask);
      left = right;
      right = next_right;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<uint64_t>(windows_));
  return static_cast<int64_t>(x);
}

void WindowSampler::Fill(int64_t first, int64_t batch, int32_t* tokens, int32_t* targets) const {
  const std::vector<uint8_t>& t = *tokens_;
  for (int64_t b = 0; b < batch; ++b) {
    const size_t start = static_cast<size_t>(WindowAt(first + b) * seq_);
    for (int64_t j = 0; j < seq_; ++j) {
      tokens[b * seq_ + j] = t[start + static_cast<size_t>(j)];
      targets[b * seq_ + j] = t[start + static_cast<size_t>(j) + 1];
    }
  }
}

int64_t ValWindows(const std::vector<uint8_t>& val, int64_t seq) {
  if (seq < 1 || static_cast<int64_t>(val.size()) < seq + 1) return 0;
  return (static_cast<int64_t>(val.size()) - 1) / seq;
}

void FillValWindow(const std::vector<uint8_t>& val, int64_t seq, int64_t i, int32_t* tokens,
                   int32_t* targets) {
  const size_t start = static_cast<size_t>(i * seq);
  for (int64_t j = 0; j < seq; ++j) {
    tokens[j] = val[start + static_cast<size_t>(j)];
    targets[j] = val[start + static_cast<size_t>(j) + 1];
  }
}

}  // namespace gpt
}  // namespace zeroshard
