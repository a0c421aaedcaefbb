// Bandwidth of the fused AdamW CPU kernels, the casts and the norm's sums of
// squares against a plain memcpy and an in-place read-modify-write of the
// same bytes.
//
// Definitions (so the ratio is honest):
//  - "bytes" of an update = the bytes it must move between memory and core:
//      fp32:                 p r+w 8 + g r 4 + m r+w 8 + v r+w 8   = 28 B/elem
//      bf16 mixed, fp32 grad: master r+w 8 + param_out w 2 + g r 4
//                             + m r+w 8 + v r+w 8                   = 30 B/elem
//      bf16 mixed, bf16 grad: the same with g r 2                   = 28 B/elem
//      fp16 mixed, fp32 / fp16 grad: as bf16 mixed                  = 30 / 28 B/elem
//      cast fp32 <-> bf16 / fp16: r 4 + w 2 (or r 2 + w 4)         =  6 B/elem
//      norm (BlockSumSquares) fp32 / bf16 / fp16: r 4 / 2 / 2       = 4 / 2 / 2 B/elem
//                             (the per-block sums it writes, 8 B per 128 elements, left out)
//  - the copy baseline for B bytes is memcpy of B/2 bytes from one buffer to
//    another, so that its bytes read + written also equal B;
//  - the read-modify-write (RMW) baseline for B bytes is one in-place pass
//    x[i] = 0.5 x[i] + 0.25 over B/2 bytes of floats: it reads and writes
//    the same B bytes, like an update of params and moments in place, and
//    unlike the copy it needs no read-for-ownership of a destination. It is
//    the roofline of an in-place optimizer: a kernel near it is bound by
//    memory, not by its arithmetic. (For the norms, which only read, both
//    baselines move half their bytes as writes: a norm above 1.0 is normal.)
//  - the streams baseline, for the AdamW variants only: the kernel's own
//    streams with trivial arithmetic, on buffers of their own: read the
//    gradient (the variant's type), update the master params and both
//    moments in place (x = 0.5 x + 0.25 g; v from g^2), write the 16-bit
//    params where the variant does. It moves exactly the update's bytes in
//    the update's pattern (for fp32: 4 read streams, 3 of them written back),
//    so it is the roofline of the same traffic; the one-buffer RMW has a
//    different read/write mix (half and half, one stream).
//  - GB/s = B / wall time (1e9 bytes per GB; Google Benchmark's own
//    bytes_per_second column is in 2^30). With T threads the range (of the
//    update, and of the copy) is split into T equal contiguous parts, one per
//    std::thread; the kernels themselves are single-threaded.
// After the Google Benchmark run a table prints each variant's GB/s next to
// the copy's GB/s for the same bytes and thread count, and their ratio, twice:
// from the fastest iteration of each (the machine's capability, least
// disturbed by other processes) and from the mean over all iterations.
// A second table measures the ratios PAIRED, for every kernel (AdamW, casts,
// norms): copy, RMW and kernel alternate (copy, rmw, kernel, copy, ...)
// --pairs times and each round gives the ratios t_copy / t_kernel and
// t_rmw / t_kernel; it prints the median and the range. On a shared machine
// whose bandwidth drifts this is the figure to quote: the three passes of a
// round see the same conditions. --json FILE writes this table.
//
// Own flags (the rest go to Google Benchmark):
//   --json FILE     the paired table as JSON
//   --pairs N       rounds per kernel and thread count (default 11)
//   --paired-only   skip the Google Benchmark run and its summary
// N = 64M elements by default; ZS_BENCH_N=<elements> for a quick run.
// The active ISA path is ActiveIsa() (ZS_CPU_ISA=scalar|avx2|avx512 narrows it).
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/norm.h"
#include "nlohmann/json.hpp"
#include "perf/bench_json.h"
#include "perf/kernels/streams_baseline.h"

