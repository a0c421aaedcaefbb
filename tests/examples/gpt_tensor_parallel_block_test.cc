// A GPT block split over tp = 1, 2, 4 local ranks
// (examples/gpt/internal/tensor_parallel_block.h) against the one-rank
// block (BlockForward / BlockBackward, which gpt_math_test holds to a double
// reference): the same bits at tp 1; at tp > 1 the output, dx and every
// gradient (each rank's share joined into the whole tensor) within float
// rounding of another summation order, the same bits on every rank of the
// group; and the slicing of the params round-trips.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "examples/gpt/internal/gpt_math.h"
#include "examples/gpt/internal/tensor_parallel_block.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard::gpt::internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

int64_t FullNumel(BlockParam param, const GptDims& d) {
  return TensorParallelParamNumel(param, d, 1);
}

// max |got - want| / max |want|.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double{got[i]} - want[i]));
    scale = std::max(scale, std::fabs(double{want[i]}));
  }
  return err / std::max(scale, 1e-30);
}

TEST(GptTensorParallelBlock, MatchesTheOneRankBlock) {
  std::mt19937_64 rng(Seed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  GptDims d;
  d.batch = 2;
  d.seq = 3 + static_cast<int64_t>(rng() % 5);
  d.heads = 4;
  d.width = 4 * (2 + static_cast<int64_t>(rng() % 3));  // head width 2-4
  d.vocab = 16;
  d.positions = d.seq;
  const int64_t n = d.rows(), c = d.width;

  std::vector<std::vector<float>> full(kNumBlockParams);
  for (int k = 0; k < kNumBlockParams; ++k) {
    const BlockParam param = static_cast<BlockParam>(k);
    full[k].resize(FullNumel(param, d));
    const bool ln_weight = param == kLn1Weight || param == kLn2Weight;
    for (float& w : full[k]) w = ln_weight ? 1.0f + 0.1f * normal(rng) : 0.2f * normal(rng);
  }
  std::vector<float> x(n * c), dy(n * c);
  for (float& v : x) v = normal(rng);
  for (float& v : dy) v = normal(rng);

  // The one-rank block.
  std::vector<const float*> p_one(kNumBlockParams);
  for (int k = 0; k < kNumBlockParams; ++k) p_one[k] = full[k].data();
  std::vector<float> acts_one(BlockActsFloats(d)), y_one(n * c), dx_one(n * c);
  std::vector<float> scratch_one(BlockScratchFloats(d));
  const BlockActs a_one = BlockActsView(d, acts_one.data());
  BlockForward(p_one.data(), d, x.data(), a_one, y_one.data(), scratch_one.data());
  std::vector<std::vector<float>> g_one(kNumBlockParams);
  std::vector<float*> g_one_ptr(kNumBlockParams);
  for (int k = 0; k < kNumBlockParams; ++k) {
    g_one[k].resize(full[k].size());
    g_one_ptr[k] = g_one[k].data();
  }
  BlockBackward(p_one.data(), d, x.data(), a_one, dy.data(), dx_one.data(), g_one_ptr.data(),
                scratch_one.data());

  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << "tp " << tp << ", " << SeedTrace());
    std::vector<std::vector<float>> ys(tp), dxs(tp);
    std::vector<std::vector<std::vector<float>>> grads(tp);
    const absl::Status run = RunLocalRanks(tp, [&](int rank, Communicator& comm) -> absl::Status {
      std::vector<std::vector<float>> share(kNumBlockParams);
      std::vector<const float*> p(kNumBlockParams);
      std::vector<float*> g(kNumBlockParams);
      grads[rank].resize(kNumBlockParams);
      for (int k = 0; k < kNumBlockParams; ++k) {
        const BlockParam param = static_cast<BlockParam>(k);
        share[k] = SliceBlockParam(param, d, tp, rank, full[k].data());
        EXPECT_EQ(static_cast<int64_t>(share[k].size()), TensorParallelParamNumel(param, d, tp));
        p[k] = share[k].data();
        grads[rank][k].assign(share[k].size(), -7.0f);  // overwritten, never added to
        g[k] = grads[rank][k].data();
      }
      std::vector<float> acts(BlockActsFloats(d, tp));
      const BlockActs a = BlockActsView(d, acts.data(), tp);
      ys[rank].resize(n * c);
      ZS_RETURN_IF_ERROR(
          TensorParallelBlockForward(p.data(), d, x.data(), a, ys[rank].data(), comm));
      std::vector<float> scratch(TensorParallelScratchFloats(d, tp));
      dxs[rank].resize(n * c);
      return TensorParallelBlockBackward(p.data(), d, x.data(), a, dy.data(), dxs[rank].data(),
                                         g.data(), scratch.data(), comm);
    });
    ASSERT_TRUE(run.ok()) << run;
    for (int rank = 1; rank < tp; ++rank) {
      EXPECT_EQ(ys[rank], ys[0]) << "rank " << rank;
      EXPECT_EQ(dxs[rank], dxs[0]) << "rank " << rank;
    }
    double worst = std::max(RelativeError(ys[0], y_one), RelativeError(dxs[0], dx_one));
    for (int k = 0; k < kNumBlockParams; ++k) {
      const BlockParam param = static_cast<BlockParam>(k);
      std::vector<std::vector<float>> shares(tp);
      for (int rank = 0; rank < tp; ++rank) shares[rank] = grads[rank][k];
      const std::vector<float> joined = JoinBlockParam(param, d, tp, shares);
      if (tp == 1) {
        EXPECT_EQ(joined, g_one[k]) << "param " << k;
      } else {
        const double err = RelativeError(joined, g_one[k]);
        EXPECT_LT(err, 2e-5) << "param " << k;
        worst = std::max(worst, err);
      }
      if (TensorParallelParamNumel(param, d, tp) == FullNumel(param, d)) {
        // A replicated param: the same gradient on every rank.
        for (int rank = 1; rank < tp; ++rank) EXPECT_EQ(grads[rank][k], grads[0][k]) << k;
      }
    }
    if (tp == 1) {
      EXPECT_EQ(ys[0], y_one);
      EXPECT_EQ(dxs[0], dx_one);
    } else {
      // Another summation order of float products: a few ulps of the
      // largest value (measured up to about 1e-6).
      EXPECT_LT(RelativeError(ys[0], y_one), 2e-5);
      EXPECT_LT(RelativeError(dxs[0], dx_one), 2e-5);
    }
    std::printf(
        "tp %d (%lld heads, width %lld, %lld rows): worst relative difference from one "
        "rank %.3g\n",
        tp, static_cast<long long>(d.heads), static_cast<long long>(c), static_cast<long long>(n),
        worst);
  }
}

