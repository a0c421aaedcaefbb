// The flag helper of the tools, examples and benchmarks (cli/flags.h): the
// value rules at their bounds and on random values (the expected values are
// computed here, from the digits and units the test writes), the wording of
// their errors, and FlagSet's walk over argv.
#include "cli/flags.h"

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::cli {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// argv for FlagSet::Parse from a list of words (argv[0] is the program).
class Argv {
 public:
  explicit Argv(std::vector<std::string> words) : words_(std::move(words)) {
    words_.insert(words_.begin(), "prog");
    for (std::string& w : words_) ptrs_.push_back(w.data());
  }
  int argc() const { return static_cast<int>(ptrs_.size()); }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> words_;
  std::vector<char*> ptrs_;
};

TEST(ParseIntFlagTest, BoundsAreInclusiveAndTheMessageNamesFlagValueAndRange) {
  EXPECT_EQ(ParseIntFlag("--tp", "1", 1, 1024).value_or(-1), 1);
  EXPECT_EQ(ParseIntFlag("--tp", "1024", 1, 1024).value_or(-1), 1024);
  const absl::StatusOr<int64_t> above = ParseIntFlag("--tp", "1025", 1, 1024);
  ASSERT_FALSE(above.ok());
  EXPECT_EQ(above.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(above.status().message(), "--tp: '1025' is not an integer in [1, 1024]");
  EXPECT_EQ(ParseIntFlag("--tp", "0", 1, 1024).status().message(),
            "--tp: '0' is not an integer in [1, 1024]");
  EXPECT_EQ(ParseIntFlag("--seq", "-3", 1, kNoUpperBound).status().message(),
            "--seq: '-3' is not an integer >= 1");
  EXPECT_EQ(ParseIntFlag("--cpus", "x", 0, 8, " (0: unbound)").status().message(),
            "--cpus: 'x' is not an integer in [0, 8] (0: unbound)");
}

TEST(ParseIntFlagTest, RefusesWhatIsNotOneWholeDecimalNumber) {
  for (const char* bad : {"", "1.5", "12x", "x12", "1e3", "0x10", "--3", "99999999999999999999"}) {
    const absl::StatusOr<int64_t> v = ParseIntFlag("--steps", bad, 1, kNoUpperBound);
    EXPECT_FALSE(v.ok()) << "'" << bad << "' was accepted as " << *v;
    if (!v.ok()) {
      EXPECT_EQ(v.status().message(), absl::StrCat("--steps: '", bad, "' is not an integer >= 1"));
    }
  }
}

TEST(ParseIntFlagTest, RandomValuesInAndOutOfRandomRanges) {
  std::mt19937_64 rng(Seed());
  std::uniform_int_distribution<int64_t> bound(-(int64_t{1} << 40), int64_t{1} << 40);
  for (int i = 0; i < 500; ++i) {
    int64_t lo = bound(rng), hi = bound(rng);
    if (lo > hi) std::swap(lo, hi);
    const int64_t inside = std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    const absl::StatusOr<int64_t> ok = ParseIntFlag("--n", std::to_string(inside), lo, hi);
    ASSERT_TRUE(ok.ok()) << ok.status() << "; " << SeedTrace();
    EXPECT_EQ(*ok, inside) << SeedTrace();
    const int64_t outside = rng() % 2 == 0 ? lo - 1 - static_cast<int64_t>(rng() % 1000)
                                           : hi + 1 + static_cast<int64_t>(rng() % 1000);
    EXPECT_FALSE(ParseIntFlag("--n", std::to_string(outside), lo, hi).ok())
        << outside << " outside [" << lo << ", " << hi << "]; " << SeedTrace();
  }
}

TEST(ParseIntListFlagTest, RandomListsRoundTripAndABadItemIsNamed) {
  std::mt19937_64 rng(Seed() + 1);
  for (int i = 0; i < 100; ++i) {
    std::vector<int64_t> want(1 + rng() % 6);
    for (int64_t& v : want) v = 1 + static_cast<int64_t>(rng() % 64);
    const std::string text = absl::StrJoin(want, ",");
    const absl::StatusOr<std::vector<int64_t>> got = ParseIntListFlag("--ranks", text, 1, 64);
    ASSERT_TRUE(got.ok()) << got.status() << "; " << SeedTrace();
    EXPECT_EQ(*got, want) << text << "; " << SeedTrace();
  }
  EXPECT_EQ(ParseIntListFlag("--ranks", "1,0,2", 1, 64).status().message(),
            "--ranks: '0' in '1,0,2' is not an integer in [1, 64]; give a comma-separated list");
  EXPECT_EQ(ParseIntListFlag("--ranks", "1,,2", 1, 64).status().message(),
            "--ranks: '' in '1,,2' is not an integer in [1, 64]; give a comma-separated list");
  EXPECT_FALSE(ParseIntListFlag("--ranks", "", 1, 64).ok());
  EXPECT_FALSE(ParseIntListFlag("--ranks", "2,65", 1, 64).ok());
}

TEST(ParseSizeFlagTest, UnitsAndBounds) {
  EXPECT_EQ(ParseSizeFlag("--mem-cap", "16MiB").value_or(-1), int64_t{16} * 1024 * 1024);
  EXPECT_EQ(ParseSizeFlag("--mem-cap", "16M").value_or(-1), int64_t{16} * 1024 * 1024);
  EXPECT_EQ(ParseSizeFlag("--mem-cap", "2GB").value_or(-1), int64_t{2000000000});
  EXPECT_EQ(ParseSizeFlag("--min-bytes", "4096").value_or(-1), 4096);
  EXPECT_EQ(ParseSizeFlag("--min-bytes", "4", 4, int64_t{1} << 40).value_or(-1), 4);
  EXPECT_FALSE(ParseSizeFlag("--min-bytes", "3", 4, int64_t{1} << 40).ok());
  const absl::StatusOr<int64_t> big = ParseSizeFlag("--max-bytes", "2TiB", 4, int64_t{1} << 40);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().message(),
            "--max-bytes: '2TiB' is 2199023255552 bytes, above the largest allowed, "
            "1099511627776 (1024.0 GiB)");
  const absl::StatusOr<int64_t> unit = ParseSizeFlag("--mem-cap", "16 parsecs");
  ASSERT_FALSE(unit.ok());
  EXPECT_NE(unit.status().message().find("--mem-cap: '16 parsecs'"), absl::string_view::npos)
      << unit.status();
}

TEST(ParseSizeFlagTest, RandomCountsTimesEachUnit) {
  struct Unit {
    const char* suffix;
    int64_t bytes;
  };
  const Unit units[] = {{"", 1},
                        {"B", 1},
                        {"KiB", 1024},
                        {"MiB", 1024 * 1024},
                        {"GiB", int64_t{1024} * 1024 * 1024},
                        {"KB", 1000},
                        {"MB", 1000 * 1000},
                        {"GB", int64_t{1000} * 1000 * 1000}};
  std::mt19937_64 rng(Seed() + 2);
  for (int i = 0; i < 200; ++i) {
    const Unit& u = units[rng() % (sizeof(units) / sizeof(units[0]))];
    const int64_t count = 1 + static_cast<int64_t>(rng() % 4096);
    const std::string text = absl::StrCat(count, u.suffix);
    const absl::StatusOr<int64_t> got = ParseSizeFlag("--size", text);
    ASSERT_TRUE(got.ok()) << got.status() << "; " << SeedTrace();
    EXPECT_EQ(*got, count * u.bytes) << text << "; " << SeedTrace();
  }
}

TEST(ParseNumberAndChoiceTest, RangesAndWords) {
  EXPECT_EQ(ParseNumberFlag("--lr", "0.003", 0, 1e30).value_or(-1), 0.003);
  EXPECT_EQ(ParseNumberFlag("--lr", "-1", 0, 1e30).status().message(),
            "--lr: '-1' is outside [0, 1e+30]; give a number in that range");
  EXPECT_FALSE(ParseNumberFlag("--lr", "nan", 0, 1e30).ok());
  EXPECT_EQ(ParseNumberFlag("--x", "0.5", 0, 60, /*lo_open=*/true).value_or(-1), 0.5);
  EXPECT_EQ(ParseNumberFlag("--x", "0", 0, 60, /*lo_open=*/true).status().message(),
            "--x: '0' is outside (0, 60]; give a number in that range");
  EXPECT_FALSE(ParseNumberFlag("--lr", "inf", 0, kNoUpperBound).ok());
  // With a unit: the estimator's documented wording (docs/estimator.md).
  EXPECT_EQ(ParseNumberFlag("--intra-node-bw", "1000001", 0.001, 1e6, false, "GB/s per GPU")
                .status()
                .message(),
            "--intra-node-bw: '1000001' is outside [0.001, 1000000] (GB/s per GPU); give a number "
            "in that range");
  EXPECT_EQ(ParseNumberFlag("--mfu", "x", 0.001, 1, false, "fraction of peak").status().message(),
            "--mfu: 'x' is not a number in [0.001, 1] (fraction of peak); give a number in that "
            "range");
  EXPECT_EQ(ParseChoiceFlag("--backend", "mpi", {"local", "mpi"}).value_or(-1), 1);
  EXPECT_EQ(ParseChoiceFlag("--backend", "tcp", {"local", "mpi"}).status().message(),
            "--backend: 'tcp' is not local or mpi");
  EXPECT_EQ(ParseChoiceFlag("--precision", "fp8", {"fp32", "bf16", "fp16"}).status().message(),
            "--precision: 'fp8' is not fp32, bf16 or fp16");
  EXPECT_EQ(ParseChoiceFlag("--mode", "x", {"only"}).status().message(), "--mode: 'x' is not only");
}

struct Parsed {
  int steps = 10;
  int64_t hidden = 256;
  std::vector<int> ranks = {1, 2};
  int64_t cap = 0;
  double lr = 0.1;
  int backend = 0;
  bool resume = false;
  std::string dir;
};

FlagSet MakeFlags(Parsed* p) {
  FlagSet flags;
  flags.Int("steps", &p->steps, 1, 1 << 30)
      .Int("hidden", &p->hidden, 1, 1 << 20)
      .IntList("ranks", &p->ranks, 1, 64)
      .Size("mem-cap", &p->cap)
      .Number("lr", &p->lr, 0, 10)
      .Choice("backend", {"local", "mpi"}, &p->backend)
      .Switch("resume", &p->resume)
      .String("dir", &p->dir);
  return flags;
}

TEST(FlagSetTest, EveryKindOfFlagBothSpellings) {
  Parsed p;
  Argv args({"--steps", "7", "--hidden=512", "--ranks", "4,2", "--mem-cap=16MiB", "--lr", "0.5",
             "--backend", "mpi", "--resume", "--dir", "/tmp/x"});
  bool help = true;
  ASSERT_TRUE(MakeFlags(&p).Parse(args.argc(), args.argv(), &help).ok());
  EXPECT_FALSE(help);
  EXPECT_EQ(p.steps, 7);
  EXPECT_EQ(p.hidden, 512);
  EXPECT_EQ(p.ranks, (std::vector<int>{4, 2}));
  EXPECT_EQ(p.cap, 16 << 20);
  EXPECT_EQ(p.lr, 0.5);
  EXPECT_EQ(p.backend, 1);
  EXPECT_TRUE(p.resume);
  EXPECT_EQ(p.dir, "/tmp/x");
}

TEST(FlagSetTest, DefaultsStayAndTheLastOfTwoWins) {
  Parsed p;
  Argv args({"--steps", "3", "--steps=5"});
  bool help = false;
  ASSERT_TRUE(MakeFlags(&p).Parse(args.argc(), args.argv(), &help).ok());
  EXPECT_EQ(p.steps, 5);
  EXPECT_EQ(p.hidden, 256);
  EXPECT_EQ(p.ranks, (std::vector<int>{1, 2}));
}

TEST(FlagSetTest, HelpStopsTheWalk) {
  Parsed p;
  Argv args({"--steps", "3", "-h", "--steps", "0"});
  bool help = false;
  ASSERT_TRUE(MakeFlags(&p).Parse(args.argc(), args.argv(), &help).ok());
  EXPECT_TRUE(help);
  EXPECT_EQ(p.steps, 3);
}

TEST(FlagSetTest, ErrorsNameTheArgument) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--steps", "0"}, "--steps: '0' is not an integer in [1, 1073741824]"},
      {{"--steps"}, "flag --steps needs a value"},
      {{"--stpes", "3"}, "unknown flag --stpes"},
      {{"steps"}, "unexpected argument 'steps'"},
      {{"--resume=yes"}, "--resume: 'yes' given to a switch, which takes no value"},
      {{"--backend", "tcp"}, "--backend: 'tcp' is not local or mpi"},
      {{"--dir="}, "--dir: the value is empty"},
  };
  for (const auto& [words, message] : cases) {
    Parsed p;
    Argv args(words);
    bool help = false;
    const absl::Status s = MakeFlags(&p).Parse(args.argc(), args.argv(), &help);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << absl::StrJoin(words, " ");
    EXPECT_EQ(s.message(), message) << absl::StrJoin(words, " ");
  }
}

