// The Avx2 Adam path (this file is compiled with the Avx2 flags; see
// kernels/CMakeLists.txt).
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/internal/adam_body.h"
#include "kernels/cpu/internal/paths.h"
#include "kernels/cpu/internal/simd_avx2.h"

namespace zeroshard::kernels::internal {

ZS_DEFINE_ADAM_PATH(Avx2Vec, Avx2)

}  // namespace zeroshard::kernels::internal
