// What a test binary reads from its environment besides the seed
// (test_seed.h): a lighter mode for slow builds and a factor for wall-time
// bounds. The sanitizer builds set both for every test
// (cmake/zs_helpers.cmake); docs/testing.md lists which tests honour them.
#ifndef ZEROSHARD_TESTS_TEST_ENV_H_
#define ZEROSHARD_TESTS_TEST_ENV_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zeroshard::testing {

// ZS_TEST_LIGHT=1: a sweep that dominates the suite's run time uses smaller
// cases (each such test says which); what it checks stays the same. The first
// call says so on stdout, so a light run is never mistaken for a full one.
inline bool LightMode() {
  static const bool light = [] {
    const char* env = std::getenv("ZS_TEST_LIGHT");
    const bool on = env != nullptr && std::strcmp(env, "1") == 0;
    if (on) std::printf("ZS_TEST_LIGHT=1: heavy sweeps use their light cases\n");
    return on;
  }();
  return light;
}

// A wall-time bound of `seconds`, multiplied by ZS_TEST_TIME_SCALE (a
// positive number, default 1): instrumented builds run several times slower.
inline double TimeLimit(double seconds) {
  static const double scale = [] {
    const char* env = std::getenv("ZS_TEST_TIME_SCALE");
    const double value = env != nullptr ? std::strtod(env, nullptr) : 1.0;
    return value > 0 ? value : 1.0;
  }();
  return seconds * scale;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_TEST_ENV_H_
