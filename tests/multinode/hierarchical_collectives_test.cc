// Hierarchical collectives against flat ones, on the emulated cluster
// (hierarchical_collectives_test.sh runs it on 2 nodes x 2 ranks and on 4
// nodes x 1): two mpi communicators over the same ranks, one with
// CommOptions::topology kFlat, one kHierarchical, run the same random
// reduce-scatters, all-gathers and all-reduces (random sizes, from one
// element to several pipeline chunks, and every dtype); each result must be
// bitwise equal to the flat one and within rounding of a double-precision
// sum. The hierarchical all-gathers must send fewer bytes across nodes (the
// communicators' counters), so a silent fall-back to the flat path fails.
// Then the same on Split groups: one whose nodes have unequal rank counts
// (still hierarchical) and one whose ranks are not consecutive per node
// (flat, and saying why).
//
//   hierarchical_collectives_test NODES RANKS_PER_NODE   (under mpirun)
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/dtype.h"

namespace zeroshard {
namespace {

int g_rank = 0;
int g_failures = 0;
uint64_t g_seed = 0;

#define CHECK_OR_FAIL(cond, ...)                                    \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::printf("rank %d: FAIL: %s (seed %llu): ", g_rank, #cond, \
                  static_cast<unsigned long long>(g_seed));         \
      std::printf(__VA_ARGS__);                                     \
      std::printf("\n");                                            \
      std::fflush(stdout);                                          \
      ++g_failures;                                                 \
    }                                                               \
  } while (0)

// Rank `rank`'s data of round `round`: every rank can make every rank's.
std::vector<char> RankData(DType dtype, int64_t count, int round, int rank) {
  std::mt19937_64 rng(g_seed ^ (uint64_t{0x9e3779b97f4a7c15} * (round * 64 + rank + 1)));
  std::vector<char> bytes(count * DTypeSize(dtype));
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-10, 10);
  for (int64_t i = 0; i < count; ++i) {
    const double x = std::ldexp(mantissa(rng), exponent(rng));
    char* at = bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat32: {
        const float v = static_cast<float>(x);
        std::memcpy(at, &v, 4);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t v = Fp32ToBf16(static_cast<float>(x));
        std::memcpy(at, &v, 2);
        break;
      }
      case DType::kFloat16: {
        const uint16_t v = Fp32ToFp16(static_cast<float>(x / 64));
        std::memcpy(at, &v, 2);
        break;
      }
      case DType::kFloat64:
        std::memcpy(at, &x, 8);
        break;
      case DType::kInt64: {
        const int64_t v = static_cast<int64_t>(rng());
        std::memcpy(at, &v, 8);
        break;
      }
      case DType::kUInt8:
        *at = static_cast<char>(rng());
        break;
    }
  }
  return bytes;
}

double ToDouble(DType dtype, const char* at) {
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, at, 4);
      return v;
    }
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, at, 2);
      return Bf16ToFp32(v);
    }
    case DType::kFloat16: {
      uint16_t v;
      std::memcpy(&v, at, 2);
      return Fp16ToFp32(v);
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, at, 8);
      return v;
    }
    default:
      return 0;
  }
}

// The unit roundoff of the dtype's result.
double Epsilon(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return std::ldexp(1.0, -8);
    case DType::kFloat16:
      return std::ldexp(1.0, -11);
    case DType::kFloat32:
      return std::ldexp(1.0, -24);
    default:
      return std::ldexp(1.0, -53);
  }
}

enum class Kind { kReduceScatter, kAllGather, kAllReduce };
const char* KindName(Kind kind) {
  return kind == Kind::kReduceScatter ? "reduce-scatter"
         : kind == Kind::kAllGather   ? "all-gather"
                                      : "all-reduce";
}

struct Round {
  Kind kind;
  DType dtype;
  int64_t count;  // per rank: the reduce-scatter's result, the all-gather's block
};

// The element `i` of the expected result, as a double-precision sum of the
// ranks' inputs (i indexes the all-reduce's whole buffer or this rank's
// reduce-scatter block), with its error bound. Int64: exact, wrapped.
void Reference(const Round& r, const std::vector<std::vector<char>>& all, int64_t i, double* value,
               double* bound, int64_t* exact) {
  const int64_t esize = DTypeSize(r.dtype);
  double sum = 0;
  double magnitude = 0;
  uint64_t wrapped = 0;
  for (const std::vector<char>& data : all) {
    const char* at = data.data() + i * esize;
    if (r.dtype == DType::kInt64) {
      int64_t v;
      std::memcpy(&v, at, 8);
      wrapped += static_cast<uint64_t>(v);
    } else {
      const double x = ToDouble(r.dtype, at);
      sum += x;
      magnitude += std::fabs(x);
    }
  }
  *value = sum;
  // Sums in fp32 (fp64) over the ranks, then one rounding to the dtype.
  const double acc_eps = r.dtype == DType::kFloat64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  *bound = static_cast<double>(all.size()) * acc_eps * magnitude +
           Epsilon(r.dtype) * std::fabs(sum) + 1e-300;
  if (r.dtype == DType::kFloat16) *bound += std::ldexp(1.0, -24);  // subnormal spacing
  *exact = static_cast<int64_t>(wrapped);
}

