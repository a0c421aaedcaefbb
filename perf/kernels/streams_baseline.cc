#include "perf/kernels/streams_baseline.h"

namespace zeroshard::perf {

#define ZS_STREAMS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
ZS_STREAMS_CLONES void StreamsPassF32(const float* __restrict grad, float* __restrict p,
                                      float* __restrict m, float* __restrict v,
                                      uint16_t* __restrict out, size_t i, size_t e) {
  for (size_t k = i; k < e; ++k) {
    const float g = grad[k];
    p[k] = 0.5f * p[k] + 0.25f * g;
    m[k] = 0.5f * m[k] + 0.25f * g;
    v[k] = 0.5f * v[k] + 0.25f * g * g;
    if (out != nullptr) out[k] = static_cast<uint16_t>(k);
  }
}
ZS_STREAMS_CLONES void StreamsPassU16(const uint16_t* __restrict grad, float* __restrict p,
                                      float* __restrict m, float* __restrict v,
                                      uint16_t* __restrict out, size_t i, size_t e) {
  for (size_t k = i; k < e; ++k) {
    const float g = static_cast<float>(grad[k]) * (1.0f / 65536.0f);
    p[k] = 0.5f * p[k] + 0.25f * g;
    m[k] = 0.5f * m[k] + 0.25f * g;
    v[k] = 0.5f * v[k] + 0.25f * g * g;
    out[k] = static_cast<uint16_t>(k);
  }
}
#undef ZS_STREAMS_CLONES

}  // namespace zeroshard::perf
