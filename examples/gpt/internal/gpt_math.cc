#include "examples/gpt/internal/gpt_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "examples/common/exp_non_positive.h"

namespace zeroshard {
namespace gpt {
namespace internal {
namespace {

using examples::ExpNonPositive;

// tanh(z) = sign(z) (1 - e) / (1 + e), e = exp(-2 |z|) in (0, 1]: no
// overflow for any z. Near 0, 1 - e loses relative accuracy, but its
// absolute error stays ~1e-7, and gelu_new only uses 1 + tanh and 1 - tanh^2,
// whose absolute error is what matters.
inline float Tanh(float z) {
  const float e = ExpNonPositive(-2.0f * std::fabs(z));
  const float t = (1.0f - e) / (1.0f + e);
  return z < 0.0f ? -t : t;
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

inline float GeluInline(float u) {
  const float t = Tanh(kGeluScale * (u + kGeluCubic * u * u * u));
  return 0.5f * u * (1.0f + t);
}

inline float GeluGradInline(float u) {
  const float u2 = u * u;
  const float t = Tanh(kGeluScale * (u + kGeluCubic * u2 * u));
  const float dz = kGeluScale * (1.0f + 3.0f * kGeluCubic * u2);
  return 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * dz;
}

// out[r, :] = bias for every row: the C operand of a beta = 1 sgemm, so that
// y = bias + x W in one pass, as torch.addmm (HF's Conv1D) computes it.
void FillRowsWithBias(const float* bias, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * cols, bias, sizeof(float) * cols);
}

// Column sums in row order (a fixed order: the same bits on every rank).
void SumRows(const float* m, int64_t rows, int64_t cols, float* sum) {
  for (int64_t c = 0; c < cols; ++c) sum[c] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = m + r * cols;
    for (int64_t c = 0; c < cols; ++c) sum[c] += row[c];
  }
}

}  // namespace

// y [rows, out] = bias + x [rows, in] W [in, out] (Conv1D).
void Conv1DForward(const float* x, const float* w, const float* bias, int64_t rows, int64_t in,
                   int64_t out, float* y) {
  FillRowsWithBias(bias, rows, out, y);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, out, in, 1.0f, x, in, w, out, 1.0f,
              y, out);
}

// Conv1D backward: dw [in, out] = x^T dy, db = column sums of dy, and, when
// dx is not null, dx [rows, in] = dy W^T. Everything overwritten.
void Conv1DBackward(const float* x, const float* w, const float* dy, int64_t rows, int64_t in,
                    int64_t out, float* dx, float* dw, float* db) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, rows, 1.0f, x, in, dy, out, 0.0f,
              dw, out);
  SumRows(dy, rows, out, db);
  if (dx != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, in, out, 1.0f, dy, out, w, out, 0.0f,
                dx, in);
  }
}

void AddInPlace(const float* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

int64_t BlockActsFloats(const GptDims& d, int tp) {
  const int64_t n = d.rows(), c = d.width, cl = c / tp;
  return n * (3 * c + 4) + n * 12 * cl + d.batch * (d.heads / tp) * d.seq * d.seq;
}

BlockActs BlockActsView(const GptDims& d, float* base, int tp) {
  const int64_t n = d.rows(), c = d.width, cl = c / tp;
  BlockActs a;
  float* p = base;
  auto take = [&p](int64_t floats) {
    float* at = p;
    p += floats;
    return at;
  };
  a.ln1 = take(n * c);
  a.ln1_mean = take(n);
  a.ln1_rstd = take(n);
  a.qkv = take(n * 3 * cl);
  a.att = take(d.batch * (d.heads / tp) * d.seq * d.seq);
  a.atty = take(n * cl);
  a.res1 = take(n * c);
  a.ln2 = take(n * c);
  a.ln2_mean = take(n);
  a.ln2_rstd = take(n);
  a.fc = take(n * 4 * cl);
  a.fc_gelu = take(n * 4 * cl);
  return a;
}

// The scratch of BlockBackward, in this order (BlockForward uses none;
// AttentionBackward called on its own uses only the first T^2 floats):
//   wide   [N, 4C]  d fc (gradient before the GELU), later d qkv [N, 3C]
//   narrow [N, C]   d ln2, later d atty, later d ln1
//   dres1  [N, C]   d a, the gradient at the first residual's output
//   datt   [T, T]   d att of one (sequence, head)'s row chunk in
//                   AttentionBackward ([min(T, 64), T] of it used)
int64_t BlockScratchFloats(const GptDims& d) {
  const int64_t n = d.rows(), c = d.width;
  return n * 6 * c + d.seq * d.seq;
}

void EmbedForward(const float* wte, const float* wpe, const int32_t* tokens, const GptDims& d,
                  float* x0) {
  const int64_t c = d.width;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < d.seq; ++t) {
      const int64_t row = b * d.seq + t;
      const float* te = wte + static_cast<int64_t>(tokens[row]) * c;
      const float* pe = wpe + t * c;
      float* out = x0 + row * c;
      for (int64_t i = 0; i < c; ++i) out[i] = te[i] + pe[i];
    }
  }
}

