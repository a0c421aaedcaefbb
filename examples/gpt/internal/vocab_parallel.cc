#include "examples/gpt/internal/vocab_parallel.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace internal {

int64_t PaddedVocab(int64_t vocab, int tp) { return (vocab + tp - 1) / tp * tp; }

absl::StatusOr<VocabShard> VocabShardOf(int64_t vocab, int tp, int rank) {
  if (tp < 1 || rank < 0 || rank >= tp || vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "vocab-parallel: vocabulary %d over %d tensor-parallel ranks, rank %d: need a vocabulary "
        "of at least 1, tp >= 1 and 0 <= rank < tp",
        vocab, tp, rank));
  }
  const int64_t size = PaddedVocab(vocab, tp) / tp;
  const int64_t begin = rank * size;
  return VocabShard{begin, size, std::clamp<int64_t>(vocab - begin, 0, size)};
}

absl::Status VocabParallelEmbedForward(const float* wte_shard, const float* wpe,
                                       const int32_t* tokens, const GptDims& d, VocabShard shard,
                                       Communicator& tp_group, float* x0) {
  const int64_t c = d.width;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < d.seq; ++t) {
      const int64_t row = b * d.seq + t;
      float* out = x0 + row * c;
      const int64_t token = tokens[row];
      if (!shard.Holds(token)) {
        std::memset(out, 0, sizeof(float) * c);
        continue;
      }
      // The holder adds wpe too: the sum over ranks is then its value plus
      // zeros, as one rank computes it.
      const float* te = wte_shard + (token - shard.begin) * c;
      const float* pe = wpe + t * c;
      for (int64_t i = 0; i < c; ++i) out[i] = te[i] + pe[i];
    }
  }
  if (tp_group.size() == 1) return absl::OkStatus();
  return tp_group.AllReduceSync(x0, x0, d.rows() * c, DType::kFloat32);
}

void VocabParallelEmbedBackward(const int32_t* tokens, const float* dx0, const GptDims& d,
                                VocabShard shard, float* dwte_shard, float* dwpe) {
  const int64_t c = d.width;
  std::memset(dwte_shard, 0, sizeof(float) * shard.size * c);
  std::memset(dwpe, 0, sizeof(float) * d.positions * c);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < d.seq; ++t) {
      const int64_t row = b * d.seq + t;
      const float* g = dx0 + row * c;
      const int64_t token = tokens[row];
      if (shard.Holds(token)) {
        float* dst = dwte_shard + (token - shard.begin) * c;
        for (int64_t i = 0; i < c; ++i) dst[i] += g[i];
      }
      float* dst = dwpe + t * c;
      for (int64_t i = 0; i < c; ++i) dst[i] += g[i];
    }
  }
}

void VocabParallelHeadForward(const float* wte_shard, const float* x, const GptDims& d,
                              VocabShard shard, float* logits_shard) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.rows(), shard.size, d.width, 1.0f, x,
              d.width, wte_shard, d.width, 0.0f, logits_shard, shard.size);
}

absl::StatusOr<double> VocabParallelCrossEntropy(float* logits_shard, const int32_t* targets,
                                                 const GptDims& d, VocabShard shard, float seed,
                                                 Communicator& tp_group) {
  const int64_t n = d.rows(), v_len = shard.size;
  const int tp = tp_group.size();
  // Each row's largest logit: this rank's, then every rank's (all-gathered).
  // A shard of padding only (a tiny vocabulary over many ranks) offers
  // -infinity, which no token's logit loses to.
  const int64_t valid = shard.valid;
  std::vector<float> local_max(n, -INFINITY);
  for (int64_t r = 0; r < n && valid > 0; ++r) {
    const float* row = logits_shard + r * v_len;
    float max = row[0];
    for (int64_t v = 1; v < valid; ++v) max = row[v] > max ? row[v] : max;
    local_max[r] = max;
  }
  std::vector<float> maxima(static_cast<size_t>(tp) * n);
  ZS_RETURN_IF_ERROR(tp_group.AllGatherSync(local_max.data(), maxima.data(), n, DType::kFloat32));
  std::vector<float> max(n);
  for (int64_t r = 0; r < n; ++r) {
    float m = maxima[r];
    for (int k = 1; k < tp; ++k) m = std::max(m, maxima[k * n + r]);
    max[r] = m;
  }
  // Per row: the sum of exp(logit - max) over this rank's columns, and the
  // target's shifted logit where this rank holds it (0 elsewhere); summed
  // over the group in double.
  std::vector<double> sums(2 * n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = logits_shard + r * v_len;
    double sum = 0.0;
    for (int64_t v = 0; v < valid; ++v) sum += std::exp(static_cast<double>(row[v]) - max[r]);
    sums[r] = sum;
    const int64_t target = targets[r];
    if (shard.Holds(target)) {
      sums[n + r] = static_cast<double>(row[target - shard.begin]) - max[r];
    }
  }
  if (tp > 1) {
    ZS_RETURN_IF_ERROR(tp_group.AllReduceSync(sums.data(), sums.data(), 2 * n, DType::kFloat64));
  }
  const double inv_rows = 1.0 / static_cast<double>(n);
  const double grad_scale = static_cast<double>(seed) * inv_rows;
  double total = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const double log_sum = std::log(sums[r]);
    total += log_sum - sums[n + r];
    float* row = logits_shard + r * v_len;
    const int64_t target = targets[r];
    for (int64_t v = 0; v < valid; ++v) {
      const double prob = std::exp(static_cast<double>(row[v]) - max[r] - log_sum);
      row[v] = static_cast<float>((v + shard.begin == target ? prob - 1.0 : prob) * grad_scale);
    }
    for (int64_t v = valid; v < v_len; ++v) row[v] = 0.0f;
  }
  return total * inv_rows;
}

absl::Status VocabParallelHeadBackward(const float* wte_shard, const float* x,
                                       const float* dlogits_shard, const GptDims& d,
                                       VocabShard shard, Communicator& tp_group, float* dwte_shard,
                                       float* dx) {
  const int64_t n = d.rows(), c = d.width, v = shard.size;
  // dwte_shard [V/tp, C] = dlogits_shard^T [V/tp, N] x [N, C].
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, v, c, n, 1.0f, dlogits_shard, v, x, c, 0.0f,
              dwte_shard, c);
  // dx [N, C] = the sum over ranks of dlogits_shard [N, V/tp] wte_shard [V/tp, C].
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, c, v, 1.0f, dlogits_shard, v, wte_shard,
              c, 0.0f, dx, c);
  if (tp_group.size() == 1) return absl::OkStatus();
  return tp_group.AllReduceSync(dx, dx, n * c, DType::kFloat32);
}

}  // namespace internal
}  // namespace gpt
}  // namespace zeroshard
