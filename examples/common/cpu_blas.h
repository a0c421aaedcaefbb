// The CPU BLAS the example trainers' products run on, and its kernel path.
//
// Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels ("core") from
// the CPU's family and model when it loads. On a CPU it does not know (Intel
// family 6 model 207, Emerald Rapids) it falls back to its Prescott (SSE3)
// kernels, 3-5x slower than the AVX-512 ones the CPU runs. SetUpCpuBlas()
// reads the CPU's features (cpuid), decides from them which core the CPU
// deserves (DecideOpenBlasCore, a pure function) and switches OpenBLAS to it
// when the library's own choice is slower, unless the user chose a core with
// OPENBLAS_CORETYPE: an explicit choice is kept, with a warning when it is
// slower than the CPU allows. CpuBlasDescription() is the one line the
// trainers print.
#ifndef ZEROSHARD_EXAMPLES_COMMON_CPU_BLAS_H_
#define ZEROSHARD_EXAMPLES_COMMON_CPU_BLAS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard::examples {

// What cpuid (and xgetbv, for the register state the OS saves) says about
// the CPU. Flags are true only when both the CPU has the instructions and the
// OS enables their registers (AVX: XCR0 bits 1-2; AVX-512: also 5-7; AMX:
// 17-18), since only then can a kernel use them.
struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  int family = 0;      // display family (base + extended)
  int model = 0;       // display model (with the extended model)
  bool avx = false;
  bool fma = false;
  bool avx2 = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512cd = false;
  bool avx512_bf16 = false;
  bool amx_bf16 = false;  // AMX tiles with the BF16 instructions
};

// This CPU's features, read once with cpuid/xgetbv.
const CpuFeatures& HostCpuFeatures();

// The instruction set class of an sgemm kernel path, slowest first.
enum class KernelIsa {
  kUnknown,  // a core name this code does not know: no judgement
  kSse,      // generic x86-64 (SSE2/SSE3): OpenBLAS's fallback
  kAvx,      // AVX without 256-bit FMA (Sandy Bridge, Bulldozer family)
  kAvx2,     // AVX2 + FMA (Haswell, Zen 1-3)
  kAvx512,   // AVX-512 F/BW/VL/DQ/CD (Skylake-X and later, Zen 4)
};

// "SSE", "AVX", "AVX2+FMA", "AVX-512", "unknown".
absl::string_view KernelIsaName(KernelIsa isa);

// The fastest class the CPU runs.
KernelIsa BestKernelIsa(const CpuFeatures& cpu);

// The class of the kernels behind an OpenBLAS core name as
// openblas_get_corename() reports it (case-insensitive: "Prescott", "Haswell",
// "Zen", "SkylakeX", "Cooperlake", ...); kUnknown for a name not listed.
KernelIsa OpenBlasCoreIsa(absl::string_view core);

// Where the core the products run on came from.
enum class BlasCoreSource {
  kDetected,  // OpenBLAS's own detection, at least as fast as the CPU allows
  kForced,    // the user's OPENBLAS_CORETYPE, kept as given
  kChosen,    // zeroshard switched OpenBLAS to a core from the CPU's features
};

// "detected by OpenBLAS", "forced by OPENBLAS_CORETYPE", "chosen by zeroshard".
absl::string_view BlasCoreSourceName(BlasCoreSource source);

// The OpenBLAS core this CPU should run (pure): by its widest vectors,
// AVX-512 with AVX512-BF16 "Cooperlake", AVX-512 "SkylakeX", AVX2 + FMA "Zen"
// on AMD and "Haswell" otherwise, AVX "Sandybridge", SSE only "" (no
// preference). One exception, measured: AMD family 25 with AVX-512 (Zen 4),
// which executes 512-bit FMAs as two 256-bit halves, gets "Haswell": there
// OpenBLAS's AVX2 kernels matched its AVX-512 ones at large shapes and ran
// the 32-row products of the MLP demo up to 1.6x faster (docs/perf.md).
std::string PreferredOpenBlasCore(const CpuFeatures& cpu);

