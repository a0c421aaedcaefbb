// The GPT's vocab-parallel embedding, head and cross-entropy
// (examples/gpt/internal/vocab_parallel.h) on tp = 1..4 local ranks against
// a double-precision reference of the whole vocabulary, and against the
// one-rank functions where the header promises their bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "examples/gpt/internal/gpt_math.h"
#include "examples/gpt/internal/vocab_parallel.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard::gpt::internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

struct Reference {
  std::vector<double> logits, dlogits, dwte_head, dx;
  double loss = 0;
};

// The head and the loss over the whole vocabulary, in double.
Reference HeadReference(const std::vector<float>& wte, const std::vector<float>& x,
                        const std::vector<int32_t>& targets, const GptDims& d, double seed) {
  const int64_t n = d.rows(), v = d.vocab, c = d.width;
  Reference ref;
  ref.logits.assign(n * v, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < v; ++j) {
      double s = 0;
      for (int64_t i = 0; i < c; ++i) s += double{x[r * c + i]} * wte[j * c + i];
      ref.logits[r * v + j] = s;
    }
  }
  ref.dlogits.assign(n * v, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const double* row = &ref.logits[r * v];
    const double max = *std::max_element(row, row + v);
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - max);
    ref.loss += std::log(sum) - (row[targets[r]] - max);
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(row[j] - max) / sum;
      ref.dlogits[r * v + j] = (j == targets[r] ? p - 1 : p) * seed / n;
    }
  }
  ref.loss /= n;
  ref.dwte_head.assign(v * c, 0.0);
  ref.dx.assign(n * c, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < v; ++j) {
      const double g = ref.dlogits[r * v + j];
      for (int64_t i = 0; i < c; ++i) {
        ref.dwte_head[j * c + i] += g * x[r * c + i];
        ref.dx[r * c + i] += g * wte[j * c + i];
      }
    }
  }
  return ref;
}

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(GptVocabParallel, EmbeddingHeadAndLossMatchTheWholeVocabulary) {
  std::mt19937_64 rng(Seed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int tp : {1, 2, 3, 4}) {
    for (bool pad : {false, true}) {
      if (pad && tp == 1) continue;  // one rank holds the whole vocabulary
      SCOPED_TRACE(::testing::Message() << "tp " << tp << (pad ? ", padded vocabulary" : ""));
      GptDims d;
      d.batch = 2;
      d.seq = 3 + static_cast<int64_t>(rng() % 5);
      d.width = 8 + static_cast<int64_t>(rng() % 17);
      d.heads = 1;
      d.positions = d.seq + 2;
      // Divisible by tp, or not: padded, the padding rows set to values that
      // would change every result if they were taken as tokens.
      d.vocab = 12 * (1 + static_cast<int64_t>(rng() % 3)) + (pad ? 1 + rng() % (tp - 1) : 0);
      const int64_t n = d.rows(), c = d.width, v = d.vocab;
      const int64_t padded = PaddedVocab(v, tp);
      std::vector<float> wte(padded * c), wpe(d.positions * c), x(n * c), dx0(n * c);
      for (float& w : wte) w = normal(rng);
      for (int64_t k = v * c; k < padded * c; ++k) wte[k] = 5.0f + normal(rng);
      for (float& w : wpe) w = 0.1f * normal(rng);
      for (float& w : x) w = normal(rng);
      for (float& w : dx0) w = normal(rng);
      std::vector<int32_t> tokens(n), targets(n);
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % v);
      for (int32_t& t : targets) t = static_cast<int32_t>(rng() % v);
      const float seed = 0.5f + static_cast<float>(rng() % 4);

      // One rank's functions (the bits the embedding must keep) and the double reference.
      std::vector<float> x0_one(n * c), dwte_embed_one(v * c), dwpe_one(d.positions * c);
      EmbedForward(wte.data(), wpe.data(), tokens.data(), d, x0_one.data());
      EmbedBackward(tokens.data(), dx0.data(), d, dwte_embed_one.data(), dwpe_one.data());
      std::vector<float> logits_one(n * v);
      HeadForward(wte.data(), x.data(), d, logits_one.data());
      const double loss_one = CrossEntropy(logits_one.data(), targets.data(), d, seed);
      const Reference ref = HeadReference(wte, x, targets, d, seed);

      std::vector<double> losses(tp);
      std::vector<std::vector<float>> dxs(tp), x0s(tp);
      const absl::Status run = RunLocalRanks(tp, [&](int rank, Communicator& comm) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(const VocabShard shard, VocabShardOf(v, tp, rank));
        EXPECT_EQ(shard.size * tp, padded);
        EXPECT_EQ(shard.valid, std::clamp<int64_t>(v - shard.begin, 0, shard.size));
        const float* wte_shard = wte.data() + shard.begin * c;
        x0s[rank].resize(n * c);
        ZS_RETURN_IF_ERROR(VocabParallelEmbedForward(wte_shard, wpe.data(), tokens.data(), d, shard,
                                                     comm, x0s[rank].data()));
        std::vector<float> dwte_embed(shard.size * c), dwpe(d.positions * c);
        VocabParallelEmbedBackward(tokens.data(), dx0.data(), d, shard, dwte_embed.data(),
                                   dwpe.data());
        // The embedding's gradient rows: this rank's rows of the one-rank ones, bit for bit.
        EXPECT_EQ(std::memcmp(dwte_embed.data(), dwte_embed_one.data() + shard.begin * c,
                              shard.valid * c * sizeof(float)),
                  0)
            << "rank " << rank;
        for (int64_t k = shard.valid * c; k < shard.size * c; ++k) {
          EXPECT_EQ(dwte_embed[k], 0.0f) << "rank " << rank << " padding row element " << k;
        }
        EXPECT_EQ(dwpe, dwpe_one) << "rank " << rank;

        std::vector<float> logits(n * shard.size);
        VocabParallelHeadForward(wte_shard, x.data(), d, shard, logits.data());
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t j = 0; j < shard.valid; ++j) {
            const double want = ref.logits[r * v + shard.begin + j];
            EXPECT_NEAR(logits[r * shard.size + j], want, 1e-5 * (std::fabs(want) + 1));
          }
        }
        ZS_ASSIGN_OR_RETURN(losses[rank], VocabParallelCrossEntropy(logits.data(), targets.data(),
                                                                    d, shard, seed, comm));
        const double dl_scale = MaxAbs(ref.dlogits);
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t j = 0; j < shard.size; ++j) {
            const double want = j < shard.valid ? ref.dlogits[r * v + shard.begin + j] : 0.0;
            EXPECT_NEAR(logits[r * shard.size + j], want, 1e-5 * dl_scale)
                << "rank " << rank << " dlogits[" << r << ", " << shard.begin + j << "]";
          }
        }
        std::vector<float> dwte_head(shard.size * c);
        dxs[rank].resize(n * c);
        ZS_RETURN_IF_ERROR(VocabParallelHeadBackward(wte_shard, x.data(), logits.data(), d, shard,
                                                     comm, dwte_head.data(), dxs[rank].data()));
        const double dw_scale = MaxAbs(ref.dwte_head);
        for (int64_t k = 0; k < shard.size * c; ++k) {
          const double want = k < shard.valid * c ? ref.dwte_head[shard.begin * c + k] : 0.0;
          EXPECT_NEAR(dwte_head[k], want, 1e-5 * dw_scale)
              << "rank " << rank << " dwte element " << k;
        }
        return absl::OkStatus();
      });
      ASSERT_TRUE(run.ok()) << run;

      const double dx_scale = MaxAbs(ref.dx);
      for (int rank = 0; rank < tp; ++rank) {
        // The same loss, dx and x0 on every rank of the group.
        EXPECT_EQ(losses[rank], losses[0]) << "rank " << rank;
        EXPECT_EQ(dxs[rank], dxs[0]) << "rank " << rank;
        // x0: one rank's bits (the holder's value plus zeros).
        EXPECT_EQ(x0s[rank], x0_one) << "rank " << rank << ", " << SeedTrace();
      }
      EXPECT_NEAR(losses[0], ref.loss, 1e-6 * ref.loss) << SeedTrace();
      // The double sums over ranks: within 1e-12 of one rank's loss from
      // the same float logits (tp 1: the same bits).
      if (tp == 1) {
        EXPECT_EQ(losses[0], loss_one);
      } else {
        EXPECT_NEAR(losses[0], loss_one, 1e-6 * loss_one);
      }
      for (int64_t k = 0; k < n * c; ++k) {
        EXPECT_NEAR(dxs[0][k], ref.dx[k], 1e-5 * dx_scale)
            << "dx element " << k << ", " << SeedTrace();
      }
      std::printf("tp %d: vocab %lld, width %lld, rows %lld: loss %.9f (reference %.9f)\n", tp,
                  static_cast<long long>(v), static_cast<long long>(c), static_cast<long long>(n),
                  losses[0], ref.loss);
    }
  }
}

TEST(GptVocabParallel, PadsAVocabularyTheGroupDoesNotDivide) {
  // GPT-2's vocabulary over 2 ranks: 50258 rows, the last one padding.
  ASSERT_EQ(PaddedVocab(50257, 2), 50258);
  const absl::StatusOr<VocabShard> last = VocabShardOf(50257, 2, 1);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->begin, 25129);
  EXPECT_EQ(last->size, 25129);
  EXPECT_EQ(last->valid, 25128);
  EXPECT_FALSE(last->Holds(50257));
  EXPECT_TRUE(last->Holds(50256));
  // 5 over 4: 2 rows each; rank 3 holds padding only.
  EXPECT_EQ(VocabShardOf(5, 4, 2)->valid, 1);
  EXPECT_EQ(VocabShardOf(5, 4, 3)->valid, 0);
  EXPECT_FALSE(VocabShardOf(12, 4, 4).ok());
  EXPECT_FALSE(VocabShardOf(0, 1, 0).ok());
}

}  // namespace
}  // namespace zeroshard::gpt::internal
