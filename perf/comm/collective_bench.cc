// collective_bench: all-reduce, reduce-scatter and all-gather bandwidth of a
// communicator backend, with nccl-tests' definitions, against a memcpy of
// the same bytes measured in the same run.
//
//   build/perf/comm/collective_bench --ranks 2,3,4 --json build/perf/collectives_local.json
//   mpirun -np 4 build/perf/comm/collective_bench --backend mpi --json collectives_mpi_np4.json
//
// Definitions (nccl-tests, doc/PERFORMANCE.md):
//  - bytes: the full buffer, fp32 elements x 4: the all-reduce's buffer; the
//    reduce-scatter's input (n blocks, each rank receives one); the
//    all-gather's output (n blocks, each rank sends one). For n ranks the
//    element count is rounded down to a multiple of n for the last two.
//  - time: per collective, issued `iters` at a time back to back (each rank
//    issues them all, then waits for them in order), after `warmup` untimed
//    ones, between two barriers; the slowest rank's time (max over ranks).
//  - algbw = bytes / time (GB/s, 1e9 bytes).
//  - busbw = algbw * 2(n-1)/n (all-reduce), algbw * (n-1)/n (reduce-scatter,
//    all-gather): the bandwidth a ring implementation must sustain on each
//    link, comparable across n and with the hardware's limit.
//  - memcpy: one thread copies `bytes` from one buffer to another, on rank 0
//    right before the collectives of that size; the fastest of
//    max(iters, 5) copies (the machine's limit). busbw /
//    memcpy GB/s says how close the backend gets to the machine's own copy
//    (for the local backend all ranks share the one memory bus).
// Every result is checked: after the timed run each rank compares its output
// bit for bit with the rank-order fp32 sum ((x0 + x1) + x2) + ... (or the
// gathered blocks) of the inputs, which are a pure function of (rank, index);
// a mismatch fails the run (exit 1) instead of reporting a speed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/flags.h"
#include "nlohmann/json.hpp"
#include "perf/bench_backend.h"
#include "perf/bench_json.h"
#include "perf/bench_main.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

enum class Op { kAllReduce, kReduceScatter, kAllGather };
constexpr Op kOps[] = {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather};

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllGather:
      return "all_gather";
  }
  return "?";
}

// nccl-tests' bus bandwidth factor for n ranks.
double BusFactor(Op op, int n) {
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

struct BenchOptions {
  perf::BackendOptions backend{/*mpi=*/false, /*local_ranks=*/{2, 3, 4}};
  int64_t min_bytes = int64_t{1} << 10;
  int64_t max_bytes = int64_t{256} << 20;
  int factor = 4;  // sizes min_bytes * factor^k up to max_bytes
  // Timed iterations per size: enough to move about this many bytes, within
  // [min_iters, max_iters]; large sizes get few, small ones many.
  int64_t target_bytes = int64_t{512} << 20;
  int min_iters = 2;
  int max_iters = 200;
  std::string json_path;
};

void PrintUsage() {
  const BenchOptions d;
  std::printf(
      "usage: collective_bench [flags]\n"
      "all-reduce, reduce-scatter and all-gather time, algbw and busbw (nccl-tests\n"
      "definitions) against a memcpy of the same bytes; fp32.\n\n"
      "  --backend B        local (threads, default) or mpi (under mpirun)\n"
      "  --ranks LIST       local rank counts, comma separated (default 2,3,4)\n"
      "  --min-bytes SIZE   smallest buffer, bytes or e.g. 4KiB (default %lld)\n"
      "  --max-bytes SIZE   largest buffer (default %lld)\n"
      "  --factor F         size step (default %d)\n"
      "  --target-bytes SIZE bytes moved per size, sets the iterations (default %lld)\n"
      "  --min-iters N      (default %d)\n"
      "  --max-iters N      (default %d)\n"
      "  --json FILE        write the results as JSON\n"
      "  --help             this text\n",
      static_cast<long long>(d.min_bytes), static_cast<long long>(d.max_bytes), d.factor,
      static_cast<long long>(d.target_bytes), d.min_iters, d.max_iters);
}

absl::StatusOr<BenchOptions> ParseFlags(int argc, char** argv, bool* help) {
  constexpr int64_t kMaxBytes = int64_t{1} << 40;
  BenchOptions opts;
  cli::FlagSet flags;
  perf::AddBackendFlag(flags, &opts.backend);
  flags.IntList("ranks", &opts.backend.local_ranks, 1, 64)
      .Size("min-bytes", &opts.min_bytes, 4, kMaxBytes)
      .Size("max-bytes", &opts.max_bytes, 4, kMaxBytes)
      .Int("factor", &opts.factor, 2, cli::kMaxCount)
      .Size("target-bytes", &opts.target_bytes, 1, kMaxBytes)
      .Int("min-iters", &opts.min_iters, 1, cli::kMaxCount)
      .Int("max-iters", &opts.max_iters, 1, cli::kMaxCount)
      .String("json", &opts.json_path);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  if (opts.max_bytes < opts.min_bytes) {
    return absl::InvalidArgumentError("--max-bytes is below --min-bytes");
  }
  if (opts.max_iters < opts.min_iters) {
    return absl::InvalidArgumentError("--max-iters is below --min-iters");
  }
  return opts;
}

std::vector<int64_t> Sizes(const BenchOptions& opts) {
  std::vector<int64_t> sizes;
  for (int64_t b = opts.min_bytes; b <= opts.max_bytes; b *= opts.factor) sizes.push_back(b);
  return sizes;
}

int Iterations(const BenchOptions& opts, int64_t bytes) {
  const int64_t iters = opts.target_bytes / std::max<int64_t>(bytes, 1);
  return static_cast<int>(std::clamp<int64_t>(iters, opts.min_iters, opts.max_iters));
}

// Input element i of `rank`: exact small multiples of 2^-10, different per
// rank and index, so the rank-order sum is a known fp32 value but a wrong
// order or a missing rank still changes the bits (values of mixed magnitude).
float InputValue(int rank, int64_t i) {
  const uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>(rank * 40503u);
  const float mantissa = static_cast<float>((h >> 8) & 0xffff) / 1024.0f - 32.0f;
  return std::ldexp(mantissa, static_cast<int>((h >> 4) % 9) - 4) + 0.1f * static_cast<float>(rank);
}

float ReferenceSum(int world, int64_t i) {
  float sum = InputValue(0, i);
  for (int r = 1; r < world; ++r) sum += InputValue(r, i);
  return sum;
}

struct SizeResult {
  Op op = Op::kAllReduce;
  int ranks = 0;
  int64_t bytes = 0;  // the full buffer, after rounding to a multiple of the ranks
  int iters = 0;
  double seconds = 0;  // per collective, max over ranks
  double memcpy_seconds = 0;
  int64_t memcpy_bytes = 0;  // the size before rounding
  double AlgGbps() const { return bytes / seconds / 1e9; }
  double BusGbps() const { return AlgGbps() * BusFactor(op, ranks); }
  double MemcpyGbps() const { return memcpy_bytes / memcpy_seconds / 1e9; }
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One thread copies `bytes` max(iters, 5) times, after one untimed copy that
// faults the pages in; seconds of the fastest copy: the machine's limit,
// least disturbed by other processes on a shared machine.
double MemcpySeconds(int64_t bytes, int iters) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);
  double best = 0;
  for (int k = 0; k < std::max(iters, 5); ++k) {
    const double start = Now();
    std::memcpy(dst.data(), src.data(), bytes);
    // Keep the copies from being merged or dropped.
    asm volatile("" : : "r"(dst.data()) : "memory");
    const double seconds = Now() - start;
    if (k == 0 || seconds < best) best = seconds;
  }
  return best;
}

