// qgZ's quantized reduce-scatter (engine/src/runtime/quantized_reduce_scatter.h)
// against a double-precision sum: every element within the error the two
// quantizations allow (half a block's scale per contribution, per level),
// for hierarchies of nodes x ranks emulated on local ranks, int8 and int4,
// fp32 and bf16; and its pack kernels element by element.
#include "engine/src/runtime/quantized_reduce_scatter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/quant_int8.h"
#include "tests/test_seed.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// n values whose magnitude changes from block to block (so scales differ),
// stored as dtype; `widened` gets them back exactly.
std::vector<char> RandomData(int64_t n, DType dtype, std::mt19937_64& rng,
                             std::vector<double>* widened) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-3.0f, 2.0f);
  std::vector<float> x(n);
  float magnitude = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % kernels::kQuantBlock == 0) magnitude = std::pow(10.0f, log_scale(rng));
    x[i] = normal(rng) * magnitude;
  }
  std::vector<char> out(n * DTypeSize(dtype));
  widened->resize(n);
  if (dtype == DType::kFloat32) {
    std::memcpy(out.data(), x.data(), n * sizeof(float));
    for (int64_t i = 0; i < n; ++i) (*widened)[i] = x[i];
  } else {
    auto* h = reinterpret_cast<uint16_t*>(out.data());
    ConvertFp32ToBf16(x.data(), h, n);
    std::vector<float> back(n);
    ConvertBf16ToFp32(h, back.data(), n);
    for (int64_t i = 0; i < n; ++i) (*widened)[i] = back[i];
  }
  return out;
}

double Widen(const std::vector<char>& data, DType dtype, int64_t i) {
  if (dtype == DType::kFloat32) return reinterpret_cast<const float*>(data.data())[i];
  float f;
  ConvertBf16ToFp32(reinterpret_cast<const uint16_t*>(data.data()) + i, &f, 1);
  return f;
}

TEST(QuantPackTest, EveryElementWithinHalfItsBlocksScale) {
  std::mt19937_64 rng(Seed());
  for (int bits : {8, 4}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << bits << " bits, " << DTypeName(dtype));
      const int64_t n = 1 + static_cast<int64_t>(rng() % 2000);
      std::vector<double> x;
      const std::vector<char> data = RandomData(n, dtype, rng, &x);
      // Fill with garbage first: the pack must set every byte (padding too).
      std::vector<char> pack(kernels::QuantPackedBytes(n, bits), '\x5a');
      ASSERT_EQ(static_cast<int64_t>(pack.size()), QgzPackBytes(n, bits));
      QuantizePack(data.data(), n, dtype, bits, pack.data());
      std::vector<float> back(n);
      const void* packs[] = {pack.data()};
      DequantizeSum(packs, 1, n, bits, DType::kFloat32, back.data());
      double worst = 0;
      for (int64_t b = 0; b < kernels::QuantBlocks(n); ++b) {
        const int64_t begin = b * kernels::kQuantBlock;
        const int64_t end = std::min(n, begin + kernels::kQuantBlock);
        double absmax = 0;
        for (int64_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(x[i]));
        const double half_scale = absmax / kernels::QuantMax(bits) / 2;
        for (int64_t i = begin; i < end; ++i) {
          const double err = std::fabs(back[i] - x[i]);
          ASSERT_LE(err, half_scale * (1 + 1e-5)) << "element " << i << " " << SeedTrace();
          worst = std::max(worst, err / half_scale);
        }
      }
      // Rounding to the nearest level: some element is off by most of half a step.
      EXPECT_GT(worst, 0.5) << SeedTrace();
      const int64_t values = kernels::QuantValueBytes(n, bits);
      for (int64_t i = values; i < kernels::QuantScalesOffset(n, bits); ++i) {
        EXPECT_EQ(pack[i], 0) << "value padding byte " << i;
      }
      for (int64_t i = kernels::QuantScalesOffset(n, bits) + kernels::QuantBlocks(n) * 4;
           i < static_cast<int64_t>(pack.size()); ++i) {
        EXPECT_EQ(pack[i], 0) << "scale padding byte " << i;
      }
      if (bits == 4 && n % 2 == 1) {
        EXPECT_EQ(pack[values - 1] & 0xF0, 0) << "last high nibble";
      }
    }
  }
}

struct Shape {
  int nodes;
  int ranks_per_node;
};

