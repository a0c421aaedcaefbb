// gpt_block_bench: where one GPT block's forward + backward time goes
// (examples/gpt/internal/gpt_math.cc), on one BLAS thread, at a shape given
// on the command line:
//
//   build/perf/examples/gpt_block_bench B T C H [rounds]
//
// BlockForward and BlockBackward whole, then a mirror of their steps in the
// same order on the same buffers, each step timed and charged to a part:
// the attention kernel, the four Conv1D layers' sgemm, GELU, LayerNorm, and
// the bias fills, residual adds and bias sums. The attention kernel's own
// per-head sgemm is also timed alone. Medians over the rounds, in ms,
// wall-clock on one thread.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "examples/gpt/internal/gpt_math.h"

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);

namespace {

using zeroshard::gpt::internal::GptDims;
namespace gi = zeroshard::gpt::internal;

double MedianMs(int rounds, const std::function<void()>& fn) {
  std::vector<double> ms;
  fn();  // warm-up
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void Sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s B T C H [rounds]\n", argv[0]);
    return 2;
  }
  GptDims d;
  d.batch = std::atoll(argv[1]);
  d.seq = std::atoll(argv[2]);
  d.width = std::atoll(argv[3]);
  d.heads = std::atoll(argv[4]);
  d.vocab = 256;
  d.positions = d.seq;
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 9;
  if (d.batch <= 0 || d.seq <= 0 || d.heads <= 0 || d.width <= 0 || d.width % d.heads != 0) {
    std::fprintf(stderr, "need positive B T C H with H dividing C\n");
    return 2;
  }
  openblas_set_num_threads(1);
  const int64_t N = d.rows(), C = d.width, T = d.seq, D = d.head_dim();

  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int64_t n, float scale, float mean) {
    std::vector<float> v(n);
    for (float& x : v) x = mean + scale * normal(rng);
    return v;
  };
  const int64_t sizes[gi::kNumBlockParams] = {C, C, C * 3 * C, 3 * C, C * C,     C,
                                              C, C, C * 4 * C, 4 * C, 4 * C * C, C};
  std::vector<std::vector<float>> params, grads;
  for (int i = 0; i < gi::kNumBlockParams; ++i) {
    const bool ln_weight = i == gi::kLn1Weight || i == gi::kLn2Weight;
    params.push_back(random(sizes[i], ln_weight ? 0.1f : 0.02f, ln_weight ? 1.0f : 0.0f));
    grads.emplace_back(sizes[i]);
  }
  std::vector<const float*> p;
  std::vector<float*> g;
  for (int i = 0; i < gi::kNumBlockParams; ++i) {
    p.push_back(params[i].data());
    g.push_back(grads[i].data());
  }
  const std::vector<float> x = random(N * C, 1.0f, 0.0f), dy = random(N * C, 1.0f, 0.0f);
  std::vector<float> y(N * C), dx(N * C), acts_buf(gi::BlockActsFloats(d)),
      scratch(gi::BlockScratchFloats(d));
  const gi::BlockActs acts = gi::BlockActsView(d, acts_buf.data());
  std::vector<float> wide(N * 4 * C), wide2(N * 4 * C), narrow(N * C), narrow2(N * C), tt(T * T),
      mean(N), rstd(N);

  const double fwd = MedianMs(
      rounds, [&] { gi::BlockForward(p.data(), d, x.data(), acts, y.data(), scratch.data()); });
  const double bwd = MedianMs(rounds, [&] {
    gi::BlockBackward(p.data(), d, x.data(), acts, dy.data(), dx.data(), g.data(), scratch.data());
  });
  // The mirror: BlockForward's and BlockBackward's steps in their order on
  // the same buffers, each timed and charged to its part, so that the parts
  // see the caches as the block does and sum to about the whole.
  enum Part { kAttention, kConv, kGelu, kLayerNorm, kRest, kNumParts };
  double part_ms[2][kNumParts];
  std::vector<std::vector<double>> samples(2 * kNumParts);
  auto timed = [&](int pass, Part part, const std::function<void()>& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    part_ms[pass][part] +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  auto bias_fill = [&](const float* bias, int64_t cols, float* out) {
    for (int64_t r = 0; r < N; ++r) std::copy(bias, bias + cols, out + r * cols);
  };
  auto add = [&](const float* src, int64_t n, float* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  };
  auto sum_rows = [&](const float* m, int64_t cols, float* out) {
    std::fill(out, out + cols, 0.0f);
    for (int64_t r = 0; r < N; ++r) add(m + r * cols, cols, out);
  };
  auto conv_fwd = [&](const float* in, int w, int64_t cin, int64_t cout, float* out) {
    timed(0, kRest, [&] { bias_fill(p[w + 1], cout, out); });
    timed(0, kConv, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, cout, cin, 1.0f, in, cin, p[w],
                  cout, 1.0f, out, cout);
    });
  };
  auto conv_bwd = [&](const float* in, int w, int64_t cin, int64_t cout, const float* dout,
                      float* din) {
    timed(1, kConv, [&] {
      Sgemm(true, false, cin, cout, N, in, cin, dout, cout, g[w], cout);
      Sgemm(false, true, N, cin, cout, dout, cout, p[w], cout, din, cin);
    });
    timed(1, kRest, [&] { sum_rows(dout, cout, g[w + 1]); });
  };
  float* dres1 = narrow2.data();
  for (int round = 0; round <= rounds; ++round) {
    std::fill(&part_ms[0][0], &part_ms[0][0] + 2 * kNumParts, 0.0);
    timed(0, kLayerNorm, [&] {
      gi::LayerNormForward(x.data(), p[0], p[1], N, C, d.eps, acts.ln1, acts.ln1_mean,
                           acts.ln1_rstd);
    });
    conv_fwd(acts.ln1, gi::kAttnWeight, C, 3 * C, acts.qkv);
    timed(0, kAttention, [&] { gi::AttentionForward(acts.qkv, d, acts.att, acts.atty); });
    conv_fwd(acts.atty, gi::kProjWeight, C, C, acts.res1);
    timed(0, kRest, [&] { add(x.data(), N * C, acts.res1); });
    timed(0, kLayerNorm, [&] {
      gi::LayerNormForward(acts.res1, p[6], p[7], N, C, d.eps, acts.ln2, acts.ln2_mean,
                           acts.ln2_rstd);
    });
    conv_fwd(acts.ln2, gi::kFcWeight, C, 4 * C, acts.fc);
    timed(0, kGelu, [&] { gi::GeluForward(acts.fc, N * 4 * C, acts.fc_gelu); });
    conv_fwd(acts.fc_gelu, gi::kFcProjWeight, 4 * C, C, y.data());
    timed(0, kRest, [&] { add(acts.res1, N * C, y.data()); });

    conv_bwd(acts.fc_gelu, gi::kFcProjWeight, 4 * C, C, dy.data(), wide.data());
    timed(1, kGelu, [&] { gi::GeluBackward(acts.fc, wide.data(), N * 4 * C, wide.data()); });
    conv_bwd(acts.ln2, gi::kFcWeight, C, 4 * C, wide.data(), narrow.data());
    timed(1, kLayerNorm, [&] {
      gi::LayerNormBackward(acts.res1, p[6], acts.ln2_mean, acts.ln2_rstd, narrow.data(), N, C,
                            dres1, g[6], g[7]);
    });
    timed(1, kRest, [&] { add(dy.data(), N * C, dres1); });
    conv_bwd(acts.atty, gi::kProjWeight, C, C, dres1, narrow.data());
    timed(1, kAttention, [&] {
      gi::AttentionBackward(acts.qkv, acts.att, narrow.data(), d, wide.data(), tt.data());
    });
    conv_bwd(acts.ln1, gi::kAttnWeight, C, 3 * C, wide.data(), narrow.data());
    timed(1, kLayerNorm, [&] {
      gi::LayerNormBackward(x.data(), p[0], acts.ln1_mean, acts.ln1_rstd, narrow.data(), N, C,
                            dx.data(), g[0], g[1]);
    });
    timed(1, kRest, [&] { add(dres1, N * C, dx.data()); });
    if (round == 0) continue;  // warm-up
    for (int pass = 0; pass < 2; ++pass) {
      for (int part = 0; part < kNumParts; ++part) {
        samples[pass * kNumParts + part].push_back(part_ms[pass][part]);
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double med[2][kNumParts];
  for (int i = 0; i < 2 * kNumParts; ++i) med[i / kNumParts][i % kNumParts] = median(samples[i]);
  // The attention kernel's own products alone, as it runs them: per (b, h)
  // and chunk of 64 rows [r0, r1), 2 forward and 4 backward, each m x r1 x D
  // (m = r1 - r0). (The chunk is the kernel's kRowChunk.)
  constexpr int64_t kChunk = 64;
  double att_flop = 0.0;
  for (int64_t r0 = 0; r0 < T; r0 += kChunk) {
    att_flop += 2.0 * 2 * (std::min(r0 + kChunk, T) - r0) * std::min(r0 + kChunk, T) * D;
  }
  att_flop *= d.batch * d.heads;
  const double att_gemm_f = MedianMs(rounds, [&] {
    for (int64_t bh = 0; bh < d.batch * d.heads; ++bh) {
      for (int64_t r0 = 0; r0 < T; r0 += kChunk) {
        const int64_t r1 = std::min(r0 + kChunk, T), m = r1 - r0;
        Sgemm(false, true, m, r1, D, acts.qkv, 3 * C, acts.qkv + C, 3 * C, tt.data(), T);
        Sgemm(false, false, m, D, r1, tt.data(), T, acts.qkv + 2 * C, 3 * C, wide.data(), C);
      }
    }
  });
  const double att_gemm_b = MedianMs(rounds, [&] {
    for (int64_t bh = 0; bh < d.batch * d.heads; ++bh) {
      for (int64_t r0 = 0; r0 < T; r0 += kChunk) {
        const int64_t r1 = std::min(r0 + kChunk, T), m = r1 - r0;
        Sgemm(true, false, r1, D, m, tt.data(), T, narrow.data(), C, wide.data(), 3 * C);
        Sgemm(false, true, m, r1, D, narrow.data(), C, acts.qkv, 3 * C, tt.data(), r1);
        Sgemm(false, false, m, D, r1, tt.data(), r1, acts.qkv, 3 * C, wide.data(), 3 * C);
        Sgemm(true, false, r1, D, m, tt.data(), r1, acts.qkv, 3 * C, wide.data() + C, 3 * C);
      }
    }
  });
  const double conv_flop = 2.0 * N * C * 12 * C;  // one pass over the four layers
  std::printf("%s, core %s\n", openblas_get_config(), openblas_get_corename());
  std::printf("B %lld T %lld C %lld H %lld (D %lld), medians of %d rounds, ms\n",
              static_cast<long long>(d.batch), static_cast<long long>(T), static_cast<long long>(C),
              static_cast<long long>(d.heads), static_cast<long long>(D), rounds);
  std::printf("%-26s %9s %9s\n", "", "forward", "backward");
  std::printf("%-26s %9.2f %9.2f   (sum %.2f)\n", "BlockForward/Backward", fwd, bwd, fwd + bwd);
  double sum[2] = {0.0, 0.0};
  for (int pass = 0; pass < 2; ++pass) {
    for (int part = 0; part < kNumParts; ++part) sum[pass] += med[pass][part];
  }
  auto row = [&](const char* name, Part part) {
    std::printf("%-26s %9.2f %9.2f   (%4.1f%% of the parts' sum)\n", name, med[0][part],
                med[1][part], 100.0 * (med[0][part] + med[1][part]) / (sum[0] + sum[1]));
  };
  std::printf("%-26s %9.2f %9.2f\n", "parts, step by step (sum)", sum[0], sum[1]);
  row("attention kernel", kAttention);
  std::printf("%-26s %9.2f %9.2f   (alone; %.1f / %.1f GFLOP/s)\n", "  of which its sgemm",
              att_gemm_f, att_gemm_b, att_flop / att_gemm_f * 1e-6,
              2 * att_flop / att_gemm_b * 1e-6);
  row("Conv1D sgemm (4 layers)", kConv);
  std::printf("%-26s %9s %9s   (%.1f / %.1f GFLOP/s)\n", "", "", "",
              conv_flop / med[0][kConv] * 1e-6, 2 * conv_flop / med[1][kConv] * 1e-6);
  row("GELU", kGelu);
  row("LayerNorm (2)", kLayerNorm);
  row("bias, residual, sums", kRest);
  return 0;
}
