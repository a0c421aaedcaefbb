// Overflow-checked integer arithmetic for element and byte counts.
//
// Signed overflow is undefined behaviour in C++, and a wrapped count turns
// "does not fit" into "fits, 0.0 GiB". Every element and byte count the
// layout, the buffer plan and the planner derive goes through these helpers
// (GCC/Clang's __builtin_*_overflow: exact, no wider type needed), and an
// overflow becomes an error at the caller, which names the quantity.
#ifndef ZEROSHARD_COMMON_CHECKED_MATH_H_
#define ZEROSHARD_COMMON_CHECKED_MATH_H_

#include <cmath>
#include <cstdint>
#include <optional>

namespace zeroshard {

// a + b, or nullopt when the sum does not fit in int64_t.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

// a * b, or nullopt when the product does not fit in int64_t.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// An int64_t that remembers whether any step overflowed, so a formula is
// written once and checked once: `(CheckedInt64(a) * b + c).value()`.
class CheckedInt64 {
 public:
  constexpr CheckedInt64(int64_t value = 0) : value_(value) {}  // NOLINT: implicit on purpose

  CheckedInt64& operator+=(CheckedInt64 other) {
    ok_ = ok_ && other.ok_ && !__builtin_add_overflow(value_, other.value_, &value_);
    return *this;
  }
  CheckedInt64& operator*=(CheckedInt64 other) {
    ok_ = ok_ && other.ok_ && !__builtin_mul_overflow(value_, other.value_, &value_);
    return *this;
  }
  friend CheckedInt64 operator+(CheckedInt64 a, CheckedInt64 b) { return a += b; }
  friend CheckedInt64 operator*(CheckedInt64 a, CheckedInt64 b) { return a *= b; }

  // False once any step overflowed.
  bool ok() const { return ok_; }
  // The exact result, or nullopt after an overflow.
  std::optional<int64_t> value() const {
    return ok_ ? std::optional<int64_t>(value_) : std::nullopt;
  }

 private:
  int64_t value_ = 0;
  bool ok_ = true;
};

// ceil(x / multiple) * multiple for x >= 0 and multiple >= 1, or nullopt on
// overflow.
inline std::optional<int64_t> CheckedRoundUp(int64_t x, int64_t multiple) {
  const int64_t blocks = x / multiple + (x % multiple != 0 ? 1 : 0);
  return CheckedMul(blocks, multiple);
}

// `x` rounded to the nearest integer, or nullopt when x is not finite or the
// result does not fit in int64_t (converting such a double is undefined
// behaviour). 2^63 is exact in double and every double of that magnitude is
// an integer, so the range test is exact too.
inline std::optional<int64_t> RoundToInt64(double x) {
  constexpr double kTwoTo63 = 9223372036854775808.0;
  if (!(x >= -kTwoTo63 && x < kTwoTo63)) return std::nullopt;  // also NaN
  return static_cast<int64_t>(std::llround(x));
}

}  // namespace zeroshard

#endif  // ZEROSHARD_COMMON_CHECKED_MATH_H_
