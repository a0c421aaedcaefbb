// The median that example programs and benchmarks report (step times,
// repeats of a measurement): one definition, so a figure in mlp_demo's
// report and one in a benchmark's table mean the same thing.
#ifndef ZEROSHARD_EXAMPLES_COMMON_MEDIAN_H_
#define ZEROSHARD_EXAMPLES_COMMON_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace zeroshard::examples {

// The middle value of `v` (odd count), the mean of the two middle values
// (even count), 0 for an empty `v`.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + n / 2, v.end());
  const double upper = v[n / 2];
  if (n % 2 == 1) return upper;
  // The lower middle is the largest of the elements before the upper one.
  const double lower = *std::max_element(v.begin(), v.begin() + n / 2);
  return 0.5 * (lower + upper);
}

}  // namespace zeroshard::examples

#endif  // ZEROSHARD_EXAMPLES_COMMON_MEDIAN_H_
