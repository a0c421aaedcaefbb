// Precondition checks of the kernel entry points. A failed check is a
// programming error (for example asking for an ISA path this CPU cannot run,
// which would otherwise die of SIGILL somewhere less obvious): it prints what
// was wrong and aborts, like abseil's CHECK.
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_CHECK_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_CHECK_H_

#include "kernels/cpu/isa.h"

namespace zeroshard::kernels::internal {

// Aborts with a message naming `entry_point` unless `isa` is supported by
// this CPU and build.
void CheckIsaSupported(Isa isa, const char* entry_point);

}  // namespace zeroshard::kernels::internal

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_CHECK_H_
