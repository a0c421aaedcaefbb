#include "kernels/reference/norm_reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/norm.h"

namespace zeroshard::kernels::reference {

void BlockSumSquaresReference(const double* x, size_t n, double* out) {
  for (size_t start = 0; start < n; start += kNormBlock) {
    const size_t end = std::min(n, start + kNormBlock);
    long double sum = 0;
    for (size_t i = start; i < end; ++i) sum += static_cast<long double>(x[i]) * x[i];
    out[start / kNormBlock] = static_cast<double>(sum);
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
