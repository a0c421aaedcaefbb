// Runtime ISA detection and the process-wide choice of path.
#include "kernels/cpu/isa.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/internal/check.h"

#if defined(ZS_KERNELS_X86_PATHS)
#include <cpuid.h>
#endif

namespace zeroshard::kernels {
namespace {

#if defined(ZS_KERNELS_X86_PATHS)
// CPUID leaf 1, ECX bit 29. Read directly: clang (14) has no "f16c" for
// __builtin_cpu_supports. The AVX checks below cover the OS's register saving.
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

Isa DetectBestIsa() {
#if defined(ZS_KERNELS_X86_PATHS)
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wide registers.
  // Both SIMD paths convert fp16 with F16C, which every AVX2 CPU has; it is
  // checked anyway so that a CPU (or emulator) without it gets a path it runs.
  const bool f16c = CpuHasF16c();
  if (f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq")) {
    return Isa::kAvx512;
  }
  if (f16c && __builtin_cpu_supports("avx2")) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}

// The paths form a chain (scalar < avx2 < avx512), and a CPU that has one
// has every narrower one.
bool IsNarrowerOrEqual(Isa a, Isa b) { return static_cast<int>(a) <= static_cast<int>(b); }

Isa ChooseActiveIsa() {
  const Isa best = BestIsa();
  const char* requested = std::getenv("ZS_CPU_ISA");
  if (requested == nullptr || *requested == '\0') return best;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (std::strcmp(requested, IsaName(isa)) == 0) {
      return IsNarrowerOrEqual(isa, best) ? isa : best;
    }
  }
  std::fprintf(stderr,
               "zeroshard kernels: ZS_CPU_ISA=%s is not one of scalar, avx2, avx512; using %s\n",
               requested, IsaName(best));
  return best;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa BestIsa() {
  static const Isa best = DetectBestIsa();
  return best;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (IsNarrowerOrEqual(isa, BestIsa())) isas.push_back(isa);
  }
  return isas;
}

Isa ActiveIsa() {
  static const Isa active = ChooseActiveIsa();
  return active;
}

namespace internal {

void CheckIsaSupported(Isa isa, const char* entry_point) {
  if (IsNarrowerOrEqual(isa, BestIsa())) return;
  std::fprintf(stderr,
               "zeroshard kernels: %s called on the %s path, but this CPU (or build) supports "
               "at most %s; pass one of SupportedIsas()\n",
               entry_point, IsaName(isa), IsaName(BestIsa()));
  std::abort();
}

}  // namespace internal
}  // namespace zeroshard::kernels