namespace zeroshard::kernels {
namespace {

size_t BenchN() {
  const char* env = std::getenv("ZS_BENCH_N");
  if (env != nullptr && *env != '\0') return static_cast<size_t>(std::strtoull(env, nullptr, 10));
  return size_t{64} << 20;
}

// Page-aligned, transparent-huge-page backed (for the copy buffers too, so
// both sides see the same TLB behaviour), never freed: the process is short.
template <class T>
T* AllocateBuffer(size_t n) {
  constexpr size_t kAlign = size_t{2} << 20;
  const size_t bytes = ((n * sizeof(T) + kAlign - 1) / kAlign) * kAlign;
  void* p = std::aligned_alloc(kAlign, bytes == 0 ? kAlign : bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "adam_bench: cannot allocate %zu bytes; lower ZS_BENCH_N\n", bytes);
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<T*>(p);
}

// Part boundaries are multiples of this many elements, so that a part's
// norm blocks (kNormBlock elements each) never straddle two threads.
constexpr size_t kPartAlign = 4096;
static_assert(kPartAlign % kNormBlock == 0, "parts must hold whole norm blocks");

// Runs fn(begin, end) on `threads` equal contiguous parts of [0, n).
void RunSplit(int threads, size_t n, const std::function<void(size_t, size_t)>& fn) {
  std::vector<std::thread> workers;
  const size_t part = ((n + threads - 1) / threads + kPartAlign - 1) / kPartAlign * kPartAlign;
  for (int t = 1; t < threads; ++t) {
    const size_t begin = std::min(n, t * part);
    const size_t end = std::min(n, begin + part);
    workers.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  fn(0, std::min(n, part));
  for (std::thread& w : workers) w.join();
}

struct Buffers {
  size_t n;
  float *p, *g, *m, *v;
  uint16_t *out, *g16, *gh;   // bf16 grads in g16, fp16 grads in gh
  float* widened;             // the casts to fp32 write here
  double* block_sums;         // the norms' per-block sums
  char *copy_src, *copy_dst;  // 30/2 B per element: enough for any copy
  float* rmw;                 // 30/2 B per element, as floats: the RMW baseline
  float *sp, *sm, *sv;        // the streams baseline's params and moments
};

Buffers& GetBuffers() {
  static Buffers b = [] {
    Buffers b;
    b.n = BenchN();
    b.p = AllocateBuffer<float>(b.n);
    b.g = AllocateBuffer<float>(b.n);
    b.m = AllocateBuffer<float>(b.n);
    b.v = AllocateBuffer<float>(b.n);
    b.out = AllocateBuffer<uint16_t>(b.n);
    b.g16 = AllocateBuffer<uint16_t>(b.n);
    b.gh = AllocateBuffer<uint16_t>(b.n);
    b.copy_src = AllocateBuffer<char>(b.n * 15);
    b.copy_dst = AllocateBuffer<char>(b.n * 15);
    b.widened = AllocateBuffer<float>(b.n);
    b.block_sums = AllocateBuffer<double>(b.n / kNormBlock + 1);
    b.rmw = AllocateBuffer<float>(b.n * 15 / 4 + 1);
    b.sp = AllocateBuffer<float>(b.n);
    b.sm = AllocateBuffer<float>(b.n);
    b.sv = AllocateBuffer<float>(b.n);
    // Realistic normal magnitudes (no subnormals, which would slow sqrt and
    // div on some CPUs); first touch in the same split as the 2-thread runs.
    RunSplit(2, b.n, [&b](size_t begin, size_t end) {
      uint32_t state = static_cast<uint32_t>(begin) * 2654435761u + 1;
      for (size_t i = begin; i < end; ++i) {
        state = state * 1664525u + 1013904223u;
        const float r = static_cast<float>(state >> 8) * (1.0f / 16777216.0f) - 0.5f;  // [-.5,.5)
        b.p[i] = 0.05f * r;
        b.g[i] = 1e-3f * r + 1e-6f;
        b.m[i] = 1e-4f * r;
        b.v[i] = 1e-8f * (r * r + 0.01f);
        b.sp[i] = b.p[i];
        b.sm[i] = b.m[i];
        b.sv[i] = b.v[i];
        uint32_t g_bits;
        std::memcpy(&g_bits, &b.g[i], sizeof(g_bits));
        b.g16[i] = static_cast<uint16_t>(g_bits >> 16);
        b.out[i] = 0;
      }
      CastFp32ToFp16(b.g + begin, b.gh + begin, end - begin);
      std::memset(b.copy_src + begin * 15, 1, (end - begin) * 15);
      std::memset(b.copy_dst + begin * 15, 0, (end - begin) * 15);
      std::memset(reinterpret_cast<char*>(b.widened + begin), 0, (end - begin) * sizeof(float));
      for (size_t i = begin * 15 / 4; i < end * 15 / 4; ++i) b.rmw[i] = 0.5f;
    });
    return b;
  }();
  return b;
}

struct Rate {
  double best_gbps = 0;  // fastest iteration
  double total_bytes = 0, total_seconds = 0;
  double MeanGbps() const { return total_seconds > 0 ? total_bytes / total_seconds / 1e9 : 0; }
};

// Every timed iteration of each benchmark, by name and thread count, for the
// summary table.
std::map<std::pair<std::string, int>, Rate>& Results() {
  static std::map<std::pair<std::string, int>, Rate> results;
  return results;
}

void Measure(benchmark::State& state, const std::string& name, double bytes_per_elem,
             const std::function<void(size_t, size_t)>& work) {
  const int threads = static_cast<int>(state.range(0));
  const size_t n = GetBuffers().n;
  const double bytes = bytes_per_elem * static_cast<double>(n);
  Rate& rate = Results()[{name, threads}];
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    RunSplit(threads, n, work);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rate.total_bytes += bytes;
    rate.total_seconds += seconds;
    if (seconds > 0) rate.best_gbps = std::max(rate.best_gbps, bytes / seconds / 1e9);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
  state.counters["elements"] = static_cast<double>(n);
}

AdamConstants BenchConstants() {
  AdamStepParams params;
  params.weight_decay = 0.01;
  params.step = 10;
  return MakeAdamConstants(params);
}

void BmCopy(benchmark::State& state, int bytes_per_elem) {
  Buffers& b = GetBuffers();
  const size_t half = static_cast<size_t>(bytes_per_elem) / 2;  // bytes copied per element
  Measure(state, "copy " + std::to_string(bytes_per_elem) + "B", bytes_per_elem,
          [&b, half](size_t begin, size_t end) {
            std::memcpy(b.copy_dst + begin * half, b.copy_src + begin * half, (end - begin) * half);
          });
}

// The update of each variant, as (begin, end) work on the shared buffers.
struct Variant {
  const char* name;
  int bytes_per_elem;
  std::function<void(size_t, size_t)> work;
  std::function<void(size_t, size_t)> streams;  // the streams baseline; empty: none
};

// The copy baseline of a kernel moving bytes_per_elem bytes per element:
// bytes_per_elem / 2 bytes per element copied.
std::function<void(size_t, size_t)> CopyWork(int bytes_per_elem) {
  Buffers& b = GetBuffers();
  const size_t half = static_cast<size_t>(bytes_per_elem) / 2;
  return [&b, half](size_t i, size_t e) {
    std::memcpy(b.copy_dst + i * half, b.copy_src + i * half, (e - i) * half);
  };
}

// The RMW baseline: bytes_per_elem / 2 bytes per element of floats updated
// in place (read and written: bytes_per_elem in all).
std::function<void(size_t, size_t)> RmwWork(int bytes_per_elem) {
  Buffers& b = GetBuffers();
  const size_t half = static_cast<size_t>(bytes_per_elem) / 2;
  return [&b, half](size_t i, size_t e) {
    float* x = b.rmw;
    const size_t end = e * half / sizeof(float);
    // Converges to 0.5: the values stay normal whatever the pass count.
    for (size_t k = i * half / sizeof(float); k < end; ++k) x[k] = 0.5f * x[k] + 0.25f;
  };
}

// The streams baseline of an AdamW variant (see the definitions at the top;
// the pass itself is perf/kernels/streams_baseline.h, shared with
// offload_bench): its gradient read, params and moments updated in place,
// the 16-bit params written when `out` is set.

std::function<void(size_t, size_t)> StreamsWork(const float* grad, uint16_t* out) {
  Buffers& b = GetBuffers();
  return [&b, grad, out](size_t i, size_t e) {
    perf::StreamsPassF32(grad, b.sp, b.sm, b.sv, out, i, e);
  };
}
std::function<void(size_t, size_t)> StreamsWork(const uint16_t* grad, uint16_t* out) {
  Buffers& b = GetBuffers();
  return [&b, grad, out](size_t i, size_t e) {
    perf::StreamsPassU16(grad, b.sp, b.sm, b.sv, out, i, e);
  };
}

// Casts and norms: the other kernels of an optimizer step.
std::vector<Variant> OtherKernels() {
  Buffers& b = GetBuffers();
  return {
      {"cast fp32->bf16",
       6,
       [&b](size_t i, size_t e) { CastFp32ToBf16(b.g + i, b.out + i, e - i); },
       {}},
      {"cast bf16->fp32",
       6,
       [&b](size_t i, size_t e) { CastBf16ToFp32(b.g16 + i, b.widened + i, e - i); },
       {}},
      {"cast fp32->fp16",
       6,
       [&b](size_t i, size_t e) { CastFp32ToFp16(b.g + i, b.out + i, e - i); },
       {}},
      {"cast fp16->fp32",
       6,
       [&b](size_t i, size_t e) { CastFp16ToFp32(b.gh + i, b.widened + i, e - i); },
       {}},
      {"norm fp32",
       4,
       [&b](size_t i, size_t e) {
         BlockSumSquaresFp32(b.g + i, e - i, b.block_sums + i / kNormBlock);
       },
       {}},
      {"norm bf16",
       2,
       [&b](size_t i, size_t e) {
         BlockSumSquaresBf16(b.g16 + i, e - i, b.block_sums + i / kNormBlock);
       },
       {}},
      {"norm fp16",
       2,
       [&b](size_t i, size_t e) {
         BlockSumSquaresFp16(b.gh + i, e - i, b.block_sums + i / kNormBlock);
       },
       {}},
  };
}

std::vector<Variant> Variants() {
  Buffers& b = GetBuffers();
  static const AdamConstants c = BenchConstants();
  return {
      {"adamw fp32", 28,
       [&b](size_t i, size_t e) { AdamFp32(b.p + i, b.g + i, b.m + i, b.v + i, e - i, c); },
       StreamsWork(b.g, nullptr)},
      {"adamw bf16-mixed fp32-grad", 30,
       [&b](size_t i, size_t e) {
         AdamMixedBf16(b.p + i, b.out + i, b.g + i, b.m + i, b.v + i, e - i, c);
       },
       StreamsWork(b.g, b.out)},
      {"adamw bf16-mixed bf16-grad", 28,
       [&b](size_t i, size_t e) {
         AdamMixedBf16GradBf16(b.p + i, b.out + i, b.g16 + i, b.m + i, b.v + i, e - i, c);
       },
       StreamsWork(b.g16, b.out)},
      {"adamw fp16-mixed fp32-grad", 30,
       [&b](size_t i, size_t e) {
         AdamMixedFp16(b.p + i, b.out + i, b.g + i, b.m + i, b.v + i, e - i, c);
       },
       StreamsWork(b.g, b.out)},
      {"adamw fp16-mixed fp16-grad", 28,
       [&b](size_t i, size_t e) {
         AdamMixedFp16GradFp16(b.p + i, b.out + i, b.gh + i, b.m + i, b.v + i, e - i, c);
       },
       StreamsWork(b.gh, b.out)},
  };
}

void Register() {
  auto common = [](benchmark::internal::Benchmark* bm) {
    bm->Arg(1)
        ->Arg(2)
        ->ArgName("threads")
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(1.0);
  };
  common(benchmark::RegisterBenchmark("copy_28B", BmCopy, 28));
  common(benchmark::RegisterBenchmark("copy_30B", BmCopy, 30));
  for (const Variant& v : Variants()) {
    std::string id = v.name;  // "adamw bf16-mixed fp32-grad" -> "adamw_bf16_mixed_fp32_grad"
    for (char& ch : id) ch = (ch == ' ' || ch == '-') ? '_' : ch;
    common(benchmark::RegisterBenchmark(id.c_str(), [v](benchmark::State& state) {
      Measure(state, v.name, v.bytes_per_elem, v.work);
    }));
  }
}

double Seconds(int threads, size_t n, const std::function<void(size_t, size_t)>& work) {
  const auto start = std::chrono::steady_clock::now();
  RunSplit(threads, n, work);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Median, min and max of `values` (sorted in place).
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread SpreadOf(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {values[values.size() / 2], values.front(), values.back()};
}

struct PairedRow {
  std::string kernel;
  int bytes_per_elem = 0;
  int threads = 0;
  Spread gbps, copy_gbps, rmw_gbps;
  Spread vs_copy, vs_rmw;    // t_copy / t_kernel, t_rmw / t_kernel per round
  bool has_streams = false;  // the AdamW variants: the streams baseline too
  Spread streams_gbps, vs_streams;
};

std::vector<PairedRow> MeasurePaired(int pairs) {
  Buffers& b = GetBuffers();
  std::vector<Variant> kernels = Variants();
  for (Variant& v : OtherKernels()) kernels.push_back(std::move(v));
  std::vector<PairedRow> rows;
  std::printf(
      "\nPaired (copy, RMW, streams and kernel alternating, %d rounds, N = %zu, ISA path %s):\n"
      "kernel GB/s / copy GB/s, / RMW GB/s and / streams GB/s of the same bytes (median [min, "
      "max]);\nstreams: the update's own streams with trivial arithmetic (AdamW only)\n",
      pairs, b.n, IsaName(ActiveIsa()));
  std::printf("%-28s %-9s %3s %8s %8s %8s %8s %22s %22s %22s\n", "kernel", "threads", "B/e", "GB/s",
              "copy", "RMW", "streams", "vs copy", "vs RMW", "vs streams");
  for (const Variant& v : kernels) {
    const auto copy = CopyWork(v.bytes_per_elem);
    const auto rmw = RmwWork(v.bytes_per_elem);
    const bool has_streams = static_cast<bool>(v.streams);
    const double bytes = static_cast<double>(v.bytes_per_elem) * static_cast<double>(b.n);
    for (int threads : {1, 2}) {
      Seconds(threads, b.n, copy);  // warm them all
      Seconds(threads, b.n, rmw);
      if (has_streams) Seconds(threads, b.n, v.streams);
      Seconds(threads, b.n, v.work);
      std::vector<double> gbps, copy_gbps, rmw_gbps, streams_gbps, vs_copy, vs_rmw, vs_streams;
      for (int k = 0; k < pairs; ++k) {
        const double t_copy = Seconds(threads, b.n, copy);
        const double t_rmw = Seconds(threads, b.n, rmw);
        const double t_streams = has_streams ? Seconds(threads, b.n, v.streams) : 0.0;
        const double t_kernel = Seconds(threads, b.n, v.work);
        gbps.push_back(bytes / t_kernel / 1e9);
        copy_gbps.push_back(bytes / t_copy / 1e9);
        rmw_gbps.push_back(bytes / t_rmw / 1e9);
        vs_copy.push_back(t_copy / t_kernel);  // same bytes: the bandwidth ratio
        vs_rmw.push_back(t_rmw / t_kernel);
        if (has_streams) {
          streams_gbps.push_back(bytes / t_streams / 1e9);
          vs_streams.push_back(t_streams / t_kernel);
        }
      }
      PairedRow row{v.name,
                    v.bytes_per_elem,
                    threads,
                    SpreadOf(gbps),
                    SpreadOf(copy_gbps),
                    SpreadOf(rmw_gbps),
                    SpreadOf(vs_copy),
                    SpreadOf(vs_rmw),
                    false,
                    {},
                    {}};
      char streams_cells[64];
      std::snprintf(streams_cells, sizeof(streams_cells), "%8s %22s", "-", "-");
      if (has_streams) {
        row.has_streams = true;
        row.streams_gbps = SpreadOf(streams_gbps);
        row.vs_streams = SpreadOf(vs_streams);
        std::snprintf(streams_cells, sizeof(streams_cells), "%8.2f %6.3f [%5.3f, %5.3f]",
                      row.streams_gbps.median, row.vs_streams.median, row.vs_streams.min,
                      row.vs_streams.max);
      }
      // The streams cells go last so the columns before them keep their
      // places for the norms and casts.
      std::printf(
          "%-28s %d thread%s %3d %8.2f %8.2f %8.2f %6.3f [%5.3f, %5.3f] %6.3f [%5.3f, %5.3f] %s\n",
          v.name, threads, threads == 1 ? " " : "s", v.bytes_per_elem, row.gbps.median,
          row.copy_gbps.median, row.rmw_gbps.median, row.vs_copy.median, row.vs_copy.min,
          row.vs_copy.max, row.vs_rmw.median, row.vs_rmw.min, row.vs_rmw.max, streams_cells);
      rows.push_back(row);
    }
  }
  return rows;
}

bool WriteJson(const std::string& path, int pairs, const std::vector<PairedRow>& rows) {
  auto spread = [](const Spread& s) {
    return nlohmann::json{{"median", s.median}, {"min", s.min}, {"max", s.max}};
  };
  nlohmann::json j;
  j["bench"] = "adam_bench";
  j["elements"] = GetBuffers().n;
  j["isa"] = IsaName(ActiveIsa());
  j["rounds"] = pairs;
  j["definitions"] = {
      {"bytes_per_elem", "bytes the kernel must read + write per element"},
      {"gbps", "bytes_per_elem * elements / wall time, 1e9 bytes per GB"},
      {"copy", "memcpy of bytes_per_elem/2 per element (reads + writes the same bytes)"},
      {"rmw", "in-place x = 0.5x + 0.25 over bytes_per_elem/2 per element of floats"},
      {"vs_copy", "t_copy / t_kernel per round (copy, rmw, kernel alternating)"},
      {"vs_rmw", "t_rmw / t_kernel per round"},
      {"streams",
       "AdamW only: the update's own streams (gradient read; params, moments updated "
       "in place; 16-bit params written) with trivial arithmetic: the roofline of the "
       "same traffic"},
      {"vs_streams", "t_streams / t_kernel per round"},
  };
  nlohmann::json out_rows = nlohmann::json::array();
  for (const PairedRow& r : rows) {
    out_rows.push_back({{"kernel", r.kernel},
                        {"group", r.kernel.substr(0, r.kernel.find(' '))},
                        {"bytes_per_elem", r.bytes_per_elem},
                        {"threads", r.threads},
                        {"gbps", spread(r.gbps)},
                        {"copy_gbps", spread(r.copy_gbps)},
                        {"rmw_gbps", spread(r.rmw_gbps)},
                        {"vs_copy", spread(r.vs_copy)},
                        {"vs_rmw", spread(r.vs_rmw)}});
    if (r.has_streams) {
      out_rows.back()["streams_gbps"] = spread(r.streams_gbps);
      out_rows.back()["vs_streams"] = spread(r.vs_streams);
    }
  }
  j["results"] = out_rows;
  return perf::WriteBenchJson("adam_bench", path, j);
}

void PrintSummary() {
  const auto& r = Results();
  std::printf("\nAdamW update vs memcpy of the same bytes (N = %zu, ISA path %s)\n", GetBuffers().n,
              IsaName(ActiveIsa()));
  std::printf("%-28s %-10s %9s %10s %6s   %9s %10s %6s\n", "variant", "threads", "GB/s",
              "copy GB/s", "ratio", "mean GB/s", "mean copy", "ratio");
  const std::pair<const char*, int> variants[] = {{"adamw fp32", 28},
                                                  {"adamw bf16-mixed fp32-grad", 30},
                                                  {"adamw bf16-mixed bf16-grad", 28},
                                                  {"adamw fp16-mixed fp32-grad", 30},
                                                  {"adamw fp16-mixed fp16-grad", 28}};
  for (const auto& [name, bytes] : variants) {
    for (int threads : {1, 2}) {
      const auto update = r.find({name, threads});
      const auto copy = r.find({"copy " + std::to_string(bytes) + "B", threads});
      if (update == r.end() || copy == r.end()) continue;  // filtered out
      const Rate& u = update->second;
      const Rate& c = copy->second;
      std::printf("%-28s %d thread%s %9.2f %10.2f %6.3f   %9.2f %10.2f %6.3f\n", name, threads,
                  threads == 1 ? " " : "s", u.best_gbps, c.best_gbps, u.best_gbps / c.best_gbps,
                  u.MeanGbps(), c.MeanGbps(), u.MeanGbps() / c.MeanGbps());
    }
  }
}

}  // namespace
}  // namespace zeroshard::kernels

int main(int argc, char** argv) {
  // Own flags out of argv first: Google Benchmark refuses what it does not know.
  std::string json_path;
  int pairs = 11;
  bool paired_only = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--pairs" && i + 1 < argc) {
      const absl::StatusOr<int64_t> n =
          zeroshard::cli::ParseIntFlag("--pairs", argv[++i], 1, 1 << 20);
      if (!n.ok()) {
        std::fprintf(stderr, "adam_bench: %s\n", std::string(n.status().message()).c_str());
        return 2;
      }
      pairs = static_cast<int>(*n);
    } else if (arg == "--paired-only") {
      paired_only = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (!paired_only) {
    zeroshard::kernels::Register();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    zeroshard::kernels::PrintSummary();
  } else if (argc > 1) {
    std::fprintf(stderr, "adam_bench: unknown argument '%s' (with --paired-only)\n", argv[1]);
    return 2;
  }
  const auto rows = zeroshard::kernels::MeasurePaired(pairs);
  if (!json_path.empty() && !zeroshard::kernels::WriteJson(json_path, pairs, rows)) return 1;
  return 0;
}
