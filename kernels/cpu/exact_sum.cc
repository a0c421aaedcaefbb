// ExactSum: a fixed-point superaccumulator over int64 limbs.
//
// Limb i holds a signed multiple of 2^(kLowExponent + 32 i); the value is the
// sum over all limbs. Adding a double splits its 53-bit significand over (at
// most) three neighbouring limbs, each share below 2^32, so a limb can take
// 2^31 adds before it could overflow. Normalize() carries everything above
// 32 bits into the next limb; it runs every kAddsPerNormalize adds and at the
// end of AddBlocks() and Merge(), so the limbs a caller reads after those are
// canonical (each below 2^32, except the top one) and the limbs of up to 2^31
// ranks can be summed as integers without overflow.
//
// Value() depends only on the exact sum (it rounds a canonical copy), which is
// what makes the result independent of the order of adds and merges.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/norm.h"

namespace zeroshard::kernels {
namespace {

constexpr int kLowExponent = -298;  // weight of bit 0 of limb 0
constexpr int kLimbBits = 32;
// Exclusive upper bound of an input (the contract of norm.h).
constexpr int kHighExponent = 280;
// Between normalizations each limb grows by < 2^32 per add: 2^20 adds keep
// every limb below 2^53, far from int64 overflow even after a few merges.
constexpr int64_t kAddsPerNormalize = int64_t{1} << 20;

// Carries the part of each limb above 32 bits into the next one (arithmetic
// shifts, so a negative limb borrows). The top value limb keeps its excess.
void Carry(int64_t* limbs) {
  for (int i = 0; i + 1 < ExactSum::kValueLimbs; ++i) {
    const int64_t carry = limbs[i] >> kLimbBits;
    limbs[i] -= carry * (int64_t{1} << kLimbBits);
    limbs[i + 1] += carry;
  }
}

}  // namespace

void ExactSum::Add(double x) {
  // Negative, non-finite, too large: counted, not added (Value() is then +inf).
  if (!(x >= 0.0) || !(x < std::ldexp(1.0, kHighExponent))) {
    ++limbs_[kValueLimbs];
    return;
  }
  if (x == 0.0) return;
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const int biased_exponent = static_cast<int>(bits >> 52);
  uint64_t significand = bits & ((uint64_t{1} << 52) - 1);
  int exponent;  // x == significand * 2^exponent
  if (biased_exponent == 0) {
    exponent = -1074;
  } else {
    significand |= uint64_t{1} << 52;
    exponent = biased_exponent - 1075;
  }
  int shift = exponent - kLowExponent;
  if (shift < 0) {
    // Bits below 2^-298 cannot be held exactly: out of range unless they are 0.
    const int drop = -shift;
    if (drop >= 64 || (significand & ((uint64_t{1} << drop) - 1)) != 0) {
      ++limbs_[kValueLimbs];
      return;
    }
    significand >>= drop;
    shift = 0;
  }
  const int limb = shift / kLimbBits;
  const unsigned __int128 wide = static_cast<unsigned __int128>(significand) << (shift % kLimbBits);
  for (int k = 0; k < 3 && limb + k < kValueLimbs; ++k) {
    limbs_[limb + k] += static_cast<int64_t>((wide >> (kLimbBits * k)) & 0xffffffffu);
  }
  if (++adds_since_normalize_ >= kAddsPerNormalize) Normalize();
}

void ExactSum::AddBlocks(const double* x, size_t n) {
  for (size_t i = 0; i < n; ++i) Add(x[i]);
  Normalize();
}

void ExactSum::Merge(const ExactSum& other) {
  for (int i = 0; i < kLimbs; ++i) limbs_[i] += other.limbs_[i];
  Normalize();
}

void ExactSum::Normalize() {
  Carry(limbs_.data());
  adds_since_normalize_ = 0;
}

double ExactSum::Value() const {
  if (non_finite() != 0) return std::numeric_limits<double>::infinity();
  std::array<int64_t, kLimbs> limbs = limbs_;
  Carry(limbs.data());
  int top = kValueLimbs - 1;
  while (top >= 0 && limbs[top] == 0) --top;
  if (top < 0) return 0.0;
  // Only limbs edited from outside (not a sum of valid accumulators) can give
  // a negative total.
  if (limbs[top] < 0) return std::numeric_limits<double>::quiet_NaN();

  // The top three limbs (up to 127 bits) plus a sticky bit for the rest are
  // enough to round to 53 bits.
  auto limb_at = [&](int i) -> unsigned __int128 {
    return i >= 0 ? static_cast<unsigned __int128>(static_cast<uint64_t>(limbs[i])) : 0;
  };
  const int low = top - 2;
  const unsigned __int128 head =
      (limb_at(top) << (2 * kLimbBits)) | (limb_at(top - 1) << kLimbBits) | limb_at(low);
  bool sticky = false;
  for (int i = 0; i < low; ++i) sticky |= limbs[i] != 0;
  const int exponent = kLowExponent + kLimbBits * low;  // value ~= head * 2^exponent

  int length = 0;
  for (unsigned __int128 h = head; h != 0; h >>= 1) ++length;
  if (length <= 53) {
    // Exact: every lower limb is zero when the head has so few bits.
    return std::ldexp(static_cast<double>(static_cast<uint64_t>(head)), exponent);
  }
  const int drop = length - 53;
  uint64_t significand = static_cast<uint64_t>(head >> drop);
  const unsigned __int128 rest = head & ((static_cast<unsigned __int128>(1) << drop) - 1);
  const unsigned __int128 half = static_cast<unsigned __int128>(1) << (drop - 1);
  // Round to nearest, ties to even.
  if (rest > half || (rest == half && (sticky || (significand & 1) != 0))) ++significand;
  return std::ldexp(static_cast<double>(significand), exponent + drop);
}

}  // namespace zeroshard::kernels
