// The portable CRC-32C and the once-per-process choice of implementation.
#include "kernels/cpu/crc32c.h"

#include "kernels/cpu/internal/crc32c_impl.h"

namespace zeroshard::kernels {
namespace {

// Slicing-by-8 (Intel's method, as in LevelDB and zlib): kSlices[k][b] is the
// register after byte b followed by k zero bytes, so one table lookup per
// byte of an 8-byte word, with no dependency between the eight lookups.
struct SliceTables {
  uint32_t table[8][256];
};

constexpr SliceTables MakeSliceTables() {
  SliceTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 1) != 0 ? (crc >> 1) ^ kCrc32cPolynomial : crc >> 1;
    }
    t.table[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t prev = t.table[k - 1][b];
      t.table[k][b] = (prev >> 8) ^ t.table[0][prev & 0xff];
    }
  }
  return t;
}

constexpr SliceTables kSlices = MakeSliceTables();

// Little-endian by construction (the register is reflected, so its low byte
// meets the first data byte); compilers turn this into one load on x86-64.
inline uint64_t LoadLittleEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct Implementation {
  uint32_t (*extend)(uint32_t crc, const void* data, size_t n);
  const char* name;
};

const Implementation& Chosen() {
  static const Implementation chosen = Crc32cHardwareSupported()
                                           ? Implementation{&Crc32cHardware, "sse4.2"}
                                           : Implementation{&Crc32cPortable, "portable"};
  return chosen;
}

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n) {
  if (n == 0) return crc;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t state = ~crc;
  const auto& t = kSlices.table;
  for (; n >= 8; p += 8, n -= 8) {
    const uint64_t word = LoadLittleEndian64(p) ^ state;
    state = t[7][word & 0xff] ^ t[6][(word >> 8) & 0xff] ^ t[5][(word >> 16) & 0xff] ^
            t[4][(word >> 24) & 0xff] ^ t[3][(word >> 32) & 0xff] ^ t[2][(word >> 40) & 0xff] ^
            t[1][(word >> 48) & 0xff] ^ t[0][word >> 56];
  }
  for (; n > 0; ++p, --n) state = (state >> 8) ^ t[0][(state ^ *p) & 0xff];
  return ~state;
}

bool Crc32cHardwareSupported() {
#if defined(ZS_CRC32C_SSE42)
  // Needed when the first call comes from a static initializer, before the
  // runtime has filled in the CPU model.
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") != 0;
#else
  return false;
#endif
}

#if !defined(ZS_CRC32C_SSE42)
uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t n) {
  return Crc32cPortable(crc, data, n);
}
#endif

uint32_t Crc32c(const void* data, size_t n) { return Chosen().extend(0, data, n); }

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  return Chosen().extend(crc, data, n);
}

const char* Crc32cImplementation() { return Chosen().name; }

}  // namespace zeroshard::kernels