TEST(GptTensorParallelBlock, SlicesJoinBackAndHeadsMustDivide) {
  GptDims d;
  d.batch = 1;
  d.seq = 2;
  d.heads = 4;
  d.width = 8;
  for (int tp : {1, 2, 4}) {
    for (int k = 0; k < kNumBlockParams; ++k) {
      const BlockParam param = static_cast<BlockParam>(k);
      std::vector<float> full(FullNumel(param, d));
      for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
      std::vector<std::vector<float>> shares;
      for (int rank = 0; rank < tp; ++rank) {
        shares.push_back(SliceBlockParam(param, d, tp, rank, full.data()));
      }
      EXPECT_EQ(JoinBlockParam(param, d, tp, shares), full) << "tp " << tp << " param " << k;
    }
  }
  // Rank 1 of 2 holds q, k and v of heads 2-3: columns 4-7, 12-15, 20-23.
  std::vector<float> qkv(3 * d.width);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i);
  EXPECT_EQ(SliceBlockParam(kAttnBias, d, 2, 1, qkv.data()),
            (std::vector<float>{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23}));
  EXPECT_FALSE(CheckTensorParallelDims(d, 3).ok());
  EXPECT_TRUE(CheckTensorParallelDims(d, 4).ok());
}

}  // namespace
}  // namespace zeroshard::gpt::internal