void EmbedBackward(const int32_t* tokens, const float* dx0, const GptDims& d, float* dwte,
                   float* dwpe) {
  const int64_t c = d.width;
  std::memset(dwte, 0, sizeof(float) * d.vocab * c);
  std::memset(dwpe, 0, sizeof(float) * d.positions * c);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < d.seq; ++t) {
      const int64_t row = b * d.seq + t;
      const float* g = dx0 + row * c;
      AddInPlace(g, c, dwte + static_cast<int64_t>(tokens[row]) * c);
      AddInPlace(g, c, dwpe + t * c);
    }
  }
}

void LayerNormForward(const float* x, const float* w, const float* b, int64_t rows, int64_t width,
                      float eps, float* out, float* mean, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * width;
    float* yr = out + r * width;
    // The row's moments in double, two passes (mean, then the squared
    // deviations): O(C) next to the blocks' O(C^2) products, and the mean
    // then carries only its final rounding, which matters for rows whose
    // spread is small next to their mean.
    double sum = 0.0;
    for (int64_t i = 0; i < width; ++i) sum += xr[i];
    const double m = sum / static_cast<double>(width);
    double sq = 0.0;
    for (int64_t i = 0; i < width; ++i) {
      const double dev = xr[i] - m;
      sq += dev * dev;
    }
    // Biased variance, eps inside the square root, as torch.nn.LayerNorm.
    const float s = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(width) + eps));
    const float mf = static_cast<float>(m);
    for (int64_t i = 0; i < width; ++i) yr[i] = (xr[i] - mf) * s * w[i] + b[i];
    mean[r] = mf;
    rstd[r] = s;
  }
}

void LayerNormBackward(const float* x, const float* w, const float* mean, const float* rstd,
                       const float* dout, int64_t rows, int64_t width, float* dx, float* dw,
                       float* db) {
  std::memset(dw, 0, sizeof(float) * width);
  std::memset(db, 0, sizeof(float) * width);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * width;
    const float* gr = dout + r * width;
    float* dxr = dx + r * width;
    const float m = mean[r], s = rstd[r];
    // With xhat = (x - mean) rstd and g = dout w:
    // dx = rstd (g - mean(g) - xhat mean(g xhat)); the row sums in double
    // as in the forward.
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t i = 0; i < width; ++i) {
      const float xhat = (xr[i] - m) * s;
      const float g = gr[i] * w[i];
      sum_g += g;
      sum_gx += g * xhat;
      dw[i] += gr[i] * xhat;
      db[i] += gr[i];
    }
    const float mean_g = static_cast<float>(sum_g / static_cast<double>(width));
    const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(width));
    for (int64_t i = 0; i < width; ++i) {
      const float xhat = (xr[i] - m) * s;
      dxr[i] = s * ((gr[i] * w[i] - mean_g) - xhat * mean_gx);
    }
  }
}

void GeluForward(const float* u, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = GeluInline(u[i]);
}

