// The random seed of a kernel test binary: fresh every run, or the value of
// ZS_TEST_SEED (decimal or 0x-hex) to replay a failing run. Every failure
// message carries SeedTrace().
#ifndef ZEROSHARD_TESTS_KERNELS_TEST_SEED_H_
#define ZEROSHARD_TESTS_KERNELS_TEST_SEED_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace zeroshard::kernels::testing {

inline uint64_t Seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("ZS_TEST_SEED")) {
      return static_cast<uint64_t>(std::strtoull(env, nullptr, 0));
    }
    std::random_device rd;
    return static_cast<uint64_t>((static_cast<uint64_t>(rd()) << 32) | rd());
  }();
  return seed;
}

inline std::string SeedTrace() {
  return "random seed " + std::to_string(Seed()) + " (ZS_TEST_SEED=" + std::to_string(Seed()) +
         " replays it)";
}

}  // namespace zeroshard::kernels::testing

#endif  // ZEROSHARD_TESTS_KERNELS_TEST_SEED_H_
