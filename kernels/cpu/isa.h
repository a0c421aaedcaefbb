// Runtime ISA dispatch for the CPU kernels: chosen once per process.
#ifndef ZEROSHARD_KERNELS_CPU_ISA_H_
#define ZEROSHARD_KERNELS_CPU_ISA_H_

#include <vector>

namespace zeroshard::kernels {

enum class Isa { kScalar, kAvx2, kAvx512 };

// "scalar", "avx2", "avx512".
const char* IsaName(Isa isa);
// The widest path this CPU (and this build) supports.
Isa BestIsa();
// Every path this CPU can run, scalar first.
std::vector<Isa> SupportedIsas();
// The path the dispatching entry points use: BestIsa(), unless the
// environment variable ZS_CPU_ISA=scalar|avx2|avx512 asks for a narrower one
// (a wider one than the CPU has is ignored). Fixed after the first call.
Isa ActiveIsa();

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_ISA_H_
