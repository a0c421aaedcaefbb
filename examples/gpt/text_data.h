// The GPT example's data: a real text corpus read as byte-level tokens
// (vocabulary 256), split into training and validation text, and the
// training stream of windows that every rank derives from an index alone.
//
// The corpus. LoadTextCorpus reads a text file, or every regular text file
// of a directory in name order: by default the Debian package `fortunes`'s
// /usr/share/games/fortunes, whose fortune files hold records ended by a
// line "%". In a directory it skips the *.dat files (strfile's binary
// indexes), sub-directories, files that are not text (a NUL byte, or more
// than 1% control bytes other than tab, newline, vertical tab, form feed,
// carriage return, backspace and escape), and second names of a file
// already read (the package's *.u8 links to the same files). The bytes are
// the tokens, '%' lines included: a byte vocabulary has no end-of-text
// token, and the "%" line is what ends each fortune, so the model learns it
// as one. Each file is split on its own, so every file is in both splits:
// its last `val_fraction` of the bytes, cut at the next record boundary (the
// end of a "%" line in a fortune file, else the end of a line), is its
// validation text, the rest its training text; the splits are the
// concatenations of the files' parts in name order, so train and val are
// disjoint byte ranges of the files. A file whose last line is not ended by
// '\n' gets one, and a fortune file whose last record lacks its "%" line
// gets one, so that no record runs into the next file's first.
//
// The stream. WindowSampler cuts a token array into windows of seq + 1
// tokens starting at multiples of seq (window w: tokens[w*seq .. w*seq +
// seq]; consecutive windows share one token): a window's inputs are its
// first seq tokens, its targets the next seq. An epoch is a permutation of
// all windows keyed by (seed, epoch), and the stream is epoch 0's windows,
// then epoch 1's, ...: stream index k is a pure function of (k, seed), the
// same on every rank, with no state, so a resume needs only the number of
// windows consumed. FirstWindow deals the stream to ranks and micro-batches.
#ifndef ZEROSHARD_EXAMPLES_GPT_TEXT_DATA_H_
#define ZEROSHARD_EXAMPLES_GPT_TEXT_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zeroshard {
namespace gpt {

// The most LoadTextCorpus reads, all files together: 4 GiB. The corpus is
// held in memory whole (twice, briefly, while it is split), so a path that
// names more, or a device that never ends, is refused before it is read.
inline constexpr int64_t kMaxCorpusBytes = int64_t{4} << 30;

struct TextCorpus {
  // What was read, for the run's report, e.g. "/usr/share/games/fortunes:
  // 43 files, 2.5 MiB (train 2.3 MiB, val 256.1 KiB); skipped 43 *.dat, ...".
  std::string source;
  std::vector<uint8_t> train;  // byte-level tokens (vocab 256)
  std::vector<uint8_t> val;
  // The path given to LoadTextCorpus, for error messages.
  std::string path;
  // The files read, in order (the path itself for a file).
  std::vector<std::string> files;
};

// Reads the corpus at `path` (a text file, or a directory read as the file
// comment says) and splits it; val_fraction in (0, 1). Errors, each naming
// the path: InvalidArgument for a val_fraction outside (0, 1), NotFound for
// a missing path (for the default path, saying which Debian package to
// install), FailedPrecondition for a file that is not text, a directory with
// no text file, an empty corpus, or a split left empty; a path (or a file of
// the directory) that is a FIFO, a device or a socket is refused
// (FailedPrecondition) before it is read, and OutOfRange for more than
// kMaxCorpusBytes; the reading's own errors with the file and errno's
// text.
absl::StatusOr<TextCorpus> LoadTextCorpus(const std::string& path, double val_fraction);

// Checks that both splits hold at least one window of seq + 1 tokens
// (seq >= 1); FailedPrecondition naming the corpus and what to change else.
absl::Status CheckCorpusFits(const TextCorpus& corpus, int64_t seq);

// The default corpus (the directory of the Debian package CorpusPackage())
// and the package's name, for messages and `make deps`.
const char* DefaultCorpusPath();
const char* CorpusPackage();

// The training stream over one token array (see the file comment).
// Copyable; the tokens are not owned.
class WindowSampler {
 public:
  // `tokens` must outlive the sampler and hold at least seq + 1 tokens;
  // seq >= 1. InvalidArgument otherwise.
  static absl::StatusOr<WindowSampler> Create(const std::vector<uint8_t>* tokens, int64_t seq,
                                              uint64_t seed);

  // floor((tokens - 1) / seq): the windows of one epoch.
  int64_t windows_per_epoch() const { return windows_; }
  int64_t seq() const { return seq_; }

  // The window (in [0, windows_per_epoch())) at stream index `index` >= 0:
  // position index % windows of epoch index / windows's permutation.
  int64_t WindowAt(int64_t index) const;

  // Writes tokens and targets [batch, seq] (int32, row-major) of the
  // windows at stream indices first .. first + batch - 1. Thread-safe (pure).
  void Fill(int64_t first, int64_t batch, int32_t* tokens, int32_t* targets) const;

 private:
  WindowSampler(const std::vector<uint8_t>* tokens, int64_t seq, uint64_t seed);

  const std::vector<uint8_t>* tokens_;
  int64_t seq_;
  uint64_t seed_;
  int64_t windows_;
  int half_bits_;  // the Feistel network's half width: 4^half_bits_ >= windows_
};

// The validation windows: the same windows as the sampler's, in order, no
// shuffle. ValWindows is floor((val.size() - 1) / seq), 0 when val holds
// fewer than seq + 1 tokens; FillValWindow writes window i < ValWindows
// (tokens and targets, seq int32 each).
int64_t ValWindows(const std::vector<uint8_t>& val, int64_t seq);
void FillValWindow(const std::vector<uint8_t>& val, int64_t seq, int64_t i, int32_t* tokens,
                   int32_t* targets);

// The distributed sampler. A step of `world` ranks with `accum`
// micro-batches of `batch` sequences each consumes WindowsPerStep windows of
// the stream; rank r's micro-batch m of a step that starts at stream index
// `consumed` takes indices FirstWindow(consumed, r, m, accum, batch) .. +
// batch - 1. The ranks' micro-batches are disjoint and together cover
// [consumed, consumed + WindowsPerStep), and a one-rank run with world *
// accum micro-batches takes the same windows; since the position is only
// `consumed`, a resume at another world size continues the same stream.
inline int64_t WindowsPerStep(int world, int accum, int64_t batch) {
  return static_cast<int64_t>(world) * accum * batch;
}
inline int64_t FirstWindow(int64_t consumed, int rank, int micro, int accum, int64_t batch) {
  return consumed + (static_cast<int64_t>(rank) * accum + micro) * batch;
}

}  // namespace gpt
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_GPT_TEXT_DATA_H_
