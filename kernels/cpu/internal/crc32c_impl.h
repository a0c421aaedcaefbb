// The two CRC-32C implementations behind Crc32c (kernels/cpu/crc32c.h), each
// callable on its own so that tests and the benchmark can hold them side by
// side, and the GF(2) arithmetic both derive their tables from.
#ifndef ZEROSHARD_KERNELS_CPU_INTERNAL_CRC32C_IMPL_H_
#define ZEROSHARD_KERNELS_CPU_INTERNAL_CRC32C_IMPL_H_

#include <cstddef>
#include <cstdint>

namespace zeroshard::kernels {

// The Castagnoli polynomial, bit-reflected (0x1EDC6F41 written LSB first).
inline constexpr uint32_t kCrc32cPolynomial = 0x82F63B78u;

// A CRC register is a polynomial over GF(2) of degree < 32 in reflected bit
// order: bit 31 holds the coefficient of x^0, bit 0 that of x^31, so a right
// shift multiplies by x. Crc32cMultiplyModP(a, b) = a * b mod P.
// constexpr: the implementations evaluate it at compile time to build tables.
constexpr uint32_t Crc32cMultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  // m walks a's terms from x^0 upwards while b is multiplied by x.
  for (uint32_t m = 0x80000000u; m != 0; m >>= 1) {
    if ((a & m) != 0) product ^= b;
    b = (b & 1) != 0 ? (b >> 1) ^ kCrc32cPolynomial : b >> 1;
  }
  return product;
}

// x^(8 * bytes) mod P: multiplying a register by it has the effect of running
// it over `bytes` zero bytes (without the final XOR), which is how partial
// CRCs of consecutive pieces are combined.
constexpr uint32_t Crc32cZerosOperator(uint64_t bytes) {
  uint32_t result = 0x80000000u;  // x^0
  uint32_t power = 0x00800000u;   // x^8, then x^16, x^32, ...
  for (; bytes != 0; bytes >>= 1) {
    if ((bytes & 1) != 0) result = Crc32cMultiplyModP(result, power);
    power = Crc32cMultiplyModP(power, power);
  }
  return result;
}

// The table-driven implementation (slicing-by-8; any CPU, any byte order).
// Continues `crc` as Crc32cExtend does; data may be null when n is 0.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

// Whether this build has the SSE4.2 implementation (x86-64 only) and the
// running CPU can execute it.
bool Crc32cHardwareSupported();

// The SSE4.2 crc32-instruction implementation, with Crc32cPortable's
// contract. Only call it when Crc32cHardwareSupported(); in a build without
// it (not x86-64) it is the portable implementation.
uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t n);

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_INTERNAL_CRC32C_IMPL_H_
