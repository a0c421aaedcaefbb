#include "kernels/reference/bf16_reference.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace zeroshard::kernels::reference {

uint16_t RoundToBf16Reference(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t upper = bits >> 16;
  const uint32_t dropped = bits & 0xffff;
  // A carry out of the mantissa bumps the exponent (up to inf): still exact.
  if (dropped > 0x8000 || (dropped == 0x8000 && (upper & 1))) ++upper;
  return static_cast<uint16_t>(upper);
}

double Bf16ValueReference(uint16_t h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (h >> 7) & 0xff;
  const int mantissa = h & 0x7f;
  if (exponent == 255) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  // Subnormals: mantissa * 2^-133; normals: (128 + mantissa) * 2^(exponent - 134).
  if (exponent == 0) return sign * std::ldexp(static_cast<double>(mantissa), -133);
  return sign * std::ldexp(128.0 + mantissa, exponent - 134);
}

}  // namespace zeroshard::kernels::reference
