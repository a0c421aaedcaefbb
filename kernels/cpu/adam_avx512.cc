// The Avx512 Adam path (this file is compiled with the Avx512 flags; see
// kernels/CMakeLists.txt).
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/internal/adam_body.h"
#include "kernels/cpu/internal/paths.h"
#include "kernels/cpu/internal/simd_avx512.h"

namespace zeroshard::kernels::internal {

void AdamFp32Avx512(float* param, const float* grad, float* m, float* v, size_t n,
                    const AdamConstants& c) {
  AdamFp32With<Avx512Vec>(param, grad, m, v, n, c);
}
void AdamMixedBf16Avx512(float* master, uint16_t* param_out, const float* grad, float* m, float* v,
                         size_t n, const AdamConstants& c) {
  AdamMixedBf16With<Avx512Vec>(master, param_out, grad, m, v, n, c);
}
void AdamMixedBf16GradBf16Avx512(float* master, uint16_t* param_out, const uint16_t* grad, float* m,
                                 float* v, size_t n, const AdamConstants& c) {
  AdamMixedBf16With<Avx512Vec>(master, param_out, grad, m, v, n, c);
}

}  // namespace zeroshard::kernels::internal
