// The Avx512 Adam path (this file is compiled with the Avx512 flags; see
// kernels/CMakeLists.txt).
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/internal/adam_body.h"
#include "kernels/cpu/internal/paths.h"
#include "kernels/cpu/internal/simd_avx512.h"

namespace zeroshard::kernels::internal {

ZS_DEFINE_ADAM_PATH(Avx512Vec, Avx512)

}  // namespace zeroshard::kernels::internal
