// The CPU BLAS set-up of the example trainers (examples/common/cpu_blas.h):
// the core decision as a pure function of the CPU's features and the
// library's report (the Emerald Rapids fallback, this machine's Zen 4, a
// user's OPENBLAS_CORETYPE), cpuid against /proc/cpuinfo, and end to end the
// core the process runs on, with products checked against a double reference
// on every core it switches to. ctest runs the binary twice: as is, and with
// OPENBLAS_CORETYPE=Prescott (cpu_blas_forced_test), where the user's choice
// must be kept and reported as forced, with a warning on a CPU with AVX.
#include "examples/common/cpu_blas.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace zeroshard::examples {
namespace {

// Intel Xeon family 6 model 207 (Emerald Rapids): AVX-512, AVX512-BF16, AMX.
CpuFeatures EmeraldRapids() {
  CpuFeatures f;
  f.vendor = "GenuineIntel";
  f.family = 6;
  f.model = 207;
  f.avx = f.fma = f.avx2 = true;
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = true;
  f.avx512_bf16 = true;
  f.amx_bf16 = true;
  return f;
}

// This session's machine: AMD EPYC family 25 model 17 (Zen 4), AVX-512 with
// BF16, no AMX.
CpuFeatures Zen4() {
  CpuFeatures f = EmeraldRapids();
  f.vendor = "AuthenticAMD";
  f.family = 25;
  f.model = 17;
  f.amx_bf16 = false;
  return f;
}

CpuFeatures Avx2Only(const char* vendor) {
  CpuFeatures f;
  f.vendor = vendor;
  f.family = std::string(vendor) == "AuthenticAMD" ? 23 : 6;
  f.model = 49;
  f.avx = f.fma = f.avx2 = true;
  return f;
}

TEST(CpuBlasDecision, EmeraldRapidsFallbackIsReplacedByTheAvx512Core) {
  // Debian's OpenBLAS 0.3.21 does not know model 207 and loads Prescott.
  const BlasCoreDecision d = DecideOpenBlasCore(EmeraldRapids(), "Prescott", "");
  EXPECT_EQ(d.core, "Cooperlake");
  EXPECT_EQ(d.source, BlasCoreSource::kChosen);
  EXPECT_EQ(d.warning, "");
  // Without AVX512-BF16 the same class under its other name.
  CpuFeatures no_bf16 = EmeraldRapids();
  no_bf16.avx512_bf16 = false;
  EXPECT_EQ(DecideOpenBlasCore(no_bf16, "prescott", "").core, "SkylakeX");
  // An older but not generic path is replaced too.
  EXPECT_EQ(DecideOpenBlasCore(EmeraldRapids(), "Haswell", "").core, "Cooperlake");
  // A CPU OpenBLAS knows keeps its AVX-512 core.
  EXPECT_EQ(DecideOpenBlasCore(EmeraldRapids(), "Cooperlake", "").source,
            BlasCoreSource::kDetected);
}

TEST(CpuBlasDecision, ThisMachinesAvx512CoreIsReplacedByHaswell) {
  // Zen 4 runs AVX-512 at AVX2's rate; OpenBLAS 0.3.21 detects Cooperlake.
  const BlasCoreDecision d = DecideOpenBlasCore(Zen4(), "Cooperlake", "");
  EXPECT_EQ(d.core, "Haswell");
  EXPECT_EQ(d.source, BlasCoreSource::kChosen);
  EXPECT_EQ(d.warning, "");
  EXPECT_TRUE(absl::StrContains(d.reason, "two 256-bit halves")) << d.reason;
  EXPECT_EQ(DecideOpenBlasCore(Zen4(), "SkylakeX", "").core, "Haswell");
  // An older library's Zen core too (its blocking lost at the MLP's dW).
  EXPECT_EQ(DecideOpenBlasCore(Zen4(), "Zen", "").core, "Haswell");
  // Detected Haswell is kept; so is the fallback fix's target on Zen 4.
  EXPECT_EQ(DecideOpenBlasCore(Zen4(), "haswell", "").source, BlasCoreSource::kDetected);
  const BlasCoreDecision fallback = DecideOpenBlasCore(Zen4(), "Prescott", "");
  EXPECT_EQ(fallback.core, "Haswell");
  EXPECT_EQ(fallback.reason, "");
  // Zen 5 (family 26) runs full-width AVX-512: its AVX-512 core is kept.
  CpuFeatures zen5 = Zen4();
  zen5.family = 26;
  EXPECT_EQ(DecideOpenBlasCore(zen5, "Cooperlake", "").source, BlasCoreSource::kDetected);
  EXPECT_EQ(DecideOpenBlasCore(zen5, "Prescott", "").core, "Cooperlake");
}

TEST(CpuBlasDecision, Avx512WithoutAllSubsetsIsNotAvx512) {
  CpuFeatures f = Zen4();
  f.avx512vl = false;
  EXPECT_EQ(BestKernelIsa(f), KernelIsa::kAvx2);
  EXPECT_EQ(DecideOpenBlasCore(f, "Prescott", "").core, "Zen");
}

TEST(CpuBlasDecision, Avx2CoresByVendor) {
  EXPECT_EQ(DecideOpenBlasCore(Avx2Only("AuthenticAMD"), "Prescott", "").core, "Zen");
  EXPECT_EQ(DecideOpenBlasCore(Avx2Only("GenuineIntel"), "Nehalem", "").core, "Haswell");
  EXPECT_EQ(DecideOpenBlasCore(Avx2Only("GenuineIntel"), "Haswell", "").source,
            BlasCoreSource::kDetected);
  CpuFeatures avx = Avx2Only("GenuineIntel");
  avx.avx2 = avx.fma = false;
  EXPECT_EQ(DecideOpenBlasCore(avx, "Prescott", "").core, "Sandybridge");
}

TEST(CpuBlasDecision, AnSseOnlyCpuKeepsTheGenericCoreWithoutWarning) {
  CpuFeatures f;
  f.vendor = "GenuineIntel";
  const BlasCoreDecision d = DecideOpenBlasCore(f, "Prescott", "");
  EXPECT_EQ(d.core, "Prescott");
  EXPECT_EQ(d.source, BlasCoreSource::kDetected);
  EXPECT_EQ(d.warning, "");
}

TEST(CpuBlasDecision, TheUsersChoiceIsKeptAndWarnedAboutWhenSlower) {
  const BlasCoreDecision d = DecideOpenBlasCore(Zen4(), "Prescott", "Prescott");
  EXPECT_EQ(d.core, "Prescott");
  EXPECT_EQ(d.source, BlasCoreSource::kForced);
  EXPECT_TRUE(absl::StartsWith(d.warning, "generic fallback: OPENBLAS_CORETYPE=Prescott"))
      << d.warning;
  EXPECT_TRUE(absl::StrContains(d.warning, "Unset OPENBLAS_CORETYPE")) << d.warning;
  // Forced to an older, not generic path: a warning without "generic".
  const BlasCoreDecision haswell = DecideOpenBlasCore(EmeraldRapids(), "Haswell", "haswell");
  EXPECT_EQ(haswell.source, BlasCoreSource::kForced);
  EXPECT_EQ(haswell.core, "Haswell");
  EXPECT_TRUE(absl::StartsWith(haswell.warning, "OPENBLAS_CORETYPE=haswell")) << haswell.warning;
  // Forced to the preferred class or above: no warning, no override.
  const BlasCoreDecision skx = DecideOpenBlasCore(Zen4(), "SkylakeX", "SkylakeX");
  EXPECT_EQ(skx.core, "SkylakeX");
  EXPECT_EQ(skx.source, BlasCoreSource::kForced);
  EXPECT_EQ(skx.warning, "");
}

TEST(CpuBlasDecision, AnUnknownCoreIsNotJudged) {
  const BlasCoreDecision d = DecideOpenBlasCore(EmeraldRapids(), "GraniteRapids", "");
  EXPECT_EQ(d.core, "GraniteRapids");
  EXPECT_EQ(d.source, BlasCoreSource::kDetected);
  EXPECT_EQ(d.warning, "");
}

TEST(CpuBlasDecision, CoreClasses) {
  EXPECT_EQ(OpenBlasCoreIsa("PRESCOTT"), KernelIsa::kSse);
  EXPECT_EQ(OpenBlasCoreIsa("Opteron_SSE3"), KernelIsa::kSse);
  EXPECT_EQ(OpenBlasCoreIsa("Sandybridge"), KernelIsa::kAvx);
  EXPECT_EQ(OpenBlasCoreIsa("Zen"), KernelIsa::kAvx2);
  EXPECT_EQ(OpenBlasCoreIsa("Cooperlake"), KernelIsa::kAvx512);
  EXPECT_EQ(OpenBlasCoreIsa(""), KernelIsa::kUnknown);
}

TEST(CpuBlasDescription, SaysWhereTheCoreCameFromAndWarns) {
  CpuBlasState chosen;
  chosen.library = "OpenBLAS 0.3.21 DYNAMIC_ARCH";
  chosen.core = "Cooperlake";
  chosen.library_core = "Prescott";
  chosen.source = BlasCoreSource::kChosen;
  EXPECT_EQ(DescribeCpuBlas(chosen, EmeraldRapids()),
            "OpenBLAS 0.3.21 DYNAMIC_ARCH, core Cooperlake (AVX-512 kernels), chosen by zeroshard "
            "(OpenBLAS detected Prescott, SSE kernels); CPU GenuineIntel family 6 model 207, "
            "AVX-512 + AVX512-BF16 + AMX-BF16");
  CpuBlasState forced;
  forced.library = "OpenBLAS 0.3.21 DYNAMIC_ARCH";
  forced.core = forced.library_core = "Prescott";
  forced.user_coretype = "Prescott";
  forced.source = BlasCoreSource::kForced;
  forced.warning = DecideOpenBlasCore(Zen4(), "Prescott", "Prescott").warning;
  const std::string line = DescribeCpuBlas(forced, Zen4());
  EXPECT_TRUE(absl::StrContains(
      line, "core Prescott (SSE kernels), forced by OPENBLAS_CORETYPE=Prescott; CPU AuthenticAMD"))
      << line;
  EXPECT_TRUE(absl::StrContains(line, "; WARNING: generic fallback")) << line;
}

// The flags of the first processor in /proc/cpuinfo, and one field.
std::set<std::string> ProcCpuFlags(std::string* vendor, int* family, int* model) {
  std::ifstream in("/proc/cpuinfo");
  std::set<std::string> flags;
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key(absl::StripAsciiWhitespace(line.substr(0, colon)));
    const std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (key == "vendor_id" && vendor->empty()) *vendor = value;
    if (key == "cpu family" && *family < 0) *family = std::atoi(value.c_str());
    if (key == "model" && *model < 0) *model = std::atoi(value.c_str());
    if (key == "flags" && flags.empty()) {
      std::istringstream words(value);
      std::string w;
      while (words >> w) flags.insert(w);
    }
  }
  return flags;
}

