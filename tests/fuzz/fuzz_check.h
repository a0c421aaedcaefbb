// A property every fuzz target asserts beyond "no crash": when it fails, the
// target prints what was expected and aborts, so libFuzzer saves the input as
// a crash reproducer like any sanitizer report.
#ifndef ZEROSHARD_TESTS_FUZZ_FUZZ_CHECK_H_
#define ZEROSHARD_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define ZS_FUZZ_CHECK(condition, what)                                                         \
  do {                                                                                         \
    if (!(condition)) {                                                                        \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s (%s)\n", __FILE__, __LINE__, what, \
                   #condition);                                                                \
      std::abort();                                                                            \
    }                                                                                          \
  } while (false)

#endif  // ZEROSHARD_TESTS_FUZZ_FUZZ_CHECK_H_
