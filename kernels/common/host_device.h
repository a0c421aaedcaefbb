// Function qualifiers for element functions that host C++ and CUDA device
// code share (the float16 rules, the device-ops element bodies).
#ifndef ZEROSHARD_KERNELS_COMMON_HOST_DEVICE_H_
#define ZEROSHARD_KERNELS_COMMON_HOST_DEVICE_H_

// __host__ __device__ under nvcc; empty for the host compiler, so a header
// using it stays plain C++17 for gcc and clang.
#if defined(__CUDACC__)
#define ZS_HOST_DEVICE __host__ __device__
#else
#define ZS_HOST_DEVICE
#endif

// A shared element function: callable on both sides and always inlined. The
// CPU kernels include these functions from files compiled with different ISA
// flags; always_inline keeps the linker from merging an AVX-512 compiled copy
// into code that runs on a CPU without AVX-512 (see
// kernels/cpu/internal/kernel_inline.h).
#define ZS_HOST_DEVICE_INLINE ZS_HOST_DEVICE inline __attribute__((always_inline))

#endif  // ZEROSHARD_KERNELS_COMMON_HOST_DEVICE_H_