// The buffers of one collective on one rank.
struct Buffers {
  std::vector<float> send, recv;
};

Buffers MakeBuffers(Op op, int rank, int world, int64_t count) {
  Buffers b;
  const int64_t block = count / world;
  const int64_t send_count = op == Op::kAllGather ? block : count;
  const int64_t recv_count = op == Op::kReduceScatter ? block : count;
  b.send.resize(send_count);
  const int64_t offset = op == Op::kAllGather ? rank * block : 0;
  for (int64_t i = 0; i < send_count; ++i) b.send[i] = InputValue(rank, offset + i);
  b.recv.assign(recv_count, 0.0f);
  return b;
}

CommHandle Issue(Communicator& comm, Op op, Buffers& b) {
  const int64_t n = static_cast<int64_t>(b.recv.size());
  switch (op) {
    case Op::kAllReduce:
      return comm.AllReduce(b.send.data(), b.recv.data(), n, DType::kFloat32);
    case Op::kReduceScatter:
      return comm.ReduceScatter(b.send.data(), b.recv.data(), n, DType::kFloat32);
    case Op::kAllGather:
      return comm.AllGather(b.send.data(), b.recv.data(), b.send.size(), DType::kFloat32);
  }
  return CommHandle();
}

// The output compared bit for bit with the reference; InternalError naming
// the first wrong element.
absl::Status CheckOutput(Op op, int rank, int world, const Buffers& b, int64_t bytes) {
  const int64_t n = static_cast<int64_t>(b.recv.size());
  const int64_t offset = op == Op::kReduceScatter ? rank * n : 0;
  const int64_t block = op == Op::kAllGather ? n / world : 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = offset + i;
    const float expected =
        op == Op::kAllGather ? InputValue(static_cast<int>(i / block), i) : ReferenceSum(world, g);
    if (std::memcmp(&expected, &b.recv[i], sizeof(float)) != 0) {
      return absl::InternalError(absl::StrFormat(
          "%s of %d bytes on %d ranks: rank %d element %d is %.9g, expected %.9g (the "
          "rank-order sum or gathered block); the collective is wrong, no speed reported",
          OpName(op), bytes, world, rank, i, b.recv[i], expected));
    }
  }
  return absl::OkStatus();
}

