// Tests of the runtime ISA choice.
#include "kernels/cpu/isa.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace zeroshard::kernels {
namespace {

TEST(IsaTest, NamesAndOrder) {
  EXPECT_STREQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
  const std::vector<Isa> isas = SupportedIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar);
  EXPECT_EQ(isas.back(), BestIsa());
  std::string names;
  for (Isa isa : isas) names += std::string(" ") + IsaName(isa);
  std::printf("[  NOTE    ] best ISA %s; supported:%s; active %s\n", IsaName(BestIsa()),
              names.c_str(), IsaName(ActiveIsa()));
  RecordProperty("supported_isas", names);
}

// ZS_CPU_ISA is read once per process, so each case runs in a fresh process
// (the "threadsafe" death-test style re-executes the binary) and reports the
// chosen path through its exit code.
void ExpectActiveIsaWithEnv(const char* value, Isa expected) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("ZS_CPU_ISA", value, 1);
        std::exit(static_cast<int>(ActiveIsa()));
      },
      ::testing::ExitedWithCode(static_cast<int>(expected)), "")
      << "ZS_CPU_ISA=" << value;
}

TEST(IsaTest, EnvironmentNarrowsButNeverWidens) {
  ExpectActiveIsaWithEnv("scalar", Isa::kScalar);
  ExpectActiveIsaWithEnv("avx2", BestIsa() == Isa::kScalar ? Isa::kScalar : Isa::kAvx2);
  ExpectActiveIsaWithEnv("avx512", BestIsa());  // wider than the CPU: ignored
  ExpectActiveIsaWithEnv("", BestIsa());
  ExpectActiveIsaWithEnv("sse9", BestIsa());  // unknown: warns, uses the best
}

}  // namespace
}  // namespace zeroshard::kernels
