// Training text for the GPT trainer tests: random bytes with a learnable
// next-byte rule plus noise (a quarter of the bytes random, the rest
// b[i] = 7 b[i-1] + 3 mod 256), fresh per seed.
#ifndef ZEROSHARD_TESTS_EXAMPLES_GPT_TEST_TEXT_H_
#define ZEROSHARD_TESTS_EXAMPLES_GPT_TEST_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zeroshard::gpt::testing_text {

inline std::vector<uint8_t> RandomText(uint64_t seed, size_t n) {
  std::vector<uint8_t> t(n);
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t[i] = (x % 4 == 0 || i == 0) ? static_cast<uint8_t>(x >> 24)
                                  : static_cast<uint8_t>(t[i - 1] * 7 + 3);
  }
  return t;
}

}  // namespace zeroshard::gpt::testing_text

#endif  // ZEROSHARD_TESTS_EXAMPLES_GPT_TEST_TEXT_H_