// Every size and op on this rank; rank 0 gets the results.
absl::Status RunRank(const BenchOptions& opts, Communicator& comm,
                     std::vector<SizeResult>* results) {
  const int world = comm.size();
  const int rank = comm.rank();
  if (!opts.backend.mpi && rank == 0) {
    std::fprintf(stderr, "collective_bench: local, %d ranks\n", world);
  }
  for (int64_t size : Sizes(opts)) {
    const int iters = Iterations(opts, size);
    const int warmup = size >= (int64_t{16} << 20) ? 1 : 3;
    // The machine's copy of the same bytes, on rank 0 while the others wait.
    double memcpy_seconds = 0;
    if (rank == 0) memcpy_seconds = MemcpySeconds(size, iters);
    for (Op op : kOps) {
      const int64_t count = op == Op::kAllReduce ? size / 4 : (size / 4 / world) * world;
      if (count == 0) continue;
      Buffers b = MakeBuffers(op, rank, world, count);
      for (int k = 0; k < warmup; ++k) ZS_RETURN_IF_ERROR(Issue(comm, op, b).Wait());
      ZS_RETURN_IF_ERROR(comm.BarrierSync());
      const double start = Now();
      std::vector<CommHandle> handles;
      handles.reserve(iters);
      for (int k = 0; k < iters; ++k) handles.push_back(Issue(comm, op, b));
      for (CommHandle& h : handles) ZS_RETURN_IF_ERROR(h.Wait());
      const double seconds = (Now() - start) / iters;
      ZS_RETURN_IF_ERROR(CheckOutput(op, rank, world, b, count * 4));
      std::vector<double> all(world);
      ZS_RETURN_IF_ERROR(comm.AllGatherSync(&seconds, all.data(), 1, DType::kFloat64));
      if (rank == 0) {
        SizeResult r;
        r.op = op;
        r.ranks = world;
        r.bytes = count * 4;
        r.iters = iters;
        r.seconds = *std::max_element(all.begin(), all.end());
        r.memcpy_seconds = memcpy_seconds;
        r.memcpy_bytes = size;
        results->push_back(r);
      }
    }
  }
  return absl::OkStatus();
}

std::string HumanBytes(int64_t b) {
  if (b >= (int64_t{1} << 20) && b % (int64_t{1} << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  if (b >= 1024 && b % 1024 == 0) return absl::StrCat(b >> 10, " KiB");
  return absl::StrCat(b, " B");
}

void PrintTable(const std::string& backend, const std::vector<SizeResult>& results) {
  std::printf(
      "\ncollective_bench, backend %s, fp32 (bytes: the full buffer; busbw: nccl-tests;\n"
      "memcpy: one thread, same bytes, same run, fastest copy)\n",
      backend.c_str());
  std::printf("%-15s %5s %10s %6s %11s %10s %10s %11s %8s\n", "op", "ranks", "bytes", "iters",
              "time us", "algbw GB/s", "busbw GB/s", "memcpy GB/s", "bus/cpy");
  for (const SizeResult& r : results) {
    std::printf("%-15s %5d %10s %6d %11.1f %10.3f %10.3f %11.3f %8.3f\n", OpName(r.op), r.ranks,
                HumanBytes(r.bytes).c_str(), r.iters, r.seconds * 1e6, r.AlgGbps(), r.BusGbps(),
                r.MemcpyGbps(), r.BusGbps() / r.MemcpyGbps());
  }
}

bool WriteJson(const std::string& path, const std::string& backend,
               const std::vector<SizeResult>& results) {
  nlohmann::json j;
  j["bench"] = "collective_bench";
  j["backend"] = backend;
  j["dtype"] = "fp32";
  j["definitions"] = {
      {"bytes", "full buffer: all-reduce buffer, reduce-scatter input, all-gather output"},
      {"time_us", "per collective, issued back to back, max over ranks"},
      {"algbw_gbps", "bytes / time, 1e9 bytes per GB"},
      {"busbw_gbps", "algbw * 2(n-1)/n all-reduce, algbw * (n-1)/n reduce-scatter, all-gather"},
      {"memcpy_gbps", "one thread memcpy of the same bytes, same run, fastest of max(iters, 5)"},
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const SizeResult& r : results) {
    rows.push_back({{"op", OpName(r.op)},
                    {"ranks", r.ranks},
                    {"bytes", r.bytes},
                    {"iters", r.iters},
                    {"time_us", r.seconds * 1e6},
                    {"algbw_gbps", r.AlgGbps()},
                    {"busbw_gbps", r.BusGbps()},
                    {"memcpy_gbps", r.MemcpyGbps()},
                    {"busbw_over_memcpy", r.BusGbps() / r.MemcpyGbps()},
                    {"checked", true}});
  }
  j["results"] = rows;
  return perf::WriteBenchJson("collective_bench", path, j);
}

int Report(const BenchOptions& opts, const std::string& backend, int,
           const std::vector<SizeResult>& results) {
  PrintTable(backend, results);
  return !opts.json_path.empty() && !WriteJson(opts.json_path, backend, results) ? 1 : 0;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BackendBenchMain<zeroshard::BenchOptions, zeroshard::SizeResult>(
      "collective_bench", argc, argv, zeroshard::ParseFlags, zeroshard::PrintUsage,
      zeroshard::RunRank, zeroshard::Report);
}