void GeluBackward(const float* u, const float* dout, int64_t n, float* du) {
  for (int64_t i = 0; i < n; ++i) du[i] = dout[i] * GeluGradInline(u[i]);
}

namespace {

// Rows of a head's scores handled together: a chunk's scores (64 x T floats,
// 128 KiB at T = 512) stay in cache from the product through the softmax to
// the next product, and a chunk reads only the keys up to its last row, so
// the products skip most of the masked upper triangle (a 0.56 share of the
// full products' work at T = 512, 0.75 at T = 128). A constant, so that
// the results depend on the sizes only.
constexpr int64_t kRowChunk = 64;

// Reductions in 8 interleaved lanes, the lanes combined in order at the end:
// a fixed order (the same bits for the same n), and the loops vectorize,
// where one chain would wait on every add's latency.
constexpr int kLanes = 8;

inline float LaneMax(const float* v, int64_t n) {
  float lane[kLanes];
  for (int l = 0; l < kLanes; ++l) lane[l] = v[0];
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] = v[j + l] > lane[l] ? v[j + l] : lane[l];
  }
  float max = lane[0];
  for (int l = 1; l < kLanes; ++l) max = lane[l] > max ? lane[l] : max;
  for (; j < n; ++j) max = v[j] > max ? v[j] : max;
  return max;
}

inline float LaneSum(const float* v, int64_t n) {
  float lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += v[j + l];
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += lane[l];
  for (; j < n; ++j) sum += v[j];
  return sum;
}

inline float LaneDot(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += a[j + l] * b[j + l];
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += lane[l];
  for (; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

}  // namespace

// Per (sequence b, head h), with Q, K, V the head's [T, D] column blocks of
// qkv (row stride 3C, read in place), per chunk of rows [r0, r1):
// S = Q[r0:r1] K[0:r1]^T / sqrt(D) into att's rows, the causal softmax per
// row (max subtracted), zeros above the diagonal, then out's rows of the
// head's [T, D] column block (row stride C) = att[r0:r1, 0:r1] V[0:r1].
void AttentionForward(const float* qkv, const GptDims& d, float* att, float* out) {
  const int64_t t_len = d.seq, c = d.width, dh = d.head_dim(), ld_qkv = 3 * c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  for (int64_t b = 0; b < d.batch; ++b) {
    const float* qkv_b = qkv + b * t_len * ld_qkv;
    for (int64_t h = 0; h < d.heads; ++h) {
      const float* q = qkv_b + h * dh;
      const float* k = qkv_b + c + h * dh;
      const float* v = qkv_b + 2 * c + h * dh;
      float* a = att + (b * d.heads + h) * t_len * t_len;
      float* o = out + b * t_len * c + h * dh;
      for (int64_t r0 = 0; r0 < t_len; r0 += kRowChunk) {
        const int64_t r1 = std::min(r0 + kRowChunk, t_len), m = r1 - r0;
        float* a_rows = a + r0 * t_len;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, dh, scale, q + r0 * ld_qkv,
                    ld_qkv, k, ld_qkv, 0.0f, a_rows, t_len);
        for (int64_t i = r0; i < r1; ++i) {
          float* row = a + i * t_len;
          const float max = LaneMax(row, i + 1);
          for (int64_t j = 0; j <= i; ++j) row[j] = ExpNonPositive(row[j] - max);
          const float inv_sum = 1.0f / LaneSum(row, i + 1);
          for (int64_t j = 0; j <= i; ++j) row[j] *= inv_sum;
          for (int64_t j = i + 1; j < t_len; ++j) row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dh, r1, 1.0f, a_rows, t_len, v,
                    ld_qkv, 0.0f, o + r0 * c, c);
      }
    }
  }
}

