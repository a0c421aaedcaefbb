// Bandwidth of the fused AdamW CPU kernels against a plain memcpy.
//
// Definitions (so the ratio is honest):
//  - "bytes" of an update = the bytes it must move between memory and core:
//      fp32:                 p r+w 8 + g r 4 + m r+w 8 + v r+w 8   = 28 B/elem
//      bf16 mixed, fp32 grad: master r+w 8 + param_out w 2 + g r 4
//                             + m r+w 8 + v r+w 8                   = 30 B/elem
//      bf16 mixed, bf16 grad: the same with g r 2                   = 28 B/elem
//      fp16 mixed, fp32 / fp16 grad: as bf16 mixed                  = 30 / 28 B/elem
//  - the copy baseline for B bytes is memcpy of B/2 bytes from one buffer to
//    another, so that its bytes read + written also equal B;
//  - GB/s = B / wall time (1e9 bytes per GB; Google Benchmark's own
//    bytes_per_second column is in 2^30). With T threads the range (of the
//    update, and of the copy) is split into T equal contiguous parts, one per
//    std::thread; the kernels themselves are single-threaded.
// After the Google Benchmark run a table prints each variant's GB/s next to
// the copy's GB/s for the same bytes and thread count, and their ratio, twice:
// from the fastest iteration of each (the machine's capability, least
// disturbed by other processes) and from the mean over all iterations.
// A second table measures the ratio PAIRED: copy and update alternate
// (copy, update, copy, update, ...) kPairs times and each pair gives one
// ratio t_copy / t_update; it prints the median and the range. On a shared
// machine whose bandwidth drifts this is the figure to quote: both halves
// of a pair see the same conditions.
//
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

#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/isa.h"

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

// Runs fn(begin, end) on `threads` equal contiguous parts of [0, n).
void RunSplit(int threads, size_t n, const std::function<void(size_t, size_t)>& fn) {
  std::vector<std::thread> workers;
  const size_t part = (n + threads - 1) / threads;
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
  char *copy_src, *copy_dst;  // 30/2 B per element: enough for either copy
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
        uint32_t g_bits;
        std::memcpy(&g_bits, &b.g[i], sizeof(g_bits));
        b.g16[i] = static_cast<uint16_t>(g_bits >> 16);
        b.out[i] = 0;
      }
      CastFp32ToFp16(b.g + begin, b.gh + begin, end - begin);
      std::memset(b.copy_src + begin * 15, 1, (end - begin) * 15);
      std::memset(b.copy_dst + begin * 15, 0, (end - begin) * 15);
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
};

std::vector<Variant> Variants() {
  Buffers& b = GetBuffers();
  static const AdamConstants c = BenchConstants();
  return {
      {"adamw fp32", 28,
       [&b](size_t i, size_t e) { AdamFp32(b.p + i, b.g + i, b.m + i, b.v + i, e - i, c); }},
      {"adamw bf16-mixed fp32-grad", 30,
       [&b](size_t i, size_t e) {
         AdamMixedBf16(b.p + i, b.out + i, b.g + i, b.m + i, b.v + i, e - i, c);
       }},
      {"adamw bf16-mixed bf16-grad", 28,
       [&b](size_t i, size_t e) {
         AdamMixedBf16GradBf16(b.p + i, b.out + i, b.g16 + i, b.m + i, b.v + i, e - i, c);
       }},
      {"adamw fp16-mixed fp32-grad", 30,
       [&b](size_t i, size_t e) {
         AdamMixedFp16(b.p + i, b.out + i, b.g + i, b.m + i, b.v + i, e - i, c);
       }},
      {"adamw fp16-mixed fp16-grad", 28,
       [&b](size_t i, size_t e) {
         AdamMixedFp16GradFp16(b.p + i, b.out + i, b.gh + i, b.m + i, b.v + i, e - i, c);
       }},
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

void PrintPairedRatios() {
  constexpr int kPairs = 11;
  Buffers& b = GetBuffers();
  std::printf("\nPaired (copy and update alternating, %d pairs): update GB/s / copy GB/s\n",
              kPairs);
  std::printf("%-28s %-10s %8s %8s %8s\n", "variant", "threads", "median", "min", "max");
  for (const Variant& v : Variants()) {
    const size_t half = static_cast<size_t>(v.bytes_per_elem) / 2;
    auto copy = [&b, half](size_t i, size_t e) {
      std::memcpy(b.copy_dst + i * half, b.copy_src + i * half, (e - i) * half);
    };
    for (int threads : {1, 2}) {
      Seconds(threads, b.n, copy);  // warm both
      Seconds(threads, b.n, v.work);
      std::vector<double> ratios;
      for (int k = 0; k < kPairs; ++k) {
        const double t_copy = Seconds(threads, b.n, copy);
        const double t_update = Seconds(threads, b.n, v.work);
        ratios.push_back(t_copy / t_update);  // same bytes: the bandwidth ratio
      }
      std::sort(ratios.begin(), ratios.end());
      std::printf("%-28s %d thread%s %8.3f %8.3f %8.3f\n", v.name, threads,
                  threads == 1 ? " " : "s", ratios[kPairs / 2], ratios.front(), ratios.back());
    }
  }
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
  zeroshard::kernels::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  zeroshard::kernels::PrintSummary();
  zeroshard::kernels::PrintPairedRatios();
  return 0;
}
