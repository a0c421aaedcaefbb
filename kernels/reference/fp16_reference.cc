#include "kernels/reference/fp16_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace zeroshard::kernels::reference {

uint16_t RoundToFp16Reference(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    return static_cast<uint16_t>(sign | 0x7e00u | ((bits >> 13) & 0x3ffu));
  }
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return static_cast<uint16_t>(sign | 0x7c00u);
  // a lies in the binade [2^e, 2^(e+1)) of fp16 spacing 2^(e-10); below
  // 2^-14 the spacing stays 2^-24 (subnormals).
  int frexp_exponent;
  std::frexp(a, &frexp_exponent);
  const int e = std::max(frexp_exponent - 1, -14);
  // a / spacing is exact (a power of two); nearbyint rounds ties to even in
  // the default rounding mode, and an even multiple is an even mantissa.
  const double k = std::nearbyint(std::ldexp(a, 10 - e));
  const double r = std::ldexp(k, e - 10);  // exact: at most 2048 * spacing
  if (r == 0.0) return sign;
  if (r < std::ldexp(1.0, -14)) return static_cast<uint16_t>(sign | static_cast<uint16_t>(k));
  int r_exponent;
  const double fraction = std::frexp(r, &r_exponent);  // r = fraction * 2^r_exponent, [0.5, 1)
  const uint32_t biased = static_cast<uint32_t>(r_exponent - 1 + 15);
  const uint32_t mantissa = static_cast<uint32_t>(std::ldexp(fraction, 11)) - 1024u;
  return static_cast<uint16_t>(sign | (biased << 10) | mantissa);
}

double Fp16ValueReference(uint16_t h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(static_cast<double>(mantissa), -24);
  return sign * std::ldexp(1024.0 + mantissa, exponent - 25);
}

}  // namespace zeroshard::kernels::reference
