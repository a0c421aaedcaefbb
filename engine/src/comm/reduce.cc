#include "engine/src/comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace zeroshard {
namespace internal {

bool IsSummable(DType dtype) { return dtype != DType::kUInt8; }

bool ToSumType(DType dtype, kernels::SumType* type) {
  switch (dtype) {
    case DType::kFloat32:
      *type = kernels::SumType::kFp32;
      return true;
    case DType::kBFloat16:
      *type = kernels::SumType::kBf16;
      return true;
    case DType::kFloat16:
      *type = kernels::SumType::kFp16;
      return true;
    case DType::kFloat64:
      *type = kernels::SumType::kFp64;
      return true;
    case DType::kInt64:
      *type = kernels::SumType::kInt64;
      return true;
    default:
      return false;
  }
}

namespace {

// Elements per block: the accumulator lives on the stack and each block is
// fully read before any output is written (this is what makes in place safe).
constexpr int64_t kBlock = 1024;

// One leg of a rank-order sum for the types whose storage is their
// accumulator (fp32, fp64, int64): the accumulator starts from `partial`
// or, when it is null, input 0 (not from zero, so a lone -0.0 stays -0.0);
// `finish` stores it to every output, otherwise it is copied to outputs[0].
// SumInRankOrder is the leg without a partial that finishes.
template <typename T>
void LegTyped(const void* partial, const void* const* inputs, int num_inputs, void* const* outputs,
              int num_outputs, int64_t count, bool finish) {
  T acc[kBlock];
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    int first_input = 0;
    if (partial != nullptr) {
      std::memcpy(acc, static_cast<const T*>(partial) + begin, n * sizeof(T));
    } else {
      std::memcpy(acc, static_cast<const T*>(inputs[0]) + begin, n * sizeof(T));
      first_input = 1;
    }
    for (int k = first_input; k < num_inputs; ++k) {
      const T* in = static_cast<const T*>(inputs[k]) + begin;
      if constexpr (std::is_same_v<T, int64_t>) {
        // Wrap-around on overflow, as two's complement (no UB on signed overflow).
        for (int64_t i = 0; i < n; ++i) {
          acc[i] =
              static_cast<int64_t>(static_cast<uint64_t>(acc[i]) + static_cast<uint64_t>(in[i]));
        }
      } else {
        for (int64_t i = 0; i < n; ++i) acc[i] += in[i];
      }
    }
    for (int o = 0; o < (finish ? num_outputs : 1); ++o) {
      std::memcpy(static_cast<T*>(outputs[o]) + begin, acc, n * sizeof(T));
    }
  }
}

// The 16-bit types' leg: widen each block with the vectorised casts, add in
// fp32 in rank order and, to finish, narrow once. The casts give the same
// bits as scalar code, so every backend still agrees to the bit. Unfinished,
// the fp32 accumulator goes to outputs[0].
template <void (*Widen)(const uint16_t*, float*, size_t),
          void (*Narrow)(const float*, uint16_t*, size_t)>
void LegHalf(const void* partial, const void* const* inputs, int num_inputs, void* const* outputs,
             int num_outputs, int64_t count, bool finish) {
  float acc[kBlock];
  float term[kBlock];
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = static_cast<size_t>(std::min(kBlock, count - begin));
    int first_input = 0;
    if (partial != nullptr) {
      std::memcpy(acc, static_cast<const float*>(partial) + begin, n * sizeof(float));
    } else {
      Widen(static_cast<const uint16_t*>(inputs[0]) + begin, acc, n);
      first_input = 1;
    }
    for (int k = first_input; k < num_inputs; ++k) {
      Widen(static_cast<const uint16_t*>(inputs[k]) + begin, term, n);
      for (size_t i = 0; i < n; ++i) acc[i] += term[i];
    }
    if (!finish) {
      std::memcpy(static_cast<float*>(outputs[0]) + begin, acc, n * sizeof(float));
      continue;
    }
    for (int o = 0; o < num_outputs; ++o) {
      Narrow(acc, static_cast<uint16_t*>(outputs[o]) + begin, n);
    }
  }
}

void Leg(const void* partial, const void* const* inputs, int num_inputs, void* const* outputs,
         int num_outputs, int64_t count, DType dtype, bool finish) {
  switch (dtype) {
    case DType::kFloat32:
      return LegTyped<float>(partial, inputs, num_inputs, outputs, num_outputs, count, finish);
    case DType::kBFloat16:
      return LegHalf<ConvertBf16ToFp32, ConvertFp32ToBf16>(partial, inputs, num_inputs, outputs,
                                                           num_outputs, count, finish);
    case DType::kFloat16:
      return LegHalf<ConvertFp16ToFp32, ConvertFp32ToFp16>(partial, inputs, num_inputs, outputs,
                                                           num_outputs, count, finish);
    case DType::kFloat64:
      return LegTyped<double>(partial, inputs, num_inputs, outputs, num_outputs, count, finish);
    case DType::kInt64:
      return LegTyped<int64_t>(partial, inputs, num_inputs, outputs, num_outputs, count, finish);
    case DType::kUInt8:
      return;  // Rejected by argument checks before any backend runs.
  }
}

}  // namespace

DType AccumulatorDType(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
    case DType::kFloat16:
      return DType::kFloat32;
    default:
      return dtype;
  }
}

void ContinueSumInRankOrder(const void* partial, const void* const* inputs, int num_inputs,
                            void* out, int64_t count, DType dtype, bool finish) {
  if (count <= 0 || (partial == nullptr && num_inputs <= 0)) return;
  void* outputs[] = {out};
  Leg(partial, inputs, num_inputs, outputs, 1, count, dtype, finish);
}

void SumInRankOrder(const void* const* inputs, int num_inputs, void* const* outputs,
                    int num_outputs, int64_t count, DType dtype) {
  if (count <= 0 || num_inputs <= 0) return;
  Leg(nullptr, inputs, num_inputs, outputs, num_outputs, count, dtype, /*finish=*/true);
}

}  // namespace internal
}  // namespace zeroshard