struct BlasCoreDecision {
  std::string core;  // the core to run on (OpenBLAS's name)
  BlasCoreSource source = BlasCoreSource::kDetected;
  // Empty, or why the products run slower than the CPU allows (a generic or
  // older kernel path) and what to do.
  std::string warning;
  // Why zeroshard replaced a library core of the CPU's class (empty when the
  // library's was of a slower class, or kept).
  std::string reason;
};

// Pure: the core to run on, given the CPU, the core the library loaded with
// (`library_core`, openblas_get_corename()) and the user's OPENBLAS_CORETYPE
// (`user_coretype`, empty when unset). A non-empty `user_coretype` is never
// overridden: the source is kForced, the core the library's, and the warning
// is set when its class is below PreferredOpenBlasCore(cpu)'s. Otherwise a
// library core of a class below the preferred core's is replaced by it
// (kChosen); on AMD family 25 with AVX-512, an AVX2 or AVX-512 core other
// than "Haswell" is replaced too (with a `reason`); an unknown library core
// (a newer library's name) is kept.
BlasCoreDecision DecideOpenBlasCore(const CpuFeatures& cpu, absl::string_view library_core,
                                    absl::string_view user_coretype);

// What SetUpCpuBlas() did.
struct CpuBlasState {
  std::string library;        // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..." (openblas_get_config)
  std::string core;           // the core the products run on (the library's report)
  std::string library_core;   // the core the library loaded with
  std::string user_coretype;  // OPENBLAS_CORETYPE at set-up, empty when unset
  BlasCoreSource source = BlasCoreSource::kDetected;
  std::string warning;  // the decision's warning, or why a switch failed
  std::string reason;   // the decision's reason
};

// Once per process (later calls return the first result): decides the core
// with DecideOpenBlasCore from HostCpuFeatures(), switches OpenBLAS to it
// when the decision says so (through the library's exported
// gotoblas_dynamic_quit / gotoblas_dynamic_init, with OPENBLAS_CORETYPE set
// only for that call and restored after), and sets OpenBLAS to one thread
// (the trainers run one compute thread per rank). When the library cannot
// switch (an OpenBLAS built without DYNAMIC_ARCH), the state keeps its core
// and says why in `warning`. The switch replaces the kernel table that every
// product reads, so no product may run meanwhile: a program that links this
// library runs SetUpCpuBlas() while it loads (a static initializer), before
// main() starts any thread; calls after that return the first result.
const CpuBlasState& SetUpCpuBlas();

// One line for reports, e.g. "OpenBLAS 0.3.21 ... , core Cooperlake (AVX-512
// kernels), detected by OpenBLAS; CPU AuthenticAMD family 25 model 17,
// AVX-512 + BF16" or "..., core SkylakeX (AVX-512 kernels), chosen by
// zeroshard (OpenBLAS detected Prescott, SSE kernels); ..." and a trailing
// "; WARNING: ..." when the kernel path is slower than the CPU allows.
// Calls SetUpCpuBlas().
std::string CpuBlasDescription();

// The same line for a given state and CPU (pure; tested).
std::string DescribeCpuBlas(const CpuBlasState& state, const CpuFeatures& cpu);

// Switches OpenBLAS to `core` now (the mechanism SetUpCpuBlas uses) and
// returns the core the library then reports (OpenBLAS falls back to another
// core for a name it does not know: compare). For benchmarks and tests that
// compare kernel paths in one process; not safe while another thread runs a
// product. Errors: FailedPrecondition when the loaded BLAS is not an OpenBLAS
// built with DYNAMIC_ARCH (it exports no gotoblas_dynamic_init).
absl::StatusOr<std::string> SwitchOpenBlasCore(absl::string_view core);

}  // namespace zeroshard::examples

#endif  // ZEROSHARD_EXAMPLES_COMMON_CPU_BLAS_H_