// One reduce-scatter on nodes x ranks_per_node local ranks; returns the
// largest error relative to the bound, per the worst element, and checks
// every element against it.
double CheckReduceScatter(Shape shape, int bits, DType dtype, std::mt19937_64& rng,
                          std::vector<std::vector<char>>* outputs = nullptr) {
  const int world = shape.nodes * shape.ranks_per_node;
  const int64_t count = 1 + static_cast<int64_t>(rng() % 1500);
  std::vector<std::vector<char>> send(world);
  std::vector<std::vector<double>> x(world);
  for (int r = 0; r < world; ++r) send[r] = RandomData(world * count, dtype, rng, &x[r]);
  std::vector<std::vector<char>> recv(world, std::vector<char>(count * DTypeSize(dtype)));
  const absl::Status run = RunLocalRanks(world, [&](int rank, Communicator& comm) {
    std::vector<char> scratch(QgzScratchBytes(world, count, bits));
    QuantizedReduceScatter op;
    ZS_RETURN_IF_ERROR(op.Start(comm, shape.ranks_per_node, bits, send[rank].data(),
                                recv[rank].data(), count, dtype, 7, scratch.data()));
    while (!op.done()) ZS_RETURN_IF_ERROR(op.Advance());
    return absl::OkStatus();
  });
  EXPECT_TRUE(run.ok()) << run;
  const double qmax = kernels::QuantMax(bits);
  const bool two_levels = shape.nodes > 1 && shape.ranks_per_node > 1;
  double worst = 0;
  for (int d = 0; d < world; ++d) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t b = i / kernels::kQuantBlock;
      const int64_t begin = d * count + b * kernels::kQuantBlock;
      const int64_t end = d * count + std::min(count, (b + 1) * kernels::kQuantBlock);
      double exact = 0, level1 = 0, magnitudes = 0;
      for (int r = 0; r < world; ++r) {
        exact += x[r][d * count + i];
        double absmax = 0;
        for (int64_t k = begin; k < end; ++k) absmax = std::max(absmax, std::fabs(x[r][k]));
        level1 += absmax / qmax / 2;
        magnitudes += absmax;
      }
      // Level 2 requantizes each node's sum, whose block magnitude is at
      // most its ranks' magnitudes: half a scale of it, summed over nodes.
      const double level2 = two_levels ? magnitudes / qmax / 2 : 0;
      double bound = (level1 + level2) * (1 + 1e-4) + magnitudes * 1e-6;
      if (dtype == DType::kBFloat16) bound += (std::fabs(exact) + level1 + level2) / 256;
      const double got = Widen(recv[d], dtype, i);
      EXPECT_LE(std::fabs(got - exact), bound)
          << "rank " << d << " element " << i << ": got " << got << ", exact " << exact << ", "
          << shape.nodes << " x " << shape.ranks_per_node << ", " << SeedTrace();
      worst = std::max(worst, std::fabs(got - exact) / bound);
    }
  }
  if (outputs != nullptr) *outputs = recv;
  return worst;
}

TEST(QuantizedReduceScatterTest, WithinTheQuantizationBoundOnEveryHierarchy) {
  std::mt19937_64 rng(Seed());
  const Shape shapes[] = {{2, 2}, {4, 1}, {1, 4}, {3, 2}, {2, 3}, {1, 1}};
  for (const Shape& shape : shapes) {
    for (int bits : {8, 4}) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        SCOPED_TRACE(::testing::Message() << shape.nodes << " nodes x " << shape.ranks_per_node
                                          << ", " << bits << " bits, " << DTypeName(dtype));
        const double worst = CheckReduceScatter(shape, bits, dtype, rng);
        std::printf("%d x %d, int%d, %s: worst error %.3f of the bound\n", shape.nodes,
                    shape.ranks_per_node, bits, DTypeName(dtype), worst);
        // Quantization happened: some element is off by a good part of it.
        EXPECT_GT(worst, 0.05) << SeedTrace();
      }
    }
  }
}

TEST(QuantizedReduceScatterTest, SameInputsSameBits) {
  const uint64_t seed = Seed();
  for (const Shape& shape : {Shape{2, 2}, Shape{4, 1}}) {
    std::vector<std::vector<char>> a, b;
    std::mt19937_64 rng_a(seed), rng_b(seed);
    CheckReduceScatter(shape, 4, DType::kFloat32, rng_a, &a);
    CheckReduceScatter(shape, 4, DType::kFloat32, rng_b, &b);
    EXPECT_EQ(a, b) << shape.nodes << " x " << shape.ranks_per_node << ", " << SeedTrace();
  }
}

TEST(QuantizedReduceScatterTest, RanksPerNodeFromTheLayout) {
  NodeLayout even;
  even.node_of_rank = {0, 0, 1, 1};
  even.node_names = {"a", "b"};
  EXPECT_EQ(QgzRanksPerNode(even), 2);
  NodeLayout interleaved = even;
  interleaved.node_of_rank = {0, 1, 0, 1};
  EXPECT_EQ(QgzRanksPerNode(interleaved), 4);  // not consecutive: one flat all-to-all
  NodeLayout uneven;
  uneven.node_of_rank = {0, 0, 0, 1};
  uneven.node_names = {"a", "b"};
  EXPECT_EQ(QgzRanksPerNode(uneven), 4);
  NodeLayout one;
  one.node_of_rank = {0, 0, 0};
  one.node_names = {"a"};
  EXPECT_EQ(QgzRanksPerNode(one), 3);
}

TEST(QuantizedReduceScatterTest, RefusesBadArguments) {
  const absl::Status s = RunLocalRanks(2, [](int rank, Communicator& comm) {
    std::vector<char> scratch(QgzScratchBytes(2, 8, 4));
    std::vector<float> data(16), out(8);
    QuantizedReduceScatter op;
    const absl::Status bad =
        op.Start(comm, 2, 5, data.data(), out.data(), 8, DType::kFloat32, 0, scratch.data());
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    const absl::Status uneven =
        op.Start(comm, 3, 4, data.data(), out.data(), 8, DType::kFloat32, 0, scratch.data());
    EXPECT_EQ(uneven.code(), absl::StatusCode::kInvalidArgument) << uneven;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace zeroshard::internal