TEST(CpuBlasHost, CpuidAgreesWithProcCpuinfo) {
  std::string vendor;
  int family = -1;
  int model = -1;
  const std::set<std::string> flags = ProcCpuFlags(&vendor, &family, &model);
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags on this system";
  const CpuFeatures& f = HostCpuFeatures();
  EXPECT_EQ(f.vendor, vendor);
  EXPECT_EQ(f.family, family);
  EXPECT_EQ(f.model, model);
  // The kernel lists a flag only when the OS supports its state too.
  EXPECT_EQ(f.avx, flags.count("avx") == 1);
  EXPECT_EQ(f.fma, flags.count("fma") == 1);
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(f.avx512bw, flags.count("avx512bw") == 1);
  EXPECT_EQ(f.avx512vl, flags.count("avx512vl") == 1);
  EXPECT_EQ(f.avx512dq, flags.count("avx512dq") == 1);
  EXPECT_EQ(f.avx512cd, flags.count("avx512cd") == 1);
  EXPECT_EQ(f.avx512_bf16, flags.count("avx512_bf16") == 1);
  EXPECT_EQ(f.amx_bf16, flags.count("amx_bf16") == 1 && flags.count("amx_tile") == 1);
}

// C = A B (row-major, [m,k] x [k,n]) on the current core against a double
// reference, on fresh random inputs.
void ExpectSgemmMatchesDouble(uint32_t seed) {
  const int m = 67, n = 131, k = 253;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(m * k), b(k * n), c(m * n, 7.0f);
  for (float& v : a) v = dist(gen);
  for (float& v : b) v = dist(gen);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
              0.0f, c.data(), n);
  double worst = 0.0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double ref = 0.0;
      double mag = 0.0;
      for (int p = 0; p < k; ++p) {
        ref += static_cast<double>(a[i * k + p]) * b[p * n + j];
        mag += std::fabs(static_cast<double>(a[i * k + p]) * b[p * n + j]);
      }
      worst = std::max(worst, std::fabs(c[i * n + j] - ref) / (mag + 1e-30));
    }
  }
  // fp32 sums of k terms: error <= ~k * 2^-24 of the sum of magnitudes.
  EXPECT_LT(worst, k * 6e-8) << "core " << SetUpCpuBlas().core;
}

