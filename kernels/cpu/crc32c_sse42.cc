// CRC-32C with the SSE4.2 crc32 instruction (x86-64). Compiled with -msse4.2
// (kernels/CMakeLists.txt) and called only when the CPU has it
// (Crc32cHardwareSupported). Everything here but Crc32cHardware has internal
// linkage, so no function compiled for SSE4.2 can stand in for a portable
// one at link time.
#include <nmmintrin.h>

#include <cstring>

#include "kernels/cpu/internal/crc32c_impl.h"

namespace zeroshard::kernels {
namespace {

// The crc32 instruction takes 3 cycles but a new one can start every cycle,
// so one dependency chain uses a third of the unit. Long inputs are cut into
// blocks of three stripes whose CRCs run as three independent chains and are
// then combined: crc(A||B||C) = shift(shift(crc(A), |B|) ^ crc0(B), |C|) ^
// crc0(C), where crc0 starts from a zero register and shift(s, n) multiplies
// the register by x^(8n) mod P (Crc32cZerosOperator). Long stripes amortise
// the combination; short ones let inputs of a few KiB use all three chains.
constexpr size_t kLongStripe = 8192;
constexpr size_t kShortStripe = 256;

// shift(s, stripe) as four byte-indexed lookups: the operator is linear, so
// it is the XOR of its values on each byte of s.
struct ShiftTable {
  uint32_t by_byte[4][256];
};

constexpr ShiftTable MakeShiftTable(size_t stripe) {
  ShiftTable t{};
  const uint32_t zeros = Crc32cZerosOperator(stripe);
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      t.by_byte[k][b] = Crc32cMultiplyModP(zeros, b << (8 * k));
    }
  }
  return t;
}

constexpr ShiftTable kLongShift = MakeShiftTable(kLongStripe);
constexpr ShiftTable kShortShift = MakeShiftTable(kShortStripe);

inline uint32_t Shift(const ShiftTable& t, uint32_t state) {
  return t.by_byte[0][state & 0xff] ^ t.by_byte[1][(state >> 8) & 0xff] ^
         t.by_byte[2][(state >> 16) & 0xff] ^ t.by_byte[3][state >> 24];
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // x86-64 is little-endian, as the CRC wants
  return v;
}

// Runs the register over as many blocks of 3 x kStripe bytes as [*p, *p + *n)
// holds, advancing *p and *n past them.
template <size_t kStripe>
inline uint32_t ThreeWay(uint32_t state, const uint8_t** p, size_t* n, const ShiftTable& shift) {
  while (*n >= 3 * kStripe) {
    const uint8_t* a = *p;
    uint64_t crc_a = state, crc_b = 0, crc_c = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      crc_a = _mm_crc32_u64(crc_a, Load64(a + i));
      crc_b = _mm_crc32_u64(crc_b, Load64(a + kStripe + i));
      crc_c = _mm_crc32_u64(crc_c, Load64(a + 2 * kStripe + i));
    }
    state = Shift(shift, static_cast<uint32_t>(crc_a)) ^ static_cast<uint32_t>(crc_b);
    state = Shift(shift, state) ^ static_cast<uint32_t>(crc_c);
    *p += 3 * kStripe;
    *n -= 3 * kStripe;
  }
  return state;
}

}  // namespace

uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t n) {
  if (n == 0) return crc;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t state = ~crc;
  // Bytes up to an 8-byte boundary, so that no 8-byte load splits a cache line.
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; ++p, --n) {
    state = _mm_crc32_u8(state, *p);
  }
  state = ThreeWay<kLongStripe>(state, &p, &n, kLongShift);
  state = ThreeWay<kShortStripe>(state, &p, &n, kShortShift);
  uint64_t state64 = state;
  for (; n >= 8; p += 8, n -= 8) state64 = _mm_crc32_u64(state64, Load64(p));
  state = static_cast<uint32_t>(state64);
  for (; n > 0; ++p, --n) state = _mm_crc32_u8(state, *p);
  return ~state;
}

}  // namespace zeroshard::kernels