// Runs `r` on `flat` and `hier` (the same ranks); checks the bits agree and
// the sums are right. Returns the inter-node bytes each sent for it.
void RunRound(const Round& r, int round, Communicator& flat, Communicator& hier,
              int64_t* flat_inter, int64_t* hier_inter) {
  const int world = flat.size();
  const int me = flat.rank();
  const int64_t esize = DTypeSize(r.dtype);
  const int64_t send_count = r.kind == Kind::kReduceScatter ? r.count * world : r.count;
  const int64_t recv_count = r.kind == Kind::kReduceScatter ? r.count
                             : r.kind == Kind::kAllGather   ? r.count * world
                                                            : r.count;
  std::vector<char> send = RankData(r.dtype, send_count, round, me);
  std::vector<char> got_flat(recv_count * esize, 0x5a);
  std::vector<char> got_hier(recv_count * esize, 0x3c);
  const CommTraffic flat_before = flat.traffic();
  const CommTraffic hier_before = hier.traffic();
  absl::Status a, b;
  switch (r.kind) {
    case Kind::kReduceScatter:
      a = flat.ReduceScatter(send.data(), got_flat.data(), r.count, r.dtype).Wait();
      b = hier.ReduceScatter(send.data(), got_hier.data(), r.count, r.dtype).Wait();
      break;
    case Kind::kAllGather:
      a = flat.AllGather(send.data(), got_flat.data(), r.count, r.dtype).Wait();
      b = hier.AllGather(send.data(), got_hier.data(), r.count, r.dtype).Wait();
      break;
    case Kind::kAllReduce: {
      // In place on the hierarchical side: recv is send.
      a = flat.AllReduce(send.data(), got_flat.data(), r.count, r.dtype).Wait();
      std::memcpy(got_hier.data(), send.data(), send.size());
      b = hier.AllReduce(got_hier.data(), got_hier.data(), r.count, r.dtype).Wait();
      break;
    }
  }
  *flat_inter = flat.traffic().inter_node_bytes - flat_before.inter_node_bytes;
  *hier_inter = hier.traffic().inter_node_bytes - hier_before.inter_node_bytes;
  const std::string what = absl::StrFormat("round %d: %s of %d %s per rank", round,
                                           KindName(r.kind), r.count, DTypeName(r.dtype));
  CHECK_OR_FAIL(a.ok(), "%s: flat: %s", what.c_str(), std::string(a.message()).c_str());
  CHECK_OR_FAIL(b.ok(), "%s: hierarchical: %s", what.c_str(), std::string(b.message()).c_str());
  if (!a.ok() || !b.ok()) return;
  const int differ = std::memcmp(got_flat.data(), got_hier.data(), got_flat.size());
  CHECK_OR_FAIL(differ == 0, "%s: hierarchical result differs from the flat one", what.c_str());

  if (r.kind == Kind::kAllGather) {
    for (int p = 0; p < world; ++p) {
      const std::vector<char> theirs = RankData(r.dtype, r.count, round, p);
      CHECK_OR_FAIL(
          std::memcmp(got_hier.data() + p * r.count * esize, theirs.data(), theirs.size()) == 0,
          "%s: rank %d's block", what.c_str(), p);
    }
    return;
  }
  // The inputs of the elements this rank holds, every rank's.
  std::vector<std::vector<char>> all;
  const int64_t first = r.kind == Kind::kReduceScatter ? me * r.count : 0;
  for (int p = 0; p < world; ++p) {
    std::vector<char> data = RankData(r.dtype, send_count, round, p);
    all.emplace_back(data.begin() + first * esize, data.begin() + (first + recv_count) * esize);
  }
  int64_t bad = 0;
  int64_t first_bad = -1;
  for (int64_t i = 0; i < recv_count; ++i) {
    double value, bound;
    int64_t exact;
    Reference(r, all, i, &value, &bound, &exact);
    bool ok;
    if (r.dtype == DType::kInt64) {
      int64_t v;
      std::memcpy(&v, got_hier.data() + i * esize, 8);
      ok = v == exact;
    } else {
      ok = std::fabs(ToDouble(r.dtype, got_hier.data() + i * esize) - value) <= bound;
    }
    if (!ok && bad++ == 0) first_bad = i;
  }
  CHECK_OR_FAIL(bad == 0, "%s: %lld elements off the double-precision sum, the first at %lld",
                what.c_str(), static_cast<long long>(bad), static_cast<long long>(first_bad));
}