TEST(CpuBlasHost, TheProcessRunsTheCoreTheDecisionNames) {
  const CpuBlasState& s = SetUpCpuBlas();
  const CpuFeatures& cpu = HostCpuFeatures();
  const std::string line = CpuBlasDescription();
  std::printf("BLAS: %s\n", line.c_str());
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  ASSERT_FALSE(s.core.empty()) << "the test binary links OpenBLAS: " << line;
  if (user != nullptr && *user != '\0') {
    // The user's choice is kept, as OpenBLAS applied it.
    EXPECT_EQ(s.source, BlasCoreSource::kForced) << line;
    EXPECT_TRUE(absl::EqualsIgnoreCase(s.core, user)) << line;
    EXPECT_TRUE(absl::StrContains(line, absl::StrCat("forced by OPENBLAS_CORETYPE=", user)))
        << line;
    const bool slower = OpenBlasCoreIsa(s.core) < OpenBlasCoreIsa(PreferredOpenBlasCore(cpu));
    EXPECT_EQ(absl::StrContains(line, "; WARNING: "), slower) << line;
  } else {
    // Whatever OpenBLAS detected, the products run the decision's core, of
    // the preferred core's class at least.
    EXPECT_NE(s.source, BlasCoreSource::kForced) << line;
    EXPECT_TRUE(absl::EqualsIgnoreCase(s.core, DecideOpenBlasCore(cpu, s.library_core, "").core))
        << line;
    EXPECT_GE(OpenBlasCoreIsa(s.core), OpenBlasCoreIsa(PreferredOpenBlasCore(cpu))) << line;
    EXPECT_FALSE(absl::StrContains(line, "WARNING")) << line;
  }
  ExpectSgemmMatchesDouble(std::random_device{}());
}

