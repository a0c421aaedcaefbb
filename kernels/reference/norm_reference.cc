#include "kernels/reference/norm_reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace zeroshard::kernels::reference {

void BlockSumSquaresReference(const double* x, size_t n, size_t block, double* out) {
  for (size_t start = 0; start < n; start += block) {
    const size_t end = std::min(n, start + block);
    long double sum = 0;
    for (size_t i = start; i < end; ++i) sum += static_cast<long double>(x[i]) * x[i];
    out[start / block] = static_cast<double>(sum);
  }
}

long double CompensatedSum(const double* x, size_t n) {
  std::vector<double> sorted(x, x + n);
  std::sort(sorted.begin(), sorted.end(),
            [](double a, double b) { return std::fabs(a) < std::fabs(b); });
  long double sum = 0;
  long double compensation = 0;
  for (double xi : sorted) {
    const long double t = sum + xi;
    if (std::fabs(sum) >= std::fabs(static_cast<long double>(xi))) {
      compensation += (sum - t) + xi;
    } else {
      compensation += (xi - t) + sum;
    }
    sum = t;
  }
  return sum + compensation;
}

}  // namespace zeroshard::kernels::reference
