// Says which ISA paths a kernel test binary ran and which the CPU lacks, on
// stdout and in the XML report: a path not run must be visible, never
// silently passed.
#ifndef ZEROSHARD_TESTS_KERNELS_ISA_REPORT_H_
#define ZEROSHARD_TESTS_KERNELS_ISA_REPORT_H_

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"

namespace zeroshard::kernels::testing {

inline void ReportIsaPaths() {
  std::string run, not_run;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    bool supported = false;
    for (Isa s : SupportedIsas()) supported |= s == isa;
    std::string& list = supported ? run : not_run;
    list += std::string(list.empty() ? "" : ",") + IsaName(isa);
    if (!supported) {
      std::printf("[  NOTE    ] %s path not tested: CPU lacks %s\n",
                  isa == Isa::kAvx512 ? "AVX-512" : "AVX2",
                  isa == Isa::kAvx512 ? "avx512f/avx512bw/avx512dq" : "avx2");
    }
  }
  std::printf("[  NOTE    ] ISA paths tested: %s; not tested: %s\n", run.c_str(),
              not_run.empty() ? "none" : not_run.c_str());
  ::testing::Test::RecordProperty("isa_paths_tested", run);
  ::testing::Test::RecordProperty("isa_paths_not_tested", not_run.empty() ? "none" : not_run);
}

}  // namespace zeroshard::kernels::testing

#endif  // ZEROSHARD_TESTS_KERNELS_ISA_REPORT_H_