TEST(CpuBlasHost, SwitchingFromTheFallbackReachesTheChosenCore) {
  const std::string before = SetUpCpuBlas().core;
  // What a CPU that OpenBLAS does not know loads.
  absl::StatusOr<std::string> generic = SwitchOpenBlasCore("Prescott");
  ASSERT_TRUE(generic.ok()) << generic.status();
  EXPECT_EQ(*generic, "Prescott");
  ExpectSgemmMatchesDouble(std::random_device{}());
  const BlasCoreDecision d = DecideOpenBlasCore(HostCpuFeatures(), *generic, "");
  if (BestKernelIsa(HostCpuFeatures()) > KernelIsa::kSse) {
    EXPECT_EQ(d.source, BlasCoreSource::kChosen);
  }
  absl::StatusOr<std::string> chosen = SwitchOpenBlasCore(d.core);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_TRUE(absl::EqualsIgnoreCase(*chosen, d.core)) << *chosen << " vs " << d.core;
  ExpectSgemmMatchesDouble(std::random_device{}());
  // The environment is the user's again.
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  if (SetUpCpuBlas().user_coretype.empty()) {
    EXPECT_EQ(user, nullptr);
  } else {
    ASSERT_NE(user, nullptr);
    EXPECT_EQ(std::string(user), SetUpCpuBlas().user_coretype);
  }
  ASSERT_TRUE(SwitchOpenBlasCore(before).ok());
}

}  // namespace
}  // namespace zeroshard::examples
