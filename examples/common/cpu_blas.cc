#include "examples/common/cpu_blas.h"

#include <cpuid.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zeroshard::examples {
namespace {

// OpenBLAS's entry points, looked up at run time so that a build linked
// against another BLAS still runs (and says what it cannot tell).
template <typename Fn>
Fn BlasSymbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

std::string OpenBlasCorename() {
  auto fn = BlasSymbol<char* (*)()>("openblas_get_corename");
  return fn != nullptr ? std::string(fn()) : std::string();
}

std::string OpenBlasConfig() {
  auto fn = BlasSymbol<char* (*)()>("openblas_get_config");
  return fn != nullptr ? std::string(fn()) : std::string("a BLAS that is not OpenBLAS");
}

uint64_t ReadXcr0() {
  uint32_t lo = 0;
  uint32_t hi = 0;
  // xgetbv with ecx = 0: the register state the OS saves (XCR0).
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures ReadCpuFeatures() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  // The vendor string is ebx, edx, ecx in that order.
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  const int base_family = (a >> 8) & 0xf;
  const int base_model = (a >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xf) ? base_model + (((a >> 16) & 0xf) << 4)
                                                       : base_model;
  const bool osxsave = (c >> 27) & 1;
  const uint64_t xcr0 = osxsave ? ReadXcr0() : 0;
  // SSE and AVX state (bits 1-2); opmask and the upper ZMM state (5-7); the
  // AMX tile config and data (17-18).
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;
  f.avx = os_avx && ((c >> 28) & 1);
  f.fma = os_avx && ((c >> 12) & 1);
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = os_avx && ((b >> 5) & 1);
    f.avx512f = os_avx512 && ((b >> 16) & 1);
    f.avx512dq = os_avx512 && ((b >> 17) & 1);
    f.avx512cd = os_avx512 && ((b >> 28) & 1);
    f.avx512bw = os_avx512 && ((b >> 30) & 1);
    f.avx512vl = os_avx512 && ((b >> 31) & 1);
    // AMX-BF16 (edx bit 22) with AMX-TILE (bit 24).
    f.amx_bf16 = os_amx && ((d >> 22) & 1) && ((d >> 24) & 1);
    const unsigned subleaves = a;
    if (subleaves >= 1) {
      __get_cpuid_count(7, 1, &a, &b, &c, &d);
      f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
    }
  }
  return f;
}

// AMD family 25 (Zen 3 and Zen 4; only Zen 4 has AVX-512) executes a 512-bit
// FMA as two 256-bit halves: AVX-512 kernels have no more FMA throughput than
// AVX2 ones there. Zen 5 (family 26) has full-width AVX-512 on its server parts.
bool HasHalfRateAvx512(const CpuFeatures& cpu) {
  return cpu.vendor == "AuthenticAMD" && cpu.family == 25 &&
         BestKernelIsa(cpu) == KernelIsa::kAvx512;
}

std::string CpuSummary(const CpuFeatures& cpu) {
  std::string out =
      absl::StrCat("CPU ", cpu.vendor.empty() ? "unknown" : cpu.vendor, " family ", cpu.family,
                   " model ", cpu.model, ", ", KernelIsaName(BestKernelIsa(cpu)));
  if (cpu.avx512_bf16) absl::StrAppend(&out, " + AVX512-BF16");
  if (cpu.amx_bf16) absl::StrAppend(&out, " + AMX-BF16");
  return out;
}

}  // namespace

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures* features = new CpuFeatures(ReadCpuFeatures());
  return *features;
}

absl::string_view KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kSse:
      return "SSE";
    case KernelIsa::kAvx:
      return "AVX";
    case KernelIsa::kAvx2:
      return "AVX2+FMA";
    case KernelIsa::kAvx512:
      return "AVX-512";
    default:
      return "unknown";
  }
}

KernelIsa BestKernelIsa(const CpuFeatures& cpu) {
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.avx512cd && cpu.avx2 &&
      cpu.fma) {
    return KernelIsa::kAvx512;
  }
  if (cpu.avx2 && cpu.fma) return KernelIsa::kAvx2;
  if (cpu.avx) return KernelIsa::kAvx;
  return KernelIsa::kSse;
}