TEST(FlagSetTest, AFlagRegisteredTwiceIsAProgrammingError) {
  int a = 0, b = 0;
  FlagSet flags;
  flags.Int("n", &a, 0, 9).Int("n", &b, 0, 9);
  Argv args({});
  bool help = false;
  EXPECT_EQ(flags.Parse(args.argc(), args.argv(), &help).code(), absl::StatusCode::kInternal);
}

TEST(ParseFlagMapTest, ValuesSwitchesAndEachErrorOnce) {
  const std::set<std::string> values = {"--gpus", "--out"};
  const std::set<std::string> switches = {"--json", "-h"};
  const absl::StatusOr<std::map<std::string, std::string>> flags =
      ParseFlagMap({"--gpus", "8", "--out=x.json", "--json"}, values, switches, "tool --help");
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(*flags, (std::map<std::string, std::string>{
                        {"--gpus", "8"}, {"--out", "x.json"}, {"--json", "1"}}));
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--gpus", "8", "--gpus=4"}, "--gpus is given twice"},
      {{"--gpus"}, "--gpus needs a value"},
      {{"--json=yes"}, "--json takes no value"},
      {{"--bogus", "1"}, "unknown argument '--bogus'; see `tool --help`"},
      {{"8"}, "unknown argument '8'; see `tool --help`"},
  };
  for (const auto& [args, message] : cases) {
    const absl::Status s = ParseFlagMap(args, values, switches, "tool --help").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << absl::StrJoin(args, " ");
    EXPECT_EQ(s.message(), message) << absl::StrJoin(args, " ");
  }
}

}  // namespace
}  // namespace zeroshard::cli
