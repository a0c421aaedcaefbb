// The same-traffic streams baseline of the AdamW update (adam_bench,
// offload_bench): the update's own memory streams with trivial arithmetic.
// One pass reads the gradient, updates the params (or fp32 master) and both
// moments in place (x = 0.5 x + 0.25 g; v from g^2) and, where `out` is set,
// writes 16-bit params: exactly the bytes of the fused AdamW in its access
// pattern, so it is the roofline of that traffic (a kernel near it is bound
// by memory, not by its arithmetic). The values converge to fixed points, so
// they stay normal whatever the number of passes.
#ifndef ZEROSHARD_PERF_KERNELS_STREAMS_BASELINE_H_
#define ZEROSHARD_PERF_KERNELS_STREAMS_BASELINE_H_

#include <cstddef>
#include <cstdint>

namespace zeroshard::perf {

// Elements [i, e) with an fp32 gradient; out == nullptr: no 16-bit params
// (fp32 AdamW). Built for AVX-512, AVX2 and the baseline ISA (chosen at load
// time) so that, like the kernels, it is not held back by 4-wide arithmetic.
void StreamsPassF32(const float* grad, float* p, float* m, float* v, uint16_t* out, size_t i,
                    size_t e);
// The same with a 16-bit gradient (bf16 or fp16: any cheap widening) and
// 16-bit params: `out` must not be null (a 16-bit gradient comes with mixed
// precision only).
void StreamsPassU16(const uint16_t* grad, float* p, float* m, float* v, uint16_t* out, size_t i,
                    size_t e);

}  // namespace zeroshard::perf

#endif  // ZEROSHARD_PERF_KERNELS_STREAMS_BASELINE_H_
