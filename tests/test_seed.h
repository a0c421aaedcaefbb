// The random seed of a test binary: fresh every run, or the value of
// ZS_TEST_SEED (decimal or 0x-hex) to replay a failing run. The first call
// prints it; every failure message should carry SeedTrace().
#ifndef ZEROSHARD_TESTS_TEST_SEED_H_
#define ZEROSHARD_TESTS_TEST_SEED_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace zeroshard::testing {

inline uint64_t Seed() {
  static const uint64_t seed = [] {
    uint64_t value;
    if (const char* env = std::getenv("ZS_TEST_SEED")) {
      value = static_cast<uint64_t>(std::strtoull(env, nullptr, 0));
    } else {
      std::random_device rd;
      value = static_cast<uint64_t>((static_cast<uint64_t>(rd()) << 32) | rd());
    }
    std::printf("test seed %llu (ZS_TEST_SEED=%llu replays it)\n",
                static_cast<unsigned long long>(value), static_cast<unsigned long long>(value));
    return value;
  }();
  return seed;
}

inline std::string SeedTrace() {
  return "random seed " + std::to_string(Seed()) + " (ZS_TEST_SEED=" + std::to_string(Seed()) +
         " replays it)";
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_TEST_SEED_H_
