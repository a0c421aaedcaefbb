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

struct Fp32Codec {
  using Storage = float;
  using Acc = float;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return v; }
};
struct Fp64Codec {
  using Storage = double;
  using Acc = double;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return v; }
};
struct Int64Codec {
  using Storage = int64_t;
  using Acc = int64_t;
  static Acc Load(Storage v) { return v; }
  // Wrap-around on overflow, as two's complement (no UB on signed overflow).
  static Storage Store(Acc v) { return v; }
};

template <typename Codec>
void SumTyped(const void* const* inputs, int num_inputs, void* const* outputs, int num_outputs,
              int64_t count) {
  using Storage = typename Codec::Storage;
  using Acc = typename Codec::Acc;
  Acc acc[kBlock];
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    // Start from x_0 (not from zero) so a lone -0.0 stays -0.0.
    const Storage* first = static_cast<const Storage*>(inputs[0]) + begin;
    for (int64_t i = 0; i < n; ++i) acc[i] = Codec::Load(first[i]);
    for (int k = 1; k < num_inputs; ++k) {
      const Storage* in = static_cast<const Storage*>(inputs[k]) + begin;
      if constexpr (std::is_same_v<Acc, int64_t>) {
        for (int64_t i = 0; i < n; ++i) {
          acc[i] =
              static_cast<int64_t>(static_cast<uint64_t>(acc[i]) + static_cast<uint64_t>(in[i]));
        }
      } else {
        for (int64_t i = 0; i < n; ++i) acc[i] += Codec::Load(in[i]);
      }
    }
    for (int o = 0; o < num_outputs; ++o) {
      Storage* out = static_cast<Storage*>(outputs[o]) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = Codec::Store(acc[i]);
    }
  }
}

// 16-bit types: widen each block with the vectorised casts, add in fp32 in
// rank order and narrow once. The casts give the same bits as the scalar
// codecs above, so every backend still agrees to the bit.
template <void (*Widen)(const uint16_t*, float*, size_t),
          void (*Narrow)(const float*, uint16_t*, size_t)>
void SumHalf(const void* const* inputs, int num_inputs, void* const* outputs, int num_outputs,
             int64_t count) {
  float acc[kBlock];
  float term[kBlock];
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = static_cast<size_t>(std::min(kBlock, count - begin));
    Widen(static_cast<const uint16_t*>(inputs[0]) + begin, acc, n);
    for (int k = 1; k < num_inputs; ++k) {
      Widen(static_cast<const uint16_t*>(inputs[k]) + begin, term, n);
      for (size_t i = 0; i < n; ++i) acc[i] += term[i];
    }
    for (int o = 0; o < num_outputs; ++o) {
      Narrow(acc, static_cast<uint16_t*>(outputs[o]) + begin, n);
    }
  }
}

// One leg of a sum (ContinueSumInRankOrder) for the types whose storage is
// their accumulator: the accumulator starts from `partial` or input 0.
template <typename Storage, typename Acc>
void ContinueTyped(const void* partial, const void* const* inputs, int num_inputs, void* out,
                   int64_t count, bool finish) {
  const auto load = [](Storage v) { return static_cast<Acc>(v); };
  const auto store = [](Acc v) { return static_cast<Storage>(v); };
  Acc acc[kBlock];
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    int first_input = 0;
    if (partial != nullptr) {
      std::memcpy(acc, static_cast<const Acc*>(partial) + begin, n * sizeof(Acc));
    } else {
      const Storage* first = static_cast<const Storage*>(inputs[0]) + begin;
      for (int64_t i = 0; i < n; ++i) acc[i] = load(first[i]);
      first_input = 1;
    }
    for (int k = first_input; k < num_inputs; ++k) {
      const Storage* in = static_cast<const Storage*>(inputs[k]) + begin;
      if constexpr (std::is_same_v<Acc, int64_t>) {
        for (int64_t i = 0; i < n; ++i) {
          acc[i] =
              static_cast<int64_t>(static_cast<uint64_t>(acc[i]) + static_cast<uint64_t>(in[i]));
        }
      } else {
        for (int64_t i = 0; i < n; ++i) acc[i] += load(in[i]);
      }
    }
    if (finish) {
      Storage* o = static_cast<Storage*>(out) + begin;
      for (int64_t i = 0; i < n; ++i) o[i] = store(acc[i]);
    } else {
      std::memcpy(static_cast<Acc*>(out) + begin, acc, n * sizeof(Acc));
    }
  }
}

// The 16-bit types' leg, a block of each input widened at a time as
// SumHalf does (the same casts, so the same bits).
template <void (*Widen)(const uint16_t*, float*, size_t),
          void (*Narrow)(const float*, uint16_t*, size_t)>
void ContinueHalf(const void* partial, const void* const* inputs, int num_inputs, void* out,
                  int64_t count, bool finish) {
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
    if (finish) {
      Narrow(acc, static_cast<uint16_t*>(out) + begin, n);
    } else {
      std::memcpy(static_cast<float*>(out) + begin, acc, n * sizeof(float));
    }
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
  switch (dtype) {
    case DType::kFloat32:
      return ContinueTyped<float, float>(partial, inputs, num_inputs, out, count, finish);
    case DType::kBFloat16:
      return ContinueHalf<ConvertBf16ToFp32, ConvertFp32ToBf16>(partial, inputs, num_inputs, out,
                                                                count, finish);
    case DType::kFloat16:
      return ContinueHalf<ConvertFp16ToFp32, ConvertFp32ToFp16>(partial, inputs, num_inputs, out,
                                                                count, finish);
    case DType::kFloat64:
      return ContinueTyped<double, double>(partial, inputs, num_inputs, out, count, finish);
    case DType::kInt64:
      return ContinueTyped<int64_t, int64_t>(partial, inputs, num_inputs, out, count, finish);
    case DType::kUInt8:
      return;
  }
}

void SumInRankOrder(const void* const* inputs, int num_inputs, void* const* outputs,
                    int num_outputs, int64_t count, DType dtype) {
  if (count <= 0 || num_inputs <= 0) return;
  switch (dtype) {
    case DType::kFloat32:
      return SumTyped<Fp32Codec>(inputs, num_inputs, outputs, num_outputs, count);
    case DType::kBFloat16:
      return SumHalf<ConvertBf16ToFp32, ConvertFp32ToBf16>(inputs, num_inputs, outputs, num_outputs,
                                                           count);
    case DType::kFloat16:
      return SumHalf<ConvertFp16ToFp32, ConvertFp32ToFp16>(inputs, num_inputs, outputs, num_outputs,
                                                           count);
    case DType::kFloat64:
      return SumTyped<Fp64Codec>(inputs, num_inputs, outputs, num_outputs, count);
    case DType::kInt64:
      return SumTyped<Int64Codec>(inputs, num_inputs, outputs, num_outputs, count);
    case DType::kUInt8:
      return;  // Rejected by argument checks before any backend runs.
  }
}

}  // namespace internal
}  // namespace zeroshard
