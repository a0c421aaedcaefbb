// CRC-32C (Castagnoli): the checksum of checkpoint files and their parts.
//
// The iSCSI / ext4 / LevelDB CRC: reflected polynomial 0x82F63B78, initial
// value 0xFFFFFFFF, final XOR 0xFFFFFFFF; Crc32c("123456789") == 0xE3069283.
// Two implementations give the same values: SSE4.2's crc32 instruction on
// x86-64 CPUs that have it, and a portable table-driven one elsewhere. The
// choice is made once per process from CPUID. Thread-safe; no allocation.
#ifndef ZEROSHARD_KERNELS_CPU_CRC32C_H_
#define ZEROSHARD_KERNELS_CPU_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace zeroshard::kernels {

// CRC-32C of n bytes at data (data may be null when n is 0).
uint32_t Crc32c(const void* data, size_t n);

// Continues a CRC: Crc32cExtend(Crc32c(a, na), b, nb) == Crc32c(a||b);
// Crc32cExtend(0, d, n) == Crc32c(d, n). So a file can be checksummed in
// pieces as it is written or read.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// "sse4.2" or "portable": the implementation chosen once per process.
const char* Crc32cImplementation();

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_CRC32C_H_