KernelIsa OpenBlasCoreIsa(absl::string_view core) {
  const std::string name = absl::AsciiStrToLower(core);
  // OpenBLAS 0.3.21's x86-64 DYNAMIC_ARCH cores (driver/others/dynamic.c),
  // by the widest vector instructions their sgemm kernels use.
  static constexpr const char* kSse[] = {"katmai",       "coppermine", "northwood", "prescott",
                                         "banias",       "atom",       "core2",     "penryn",
                                         "dunnington",   "nehalem",    "athlon",    "opteron",
                                         "opteron_sse3", "barcelona",  "nano",      "bobcat"};
  static constexpr const char* kAvx[] = {"sandybridge", "bulldozer", "piledriver", "steamroller",
                                         "excavator"};
  static constexpr const char* kAvx2[] = {"haswell", "zen"};
  static constexpr const char* kAvx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
  for (const char* n : kSse) {
    if (name == n) return KernelIsa::kSse;
  }
  for (const char* n : kAvx) {
    if (name == n) return KernelIsa::kAvx;
  }
  for (const char* n : kAvx2) {
    if (name == n) return KernelIsa::kAvx2;
  }
  for (const char* n : kAvx512) {
    if (name == n) return KernelIsa::kAvx512;
  }
  return KernelIsa::kUnknown;
}

absl::string_view BlasCoreSourceName(BlasCoreSource source) {
  switch (source) {
    case BlasCoreSource::kForced:
      return "forced by OPENBLAS_CORETYPE";
    case BlasCoreSource::kChosen:
      return "chosen by zeroshard";
    default:
      return "detected by OpenBLAS";
  }
}

std::string PreferredOpenBlasCore(const CpuFeatures& cpu) {
  // On Zen 4, OpenBLAS's AVX2 kernels matched its AVX-512 ones at large
  // shapes and were up to 1.6x faster at the MLP demo's 32-row products
  // (perf/examples/cpu_blas_bench, docs/perf.md).
  if (HasHalfRateAvx512(cpu)) return "Haswell";
  switch (BestKernelIsa(cpu)) {
    case KernelIsa::kAvx512:
      // Cooperlake's sgemm kernels are SkylakeX's; the name also tells that
      // the CPU has AVX512-BF16, as OpenBLAS itself reports it.
      return cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX";
    case KernelIsa::kAvx2:
      // Zen: Haswell's kernels with AMD's blocking parameters, OpenBLAS's
      // own choice for Zen 1-3.
      return cpu.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
    case KernelIsa::kAvx:
      return "Sandybridge";
    default:
      return "";
  }
}

BlasCoreDecision DecideOpenBlasCore(const CpuFeatures& cpu, absl::string_view library_core,
                                    absl::string_view user_coretype) {
  BlasCoreDecision d;
  d.core = std::string(library_core);
  const std::string preferred = PreferredOpenBlasCore(cpu);
  const KernelIsa want = preferred.empty() ? KernelIsa::kSse : OpenBlasCoreIsa(preferred);
  const KernelIsa have = OpenBlasCoreIsa(library_core);
  // An unknown core (a newer library's name) is not judged.
  const bool slower = have != KernelIsa::kUnknown && have < want;
  if (!user_coretype.empty()) {
    d.source = BlasCoreSource::kForced;
    if (slower) {
      d.warning = absl::StrCat(
          have == KernelIsa::kSse ? "generic fallback: " : "", "OPENBLAS_CORETYPE=", user_coretype,
          " runs OpenBLAS's ", library_core, " (", KernelIsaName(have),
          ") kernels where this CPU runs ", KernelIsaName(want), " (", preferred,
          "); the products run several times slower. Unset "
          "OPENBLAS_CORETYPE to let zeroshard choose");
    }
    return d;
  }
  if (slower) {
    d.core = preferred;
    d.source = BlasCoreSource::kChosen;
  } else if (HasHalfRateAvx512(cpu) && have >= KernelIsa::kAvx2 &&
             !absl::EqualsIgnoreCase(library_core, preferred)) {
    d.core = preferred;
    d.source = BlasCoreSource::kChosen;
    d.reason = "AMD family 25 runs AVX-512 as two 256-bit halves; AVX2 kernels measured faster";
  }
  return d;
}