// `kind` -1: a random one.
Round RandomRound(std::mt19937_64& rng, bool large, int kind) {
  static const DType kSummable[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                    DType::kFloat64, DType::kInt64};
  Round r;
  r.kind = static_cast<Kind>(kind >= 0 ? kind : static_cast<int>(rng() % 3));
  r.dtype = r.kind == Kind::kAllGather && rng() % 6 == 0 ? DType::kUInt8 : kSummable[rng() % 5];
  // Small: latency-bound, ragged all-reduce pieces (count < ranks included).
  // Large: several 1 MiB chunks of the chain per block.
  r.count =
      large ? 200000 + static_cast<int64_t>(rng() % 500000) : 1 + static_cast<int64_t>(rng() % 300);
  return r;
}

// Random rounds on a pair of groups over the same ranks. Returns the
// inter-node bytes of the large all-gathers on each.
void RunRounds(int rounds, int first_round, Communicator& flat, Communicator& hier,
               int64_t* gather_flat, int64_t* gather_hier) {
  std::mt19937_64 rng(g_seed + first_round);
  *gather_flat = *gather_hier = 0;
  for (int i = 0; i < rounds; ++i) {
    // Every third round large; the first two of each kind are fixed to make
    // sure each appears large at least once.
    Round r = RandomRound(rng, i % 3 == 0 || i < 3, i < 3 ? i : -1);
    int64_t f = 0, h = 0;
    RunRound(r, first_round + i, flat, hier, &f, &h);
    if (r.kind == Kind::kAllGather && r.count >= 200000) {
      *gather_flat += f;
      *gather_hier += h;
    }
  }
}

