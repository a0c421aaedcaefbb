// Throughput of the CRC-32C implementations next to memcpy of the same bytes.
//
// Each round times, on one thread, the portable CRC, the SSE4.2 CRC (when the
// CPU has it) and a memcpy, over the same B bytes (256 MiB by default,
// ZS_BENCH_MIB=<MiB> to change), interleaved so that all three see the same
// machine; the table gives the best round of each (the machine's capability,
// least disturbed by other processes) and the median. GB/s = B / wall time,
// 1e9 bytes per GB. memcpy reads B bytes and writes B, a CRC only reads them:
// a CRC as fast as memcpy is not yet at the memory's limit.
//
// The CRC is a kernel (kernels/cpu/crc32c.h), benchmarked directly as
// perf/kernels benchmarks the Adam, norm and cast kernels.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/crc32c.h"
#include "kernels/cpu/internal/crc32c_impl.h"

namespace {

using zeroshard::kernels::Crc32cHardware;
using zeroshard::kernels::Crc32cHardwareSupported;
using zeroshard::kernels::Crc32cImplementation;
using zeroshard::kernels::Crc32cPortable;

constexpr int kRounds = 7;

size_t BenchBytes() {
  const char* env = std::getenv("ZS_BENCH_MIB");
  const size_t mib = (env != nullptr && *env != '\0') ? std::strtoull(env, nullptr, 10) : 256;
  return std::max<size_t>(mib, 1) << 20;
}

// Huge-page aligned and backed, so the CRC and the copy see the same TLB
// behaviour; never freed (the process is short).
uint8_t* AllocateBuffer(size_t bytes) {
  constexpr size_t kAlign = size_t{2} << 20;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) {
    std::fprintf(stderr, "crc32c_bench: cannot allocate %zu bytes; lower ZS_BENCH_MIB\n", rounded);
    std::exit(1);
  }
  madvise(p, rounded, MADV_HUGEPAGE);
  std::memset(p, 0, rounded);  // fault the pages in before timing
  return static_cast<uint8_t*>(p);
}

template <class Fn>
double Seconds(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Series {
  const char* name;
  std::vector<double> seconds;
};

void Print(const Series& s, size_t bytes, double copy_best) {
  if (s.seconds.empty()) return;
  std::vector<double> sorted = s.seconds;
  std::sort(sorted.begin(), sorted.end());
  const double best = bytes / sorted.front() / 1e9;
  const double median = bytes / sorted[sorted.size() / 2] / 1e9;
  std::printf("%-16s %8.2f GB/s best %8.2f GB/s median   %5.2fx memcpy (best)\n", s.name, best,
              median, copy_best / sorted.front());
}

}  // namespace

int main() {
  const size_t bytes = BenchBytes();
  uint8_t* src = AllocateBuffer(bytes);
  uint8_t* dst = AllocateBuffer(bytes);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t word = rng();
    std::memcpy(src + i, &word, 8);
  }

  const bool hardware = Crc32cHardwareSupported();
  Series portable{"crc32c portable", {}}, sse42{"crc32c sse4.2", {}}, copy{"memcpy", {}};
  uint32_t crc_portable = 0, crc_hardware = 0;
  for (int round = 0; round < kRounds; ++round) {
    portable.seconds.push_back(Seconds([&] { crc_portable = Crc32cPortable(0, src, bytes); }));
    if (hardware) {
      sse42.seconds.push_back(Seconds([&] { crc_hardware = Crc32cHardware(0, src, bytes); }));
    }
    copy.seconds.push_back(Seconds([&] { std::memcpy(dst, src, bytes); }));
    // Keeps the copy from being elided: its result is read.
    if (dst[round] != src[round]) return 2;
  }
  if (hardware && crc_portable != crc_hardware) {
    std::fprintf(stderr, "crc32c_bench: the implementations disagree (0x%08x vs 0x%08x)\n",
                 crc_portable, crc_hardware);
    return 1;
  }

  std::printf("CRC-32C over %zu MiB, one thread, best and median of %d rounds; dispatch: %s\n",
              bytes >> 20, kRounds, Crc32cImplementation());
  const double copy_best = *std::min_element(copy.seconds.begin(), copy.seconds.end());
  Print(portable, bytes, copy_best);
  if (hardware) {
    Print(sse42, bytes, copy_best);
  } else {
    std::printf("crc32c sse4.2    not measured: this CPU has no SSE4.2\n");
  }
  Print(copy, bytes, copy_best);
  std::printf("crc 0x%08x\n", crc_portable);
  return 0;
}