absl::StatusOr<std::string> SwitchOpenBlasCore(absl::string_view core) {
  // gotoblas_dynamic_init() is what OpenBLAS runs when it loads: it picks the
  // kernel table from OPENBLAS_CORETYPE or its CPU detection and initialises
  // the table's blocking parameters, and does nothing while a table is set;
  // gotoblas_dynamic_quit() unsets it. Both are exported by DYNAMIC_ARCH
  // builds (Debian's), so the core can be chosen after load without knowing
  // the table's layout.
  auto quit = BlasSymbol<void (*)()>("gotoblas_dynamic_quit");
  auto init = BlasSymbol<void (*)()>("gotoblas_dynamic_init");
  if (quit == nullptr || init == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "switching the BLAS core to ", core, ": the loaded BLAS (", OpenBlasConfig(),
        ") exports no gotoblas_dynamic_init/quit, so it is not an OpenBLAS built with "
        "DYNAMIC_ARCH; its kernels are fixed at build time (install Debian's libopenblas0)"));
  }
  const char* previous = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = previous != nullptr ? previous : "";
  const bool had = previous != nullptr;
  setenv("OPENBLAS_CORETYPE", std::string(core).c_str(), 1);
  quit();
  init();
  // Children and later readers see the user's environment, not ours.
  if (had) {
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  return OpenBlasCorename();
}

const CpuBlasState& SetUpCpuBlas() {
  static CpuBlasState* state = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    auto* s = new CpuBlasState();
    const char* user = std::getenv("OPENBLAS_CORETYPE");
    s->user_coretype = user != nullptr ? user : "";
    s->library_core = OpenBlasCorename();
    const CpuFeatures& cpu = HostCpuFeatures();
    BlasCoreDecision d = DecideOpenBlasCore(cpu, s->library_core, s->user_coretype);
    s->source = d.source;
    s->warning = d.warning;
    s->reason = d.reason;
    if (d.source == BlasCoreSource::kChosen) {
      absl::StatusOr<std::string> now = SwitchOpenBlasCore(d.core);
      if (!now.ok()) {
        s->source = BlasCoreSource::kDetected;
        s->warning = absl::StrCat("OpenBLAS runs ", s->library_core, " (",
                                  KernelIsaName(OpenBlasCoreIsa(s->library_core)),
                                  ") kernels where zeroshard would run ", d.core,
                                  ", and could not switch: ", now.status().message());
      } else if (!absl::EqualsIgnoreCase(*now, d.core)) {
        s->warning = absl::StrCat("zeroshard asked OpenBLAS for core ", d.core, ", it runs ", *now,
                                  "; set OPENBLAS_CORETYPE to a core this OpenBLAS knows");
      }
    }
    auto set_threads = BlasSymbol<void (*)(int)>("openblas_set_num_threads");
    if (set_threads != nullptr) set_threads(1);
    s->library = OpenBlasConfig();
    s->core = OpenBlasCorename();
    state = s;
  });
  return *state;
}

std::string DescribeCpuBlas(const CpuBlasState& state, const CpuFeatures& cpu) {
  std::string out = state.library;
  if (!state.core.empty()) {
    absl::StrAppend(&out, ", core ", state.core, " (", KernelIsaName(OpenBlasCoreIsa(state.core)),
                    " kernels), ", BlasCoreSourceName(state.source));
    if (state.source == BlasCoreSource::kForced) {
      absl::StrAppend(&out, "=", state.user_coretype);
    } else if (state.source == BlasCoreSource::kChosen) {
      absl::StrAppend(&out, " (OpenBLAS detected ", state.library_core, ", ",
                      KernelIsaName(OpenBlasCoreIsa(state.library_core)), " kernels",
                      state.reason.empty() ? "" : "; ", state.reason, ")");
    }
  }
  absl::StrAppend(&out, "; ", CpuSummary(cpu));
  if (!state.warning.empty()) absl::StrAppend(&out, "; WARNING: ", state.warning);
  return out;
}

std::string CpuBlasDescription() { return DescribeCpuBlas(SetUpCpuBlas(), HostCpuFeatures()); }

namespace {

// The switch replaces the kernel table that every product reads, so it runs
// while the program loads, before main() can start a thread that multiplies
// (OpenBLAS chose its own core at the same point). Later calls of
// SetUpCpuBlas() return this result.
[[maybe_unused]] const CpuBlasState& kSetUpAtLoad = SetUpCpuBlas();

}  // namespace

}  // namespace zeroshard::examples
