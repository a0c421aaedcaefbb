// Test data and reference sums for the communicator suite.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "engine/src/comm/reduce.h"
#include "examples/common/rng.h"
#include "tests/comm/comm_suite.h"

namespace zeroshard {
namespace testing_comm {
namespace {

using ::zeroshard::examples::SplitMix64;
using ::zeroshard::examples::SplitMix64At;

// The start of the random stream of (salt, rank); element i of the stream is
// SplitMix64At(base, i).
uint64_t StreamBase(uint64_t seed, uint64_t salt, int rank) {
  return SplitMix64(seed ^ SplitMix64(salt * 0x2545f4914f6cdd1dull ^
                                      SplitMix64(static_cast<uint64_t>(rank) + 1)));
}

float BitsToFloat(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

uint32_t FloatToBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

// Element bits from one random word: random sign, mantissa and a binary
// exponent in [-3, 4], so sums cancel and round in interesting ways; never
// zero, never special.
uint64_t ElementFromRandom(DType dtype, uint64_t r) {
  const uint64_t sign = r >> 63;
  const uint64_t exponent = (r >> 52) & 7u;  // value exponent = exponent - 3
  switch (dtype) {
    case DType::kFloat32:
      return (sign << 31) | ((127 + exponent - 3) << 23) | (r & 0x7fffffu);
    case DType::kBFloat16:
      return (sign << 15) | ((127 + exponent - 3) << 7) | (r & 0x7fu);
    case DType::kFloat16:
      return (sign << 15) | ((15 + exponent - 3) << 10) | (r & 0x3ffu);
    case DType::kFloat64:
      return (sign << 63) | ((1023 + exponent - 3) << 52) |
             (SplitMix64(r) & ((uint64_t{1} << 52) - 1));
    case DType::kInt64:
      return static_cast<uint64_t>(static_cast<int64_t>(r >> 24) - (int64_t{1} << 39));
    case DType::kUInt8:
      return r & 0xffu;
  }
  return 0;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const WorldParam& param) {
  return os << param.backend << "/" << param.size;
}

std::string WorldName(const ::testing::TestParamInfo<WorldParam>& info) {
  if (info.param.size == 0) return info.param.backend;
  return absl::StrFormat("%s_world%d", info.param.backend, info.param.size);
}

uint64_t TestData::Bits(uint64_t salt, int rank, int64_t i) const {
  const uint64_t r = SplitMix64At(StreamBase(seed_, salt, rank), static_cast<uint64_t>(i));
  return ElementFromRandom(dtype_, r);
}

double TestData::Value(uint64_t salt, int rank, int64_t i) const {
  return BitsToDouble(dtype_, Bits(salt, rank, i));
}

std::vector<uint8_t> TestData::Make(uint64_t salt, int rank, int64_t count, int64_t first) const {
  const size_t element_bytes = DTypeSize(dtype_);
  std::vector<uint8_t> out(static_cast<size_t>(count) * element_bytes);
  const uint64_t base = StreamBase(seed_, salt, rank);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t r = SplitMix64At(base, static_cast<uint64_t>(first + i));
    const uint64_t bits = ElementFromRandom(dtype_, r);
    std::memcpy(out.data() + i * element_bytes, &bits, element_bytes);  // little endian
  }
  return out;
}

uint64_t TestData::RankOrderSumBits(uint64_t salt, int world, int64_t i) const {
  switch (dtype_) {
    case DType::kFloat32: {
      float acc = BitsToFloat(static_cast<uint32_t>(Bits(salt, 0, i)));
      for (int r = 1; r < world; ++r) acc += BitsToFloat(static_cast<uint32_t>(Bits(salt, r, i)));
      return FloatToBits(acc);
    }
    case DType::kBFloat16: {
      float acc = Bf16ToFp32(static_cast<uint16_t>(Bits(salt, 0, i)));
      for (int r = 1; r < world; ++r) acc += Bf16ToFp32(static_cast<uint16_t>(Bits(salt, r, i)));
      return Fp32ToBf16(acc);
    }
    case DType::kFloat16: {
      float acc = Fp16ToFp32(static_cast<uint16_t>(Bits(salt, 0, i)));
      for (int r = 1; r < world; ++r) {
        acc += Fp16ToFp32(static_cast<uint16_t>(Bits(salt, r, i)));
      }
      return Fp32ToFp16(acc);
    }
    case DType::kFloat64: {
      double acc = BitsToDouble(DType::kFloat64, Bits(salt, 0, i));
      for (int r = 1; r < world; ++r) acc += BitsToDouble(DType::kFloat64, Bits(salt, r, i));
      uint64_t bits;
      std::memcpy(&bits, &acc, sizeof(bits));
      return bits;
    }
    case DType::kInt64: {
      uint64_t acc = 0;
      for (int r = 0; r < world; ++r) acc += Bits(salt, r, i);
      return acc;
    }
    case DType::kUInt8:
      return 0;
  }
  return 0;
}

void TestData::DoubleSum(uint64_t salt, int world, int64_t i, double* sum, double* bound) const {
  double total = 0.0;
  double magnitude = 0.0;
  for (int r = 0; r < world; ++r) {
    const double v = Value(salt, r, i);
    total += v;
    magnitude += std::fabs(v);
  }
  double accumulate_unit = 0.0;  // unit roundoff of the accumulator
  double output_unit = 0.0;      // unit roundoff of the final rounding
  switch (dtype_) {
    case DType::kFloat32:
      accumulate_unit = std::ldexp(1.0, -24);
      break;
    case DType::kBFloat16:
      accumulate_unit = std::ldexp(1.0, -24);
      output_unit = std::ldexp(1.0, -8);
      break;
    case DType::kFloat16:
      accumulate_unit = std::ldexp(1.0, -24);
      output_unit = std::ldexp(1.0, -11);
      break;
    case DType::kFloat64:
      accumulate_unit = std::ldexp(1.0, -53);
      break;
    default:
      break;
  }
  const double accumulate_error = world * accumulate_unit * magnitude;
  *sum = total;
  *bound = accumulate_error + output_unit * (std::fabs(total) + accumulate_error) +
           1e-300;  // exact types: bound is (essentially) zero
}

uint64_t ElementBits(DType dtype, const void* data, int64_t i) {
  const size_t element_bytes = DTypeSize(dtype);
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const uint8_t*>(data) + i * element_bytes, element_bytes);
  return bits;
}

double BitsToDouble(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kFloat32:
      return BitsToFloat(static_cast<uint32_t>(bits));
    case DType::kBFloat16:
      return Bf16ToFp32(static_cast<uint16_t>(bits));
    case DType::kFloat16:
      return Fp16ToFp32(static_cast<uint16_t>(bits));
    case DType::kFloat64: {
      double x;
      std::memcpy(&x, &bits, sizeof(x));
      return x;
    }
    case DType::kInt64:
      return static_cast<double>(static_cast<int64_t>(bits));
    case DType::kUInt8:
      return static_cast<double>(bits & 0xffu);
  }
  return 0.0;
}

std::vector<int64_t> IndicesToCheck(int64_t count) {
  std::vector<int64_t> indices;
  if (count <= (int64_t{1} << 20)) {
    indices.resize(count);
    for (int64_t i = 0; i < count; ++i) indices[i] = i;
    return indices;
  }
  for (int64_t i = 0; i < count; i += 101) indices.push_back(i);
  for (int64_t i = 0; i < 4096; ++i) {
    indices.push_back(i);
    indices.push_back(count - 1 - i);
  }
  for (int64_t boundary = int64_t{1} << 19; boundary < count; boundary += int64_t{1} << 19) {
    for (int64_t i = boundary - 8; i < std::min(count, boundary + 8); ++i) indices.push_back(i);
  }
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  return indices;
}

int64_t CheckSum(const TestData& data, uint64_t salt, int world, const void* result, int64_t count,
                 int64_t first, const std::string& what) {
  int64_t bad = 0;
  for (int64_t i : IndicesToCheck(count)) {
    const uint64_t got = ElementBits(data.dtype(), result, i);
    const uint64_t want = data.RankOrderSumBits(salt, world, first + i);
    double reference, bound;
    data.DoubleSum(salt, world, first + i, &reference, &bound);
    const double value = BitsToDouble(data.dtype(), got);
    const bool close = std::fabs(value - reference) <= bound;
    if (got == want && close) continue;
    if (++bad <= 3) {
      ADD_FAILURE() << what << ": element " << first + i << " is " << value << " (bits 0x"
                    << std::hex << got << "), rank-order sum is "
                    << BitsToDouble(data.dtype(), want) << " (bits 0x" << want << std::dec
                    << "), double reference " << reference << " +- " << bound;
    }
  }
  return bad;
}

int64_t CheckCopy(const TestData& data, uint64_t salt, int rank, const void* result, int64_t count,
                  int64_t first, const std::string& what) {
  int64_t bad = 0;
  for (int64_t i : IndicesToCheck(count)) {
    const uint64_t got = ElementBits(data.dtype(), result, i);
    const uint64_t want = data.Bits(salt, rank, first + i);
    if (got == want) continue;
    if (++bad <= 3) {
      ADD_FAILURE() << what << ": element " << first + i << " has bits 0x" << std::hex << got
                    << ", rank " << std::dec << rank << " sent 0x" << std::hex << want << std::dec;
    }
  }
  return bad;
}

void CommSuite::SetUp() {
  world_ = MakeWorld(GetParam());
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  seed_ = SplitMix64(BaseSeed() ^ std::hash<std::string>()(std::string(info->name())));
}

}  // namespace testing_comm
}  // namespace zeroshard