// Per (b, h), with P = att and dO the head's block of dout, per chunk of
// rows [r0, r1) (P is 0 right of column i, so a chunk reaches keys 0..r1-1):
//   dV[0:r1] += P[r0:r1, 0:r1]^T dO[r0:r1]; dP = dO[r0:r1] V[0:r1]^T;
//   dS = P (dP - rowsum(P dP)) (0 above the diagonal);
//   dQ[r0:r1] = dS K[0:r1] / sqrt(D); dK[0:r1] += dS^T Q[r0:r1] / sqrt(D).
// dK and dV start at 0 and sum the chunks in order. dP lives in scratch
// [chunk, r1] and becomes dS in place.
void AttentionBackward(const float* qkv, const float* att, const float* dout, const GptDims& d,
                       float* dqkv, float* scratch) {
  const int64_t t_len = d.seq, c = d.width, dh = d.head_dim(), ld_qkv = 3 * c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  float* ds = scratch;
  for (int64_t b = 0; b < d.batch; ++b) {
    const float* qkv_b = qkv + b * t_len * ld_qkv;
    float* dqkv_b = dqkv + b * t_len * ld_qkv;
    const float* dout_b = dout + b * t_len * c;
    for (int64_t h = 0; h < d.heads; ++h) {
      const float* q = qkv_b + h * dh;
      const float* k = qkv_b + c + h * dh;
      const float* v = qkv_b + 2 * c + h * dh;
      float* dq = dqkv_b + h * dh;
      float* dk = dqkv_b + c + h * dh;
      float* dv = dqkv_b + 2 * c + h * dh;
      const float* p = att + (b * d.heads + h) * t_len * t_len;
      const float* dout_h = dout_b + h * dh;
      for (int64_t t = 0; t < t_len; ++t) {
        std::memset(dk + t * ld_qkv, 0, sizeof(float) * dh);
        std::memset(dv + t * ld_qkv, 0, sizeof(float) * dh);
      }
      for (int64_t r0 = 0; r0 < t_len; r0 += kRowChunk) {
        const int64_t r1 = std::min(r0 + kRowChunk, t_len), m = r1 - r0;
        const float* p_rows = p + r0 * t_len;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, dh, m, 1.0f, p_rows, t_len,
                    dout_h + r0 * c, c, 1.0f, dv, ld_qkv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, dh, 1.0f, dout_h + r0 * c, c, v,
                    ld_qkv, 0.0f, ds, r1);
        for (int64_t i = r0; i < r1; ++i) {
          const float* prow = p + i * t_len;
          float* row = ds + (i - r0) * r1;
          const float dot = LaneDot(prow, row, i + 1);
          for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot);
          for (int64_t j = i + 1; j < r1; ++j) row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dh, r1, scale, ds, r1, k, ld_qkv,
                    0.0f, dq + r0 * ld_qkv, ld_qkv);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, dh, m, scale, ds, r1,
                    q + r0 * ld_qkv, ld_qkv, 1.0f, dk, ld_qkv);
      }
    }
  }
}

void BlockForward(const float* const* p, const GptDims& d, const float* x, const BlockActs& acts,
                  float* y, float* scratch) {
  const int64_t n = d.rows(), c = d.width;
  LayerNormForward(x, p[kLn1Weight], p[kLn1Bias], n, c, d.eps, acts.ln1, acts.ln1_mean,
                   acts.ln1_rstd);
  Conv1DForward(acts.ln1, p[kAttnWeight], p[kAttnBias], n, c, 3 * c, acts.qkv);
  AttentionForward(acts.qkv, d, acts.att, acts.atty);
  // a = x + (b_proj + atty W_proj), the residual added last as in HF.
  Conv1DForward(acts.atty, p[kProjWeight], p[kProjBias], n, c, c, acts.res1);
  AddInPlace(x, n * c, acts.res1);
  LayerNormForward(acts.res1, p[kLn2Weight], p[kLn2Bias], n, c, d.eps, acts.ln2, acts.ln2_mean,
                   acts.ln2_rstd);
  Conv1DForward(acts.ln2, p[kFcWeight], p[kFcBias], n, c, 4 * c, acts.fc);
  GeluForward(acts.fc, n * 4 * c, acts.fc_gelu);
  Conv1DForward(acts.fc_gelu, p[kFcProjWeight], p[kFcProjBias], n, 4 * c, c, y);
  AddInPlace(acts.res1, n * c, y);
}

