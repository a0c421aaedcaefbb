// exp(t) for t <= 0 in fp32, branch-free so that the element loops of the
// example trainers' math (the MLP's GELU, the GPT's softmax and gelu_new)
// vectorize. Header-only: the one copy of the polynomial.
#ifndef ZEROSHARD_EXAMPLES_COMMON_EXP_NON_POSITIVE_H_
#define ZEROSHARD_EXAMPLES_COMMON_EXP_NON_POSITIVE_H_

#include <cstdint>
#include <cstring>

namespace zeroshard::examples {

// Cephes' expf: t = k ln2 + r with |r| <= ln2 / 2, ln2 split in two
// (Cody-Waite) so that r is exact, exp(r) by a degree-6 polynomial (relative
// error ~1 ulp), times 2^k built in the exponent bits. t is clamped at -87,
// where exp is below 2^-125: the result stays a normal number (every caller
// adds it to a value >= 1 or multiplies it by a probability or by at most
// |x| / sqrt(2 pi), so the clamp changes nothing they return beyond 1e-36).
inline float ExpNonPositive(float t) {
  // A select between values (no arithmetic in one arm): with
  // -fno-trapping-math (the callers' CMakeLists.txt) GCC if-converts it and
  // the loops stay vectorized.
  t = t < -87.0f ? -87.0f : t;
  // Adding and subtracting 1.5 * 2^23 rounds t / ln2 to the nearest integer.
  constexpr float kRoundMagic = 12582912.0f;
  const float k = (t * 1.44269504088896341f + kRoundMagic) - kRoundMagic;
  float r = t - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace zeroshard::examples

#endif  // ZEROSHARD_EXAMPLES_COMMON_EXP_NON_POSITIVE_H_
