// The inlining rule of the helpers shared by every CPU kernel path.
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_KERNEL_INLINE_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_KERNEL_INLINE_H_

// These helpers are included by files compiled with different ISA flags.
// always_inline keeps the linker from merging an AVX-512 compiled copy into
// code that runs on a CPU without AVX-512.
#define ZS_KERNEL_INLINE inline __attribute__((always_inline))

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_KERNEL_INLINE_H_