int Run(int nodes, int ranks_per_node) {
  CommOptions flat_options;
  flat_options.topology = CollectiveTopology::kFlat;
  flat_options.timeout = absl::Seconds(120);
  CommOptions hier_options = flat_options;
  hier_options.topology = CollectiveTopology::kHierarchical;
  auto flat = CreateMpiCommunicator(flat_options);
  if (!flat.ok()) {
    std::printf("FAIL: %s\n", std::string(flat.status().message()).c_str());
    return 1;
  }
  auto hier = CreateMpiCommunicator(hier_options);
  if (!hier.ok()) {
    std::printf("FAIL: %s\n", std::string(hier.status().message()).c_str());
    return 1;
  }
  g_rank = (*flat)->rank();
  const int world = (*flat)->size();
  int64_t seed = 0;
  if (g_rank == 0) seed = static_cast<int64_t>(::zeroshard::testing::Seed());
  if (!(*flat)->Broadcast(&seed, 1, DType::kInt64, 0).Wait().ok()) return 1;
  g_seed = static_cast<uint64_t>(seed);

  const NodeLayout layout = (*hier)->node_layout();
  CHECK_OR_FAIL(layout.num_nodes() == nodes && layout.max_ranks_per_node() == ranks_per_node &&
                    world == nodes * ranks_per_node,
                "expected %d nodes x %d ranks, the communicator sees %s", nodes, ranks_per_node,
                layout.Describe().c_str());
  CHECK_OR_FAIL(absl::StartsWith((*hier)->collective_path(), "hierarchical:"), "path: %s",
                (*hier)->collective_path().c_str());
  CHECK_OR_FAIL(absl::StartsWith((*flat)->collective_path(), "flat:"), "path: %s",
                (*flat)->collective_path().c_str());
  if (g_rank == 0) std::printf("%s\n", (*hier)->collective_path().c_str());

  int64_t gather_flat = 0, gather_hier = 0;
  RunRounds(18, 0, **flat, **hier, &gather_flat, &gather_hier);
  // A block crosses to each other node once instead of to each rank there:
  // 1/ranks_per_node of the flat bytes, plus the descriptor exchange.
  if (ranks_per_node > 1) {
    CHECK_OR_FAIL(gather_hier * ranks_per_node < gather_flat * 1.05,
                  "large all-gathers sent %lld bytes across nodes hierarchically, %lld flat: "
                  "the hierarchical path did not run",
                  static_cast<long long>(gather_hier), static_cast<long long>(gather_flat));
  } else {
    CHECK_OR_FAIL(gather_hier <= gather_flat * 1.05 && gather_hier * 1.05 >= gather_flat,
                  "one rank per node: %lld vs %lld bytes", static_cast<long long>(gather_hier),
                  static_cast<long long>(gather_flat));
  }
  if (g_rank == 0) {
    std::printf("large all-gathers across nodes: %lld bytes flat, %lld hierarchical (rank 0)\n",
                static_cast<long long>(gather_flat), static_cast<long long>(gather_hier));
  }

  // Groups of the world without its last rank: nodes of unequal size when
  // a node has several ranks (2 + 1 on 2 x 2; 3 nodes of 1 on 4 x 1).
  const int color = g_rank < world - 1 ? 0 : -1;
  auto flat_part = (*flat)->Split(color, g_rank);
  auto hier_part = (*hier)->Split(color, g_rank);
  CHECK_OR_FAIL(flat_part.ok() && hier_part.ok(), "Split of all but the last rank");
  if (flat_part.ok() && hier_part.ok() && *flat_part != nullptr) {
    CHECK_OR_FAIL(absl::StartsWith((*hier_part)->collective_path(), "hierarchical:"),
                  "uneven group: %s", (*hier_part)->collective_path().c_str());
    RunRounds(9, 100, **flat_part, **hier_part, &gather_flat, &gather_hier);
  }
  // Ranks ordered so that consecutive ones sit on different nodes: the chain
  // would not add in rank order, so the group must run flat and say why.
  if (nodes > 1 && ranks_per_node > 1) {
    const int key = (g_rank % ranks_per_node) * nodes + g_rank / ranks_per_node;
    auto mixed = (*hier)->Split(0, key);
    CHECK_OR_FAIL(mixed.ok() && absl::StrContains((*mixed)->collective_path(), "not consecutive"),
                  "interleaved group: %s",
                  mixed.ok() ? (*mixed)->collective_path().c_str()
                             : std::string(mixed.status().message()).c_str());
    if (mixed.ok()) {
      auto mixed_flat = (*flat)->Split(0, key);
      if (mixed_flat.ok()) RunRounds(6, 200, **mixed_flat, **mixed, &gather_flat, &gather_hier);
    }
  }
  // Offers of different lengths: the even ranks queue three small
  // collectives while their first waits for the odd ranks, which issue them
  // one at a time. The ranks agree to run one at a time (the shortest
  // offer); every rank must then move it the same way (hierarchically), or
  // the messages never meet. A 10 s timeout turns that bug into a failure.
  {
    CommOptions quick = hier_options;
    quick.timeout = absl::Seconds(10);
    auto offers = CreateMpiCommunicator(quick);
    CHECK_OR_FAIL(offers.ok(), "communicator for the offers check");
    if (offers.ok()) {
      const int64_t n = 4096;
      std::vector<float> a(n * world), b(n * world), c(n * world);
      std::vector<float> mine(n, static_cast<float>(g_rank + 1));
      std::vector<CommHandle> handles;
      if (g_rank % 2 == 0) {
        handles.push_back((*offers)->AllGather(mine.data(), a.data(), n, DType::kFloat32));
        handles.push_back((*offers)->AllGather(mine.data(), b.data(), n, DType::kFloat32));
        handles.push_back((*offers)->AllGather(mine.data(), c.data(), n, DType::kFloat32));
        for (CommHandle& h : handles) {
          const absl::Status s = h.Wait();
          CHECK_OR_FAIL(s.ok(), "offers check: %s", std::string(s.message()).c_str());
        }
      } else {
        absl::SleepFor(absl::Milliseconds(300));
        for (std::vector<float>* out : {&a, &b, &c}) {
          const absl::Status s =
              (*offers)->AllGather(mine.data(), out->data(), n, DType::kFloat32).Wait();
          CHECK_OR_FAIL(s.ok(), "offers check: %s", std::string(s.message()).c_str());
        }
      }
      for (const std::vector<float>* out : {&a, &b, &c}) {
        for (int p = 0; p < world; ++p) {
          CHECK_OR_FAIL((*out)[p * n] == p + 1 && (*out)[p * n + n - 1] == p + 1,
                        "offers check: rank %d's block", p);
        }
      }
    }
  }

  int failures = g_failures;
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    std::printf(total == 0 ? "PASS: %d nodes x %d ranks\n" : "FAIL: %d nodes x %d ranks\n", nodes,
                ranks_per_node);
  }
  return total == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s NODES RANKS_PER_NODE (under mpirun)\n", argv[0]);
    return 2;
  }
  const int rc = zeroshard::Run(std::atoi(argv[1]), std::atoi(argv[2]));
  // Rank 0 finalizes 3 s after the others (mlp_demo's rank 0 runs its
  // baseline first): the others wait for it in StopHeartbeats' barrier,
  // which once gave up after 2 s and freed the active barrier request, an
  // error that aborted the job.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) absl::SleepFor(absl::Seconds(3));
  zeroshard::FinalizeMpi();
  return rc;
}