void BlockBackward(const float* const* p, const GptDims& d, const float* x, const BlockActs& acts,
                   const float* dy, float* dx, float* const* g, float* scratch) {
  const int64_t n = d.rows(), c = d.width;
  float* wide = scratch;             // [N, 4C]: d fc, then d qkv
  float* narrow = wide + n * 4 * c;  // [N, C]: d ln2, then d atty, then d ln1
  float* dres1 = narrow + n * c;     // [N, C]
  float* datt = dres1 + n * c;       // [T, T]

  // MLP: y = a + fc_gelu W_fp + b_fp.
  Conv1DBackward(acts.fc_gelu, p[kFcProjWeight], dy, n, 4 * c, c, wide, g[kFcProjWeight],
                 g[kFcProjBias]);
  GeluBackward(acts.fc, wide, n * 4 * c, wide);
  Conv1DBackward(acts.ln2, p[kFcWeight], wide, n, c, 4 * c, narrow, g[kFcWeight], g[kFcBias]);
  LayerNormBackward(acts.res1, p[kLn2Weight], acts.ln2_mean, acts.ln2_rstd, narrow, n, c, dres1,
                    g[kLn2Weight], g[kLn2Bias]);
  AddInPlace(dy, n * c, dres1);  // the residual path

  // Attention: a = x + atty W_proj + b_proj.
  Conv1DBackward(acts.atty, p[kProjWeight], dres1, n, c, c, narrow, g[kProjWeight], g[kProjBias]);
  AttentionBackward(acts.qkv, acts.att, narrow, d, wide, datt);
  Conv1DBackward(acts.ln1, p[kAttnWeight], wide, n, c, 3 * c, narrow, g[kAttnWeight], g[kAttnBias]);
  LayerNormBackward(x, p[kLn1Weight], acts.ln1_mean, acts.ln1_rstd, narrow, n, c, dx, g[kLn1Weight],
                    g[kLn1Bias]);
  AddInPlace(dres1, n * c, dx);  // the residual path
}

void HeadForward(const float* wte, const float* x, const GptDims& d, float* logits) {
  // logits [N, V] = x [N, C] wte^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.rows(), d.vocab, d.width, 1.0f, x, d.width,
              wte, d.width, 0.0f, logits, d.vocab);
}

double CrossEntropy(float* logits, const int32_t* targets, const GptDims& d, float seed) {
  const int64_t n = d.rows(), v_len = d.vocab;
  const double inv_rows = 1.0 / static_cast<double>(n);
  const double grad_scale = static_cast<double>(seed) * inv_rows;
  double total = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    float* row = logits + r * v_len;
    float max = row[0];
    for (int64_t v = 1; v < v_len; ++v) max = row[v] > max ? row[v] : max;
    double sum = 0.0;
    for (int64_t v = 0; v < v_len; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
    const double log_sum = std::log(sum);
    const int64_t target = targets[r];
    total += log_sum - (static_cast<double>(row[target]) - max);
    for (int64_t v = 0; v < v_len; ++v) {
      const double prob = std::exp(static_cast<double>(row[v]) - max - log_sum);
      row[v] = static_cast<float>((v == target ? prob - 1.0 : prob) * grad_scale);
    }
  }
  return total * inv_rows;
}

void HeadBackward(const float* wte, const float* x, const float* dlogits, const GptDims& d,
                  float* dwte, float* dx) {
  const int64_t n = d.rows(), c = d.width, v = d.vocab;
  // dwte [V, C] = dlogits^T [V, N] x [N, C].
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, v, c, n, 1.0f, dlogits, v, x, c, 0.0f, dwte,
              c);
  // dx [N, C] = dlogits [N, V] wte [V, C].
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, c, v, 1.0f, dlogits, v, wte, c, 0.0f,
              dx, c);
}

}  // namespace internal
}  // namespace gpt
}  // namespace zeroshard
