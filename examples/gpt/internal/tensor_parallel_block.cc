#include "examples/gpt/internal/tensor_parallel_block.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace internal {
namespace {

enum class Split { kReplicated, kQkvColumns, kColumns, kRows };

Split SplitOf(BlockParam param) {
  switch (param) {
    case kAttnWeight:
    case kAttnBias:
      return Split::kQkvColumns;
    case kFcWeight:
    case kFcBias:
      return Split::kColumns;
    case kProjWeight:
    case kFcProjWeight:
      return Split::kRows;
    default:
      return Split::kReplicated;
  }
}

// The whole param's [rows, cols] (a bias: one row).
void ShapeOf(BlockParam param, const GptDims& d, int64_t* rows, int64_t* cols) {
  const int64_t c = d.width;
  switch (param) {
    case kAttnWeight:
      *rows = c;
      *cols = 3 * c;
      return;
    case kAttnBias:
      *rows = 1;
      *cols = 3 * c;
      return;
    case kProjWeight:
      *rows = c;
      *cols = c;
      return;
    case kFcWeight:
      *rows = c;
      *cols = 4 * c;
      return;
    case kFcBias:
      *rows = 1;
      *cols = 4 * c;
      return;
    case kFcProjWeight:
      *rows = 4 * c;
      *cols = c;
      return;
    default:
      *rows = 1;
      *cols = c;
      return;
  }
}

// For each row, the whole tensor's columns that rank `rank` holds, as
// (first column, count) runs: q, k and v parts of its heads, or one run.
std::vector<std::pair<int64_t, int64_t>> ColumnRuns(BlockParam param, const GptDims& d, int tp,
                                                    int rank) {
  int64_t rows, cols;
  ShapeOf(param, d, &rows, &cols);
  switch (SplitOf(param)) {
    case Split::kQkvColumns: {
      const int64_t part = d.width / tp;
      return {{0 * d.width + rank * part, part},
              {1 * d.width + rank * part, part},
              {2 * d.width + rank * part, part}};
    }
    case Split::kColumns:
      return {{rank * (cols / tp), cols / tp}};
    default:
      return {{0, cols}};
  }
}

// Adds `part` (N x cols) over the group in rank order, in place.
absl::Status SumOverGroup(float* part, int64_t count, Communicator& tp_group) {
  if (tp_group.size() == 1) return absl::OkStatus();
  return tp_group.AllReduceSync(part, part, count, DType::kFloat32);
}

}  // namespace

absl::Status CheckTensorParallelDims(const GptDims& d, int tp) {
  if (tp < 1 || d.heads % tp != 0 || d.width % d.heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallelism: %d heads of width %d over %d ranks: the group size must divide the "
        "heads",
        d.heads, d.width, tp));
  }
  return absl::OkStatus();
}

GptDims LocalAttentionDims(const GptDims& d, int tp) {
  GptDims local = d;
  local.heads = d.heads / tp;
  local.width = d.width / tp;
  return local;
}

int64_t TensorParallelParamNumel(BlockParam param, const GptDims& d, int tp) {
  int64_t rows, cols;
  ShapeOf(param, d, &rows, &cols);
  switch (SplitOf(param)) {
    case Split::kReplicated:
      return rows * cols;
    case Split::kRows:
      return rows / tp * cols;
    default:
      return rows * (cols / tp);
  }
}

std::vector<float> SliceBlockParam(BlockParam param, const GptDims& d, int tp, int rank,
                                   const float* full) {
  int64_t rows, cols;
  ShapeOf(param, d, &rows, &cols);
  if (SplitOf(param) == Split::kRows) {
    const int64_t share = rows / tp;
    return std::vector<float>(full + rank * share * cols, full + (rank + 1) * share * cols);
  }
  std::vector<float> out;
  out.reserve(TensorParallelParamNumel(param, d, tp));
  const auto runs = ColumnRuns(param, d, tp, rank);
  for (int64_t r = 0; r < rows; ++r) {
    for (const auto& [first, count] : runs) {
      out.insert(out.end(), full + r * cols + first, full + r * cols + first + count);
    }
  }
  return out;
}

std::vector<float> JoinBlockParam(BlockParam param, const GptDims& d, int tp,
                                  const std::vector<std::vector<float>>& shares) {
  int64_t rows, cols;
  ShapeOf(param, d, &rows, &cols);
  if (SplitOf(param) == Split::kReplicated) return shares[0];
  std::vector<float> full(rows * cols);
  if (SplitOf(param) == Split::kRows) {
    const int64_t share = rows / tp * cols;
    for (int rank = 0; rank < tp; ++rank) {
      std::memcpy(full.data() + rank * share, shares[rank].data(), share * sizeof(float));
    }
    return full;
  }
  for (int rank = 0; rank < tp; ++rank) {
    const auto runs = ColumnRuns(param, d, tp, rank);
    const float* src = shares[rank].data();
    for (int64_t r = 0; r < rows; ++r) {
      for (const auto& [first, count] : runs) {
        std::memcpy(full.data() + r * cols + first, src, count * sizeof(float));
        src += count;
      }
    }
  }
  return full;
}

int64_t TensorParallelScratchFloats(const GptDims& d, int tp) {
  const int64_t n = d.rows(), c = d.width;
  return n * 4 * (c / tp) + 2 * n * c + d.seq * d.seq;
}

absl::Status TensorParallelBlockForward(const float* const* p, const GptDims& d, const float* x,
                                        const BlockActs& acts, float* y, Communicator& tp_group) {
  const int tp = tp_group.size();
  ZS_RETURN_IF_ERROR(CheckTensorParallelDims(d, tp));
  const GptDims local = LocalAttentionDims(d, tp);
  const int64_t n = d.rows(), c = d.width, cl = local.width;
  const bool first = tp_group.rank() == 0;
  // The row-parallel products' bias goes into rank 0's partial only, as
  // the C operand of its sgemm (one rank: BlockForward's Conv1DForward).
  const std::vector<float> zeros(c, 0.0f);
  LayerNormForward(x, p[kLn1Weight], p[kLn1Bias], n, c, d.eps, acts.ln1, acts.ln1_mean,
                   acts.ln1_rstd);
  Conv1DForward(acts.ln1, p[kAttnWeight], p[kAttnBias], n, c, 3 * cl, acts.qkv);
  AttentionForward(acts.qkv, local, acts.att, acts.atty);
  Conv1DForward(acts.atty, p[kProjWeight], first ? p[kProjBias] : zeros.data(), n, cl, c,
                acts.res1);
  ZS_RETURN_IF_ERROR(SumOverGroup(acts.res1, n * c, tp_group));
  AddInPlace(x, n * c, acts.res1);
  LayerNormForward(acts.res1, p[kLn2Weight], p[kLn2Bias], n, c, d.eps, acts.ln2, acts.ln2_mean,
                   acts.ln2_rstd);
  Conv1DForward(acts.ln2, p[kFcWeight], p[kFcBias], n, c, 4 * cl, acts.fc);
  GeluForward(acts.fc, n * 4 * cl, acts.fc_gelu);
  Conv1DForward(acts.fc_gelu, p[kFcProjWeight], first ? p[kFcProjBias] : zeros.data(), n, 4 * cl, c,
                y);
  ZS_RETURN_IF_ERROR(SumOverGroup(y, n * c, tp_group));
  AddInPlace(acts.res1, n * c, y);
  return absl::OkStatus();
}

absl::Status TensorParallelBlockBackward(const float* const* p, const GptDims& d, const float* x,
                                         const BlockActs& acts, const float* dy, float* dx,
                                         float* const* g, float* scratch, Communicator& tp_group) {
  const int tp = tp_group.size();
  ZS_RETURN_IF_ERROR(CheckTensorParallelDims(d, tp));
  const GptDims local = LocalAttentionDims(d, tp);
  const int64_t n = d.rows(), c = d.width, cl = local.width;
  float* wide = scratch;              // [N, 4C/tp]: d fc, then d qkv
  float* narrow = wide + n * 4 * cl;  // [N, C]: d ln2, then d atty, then d ln1
  float* dres1 = narrow + n * c;      // [N, C]
  float* datt = dres1 + n * c;        // [T, T]

  // MLP: y = a + sum over ranks of fc_gelu W_fp (+ b_fp).
  Conv1DBackward(acts.fc_gelu, p[kFcProjWeight], dy, n, 4 * cl, c, wide, g[kFcProjWeight],
                 g[kFcProjBias]);
  GeluBackward(acts.fc, wide, n * 4 * cl, wide);
  Conv1DBackward(acts.ln2, p[kFcWeight], wide, n, c, 4 * cl, narrow, g[kFcWeight], g[kFcBias]);
  ZS_RETURN_IF_ERROR(SumOverGroup(narrow, n * c, tp_group));  // d ln2 over the hidden units
  LayerNormBackward(acts.res1, p[kLn2Weight], acts.ln2_mean, acts.ln2_rstd, narrow, n, c, dres1,
                    g[kLn2Weight], g[kLn2Bias]);
  AddInPlace(dy, n * c, dres1);

  // Attention: a = x + sum over ranks of atty W_proj (+ b_proj).
  Conv1DBackward(acts.atty, p[kProjWeight], dres1, n, cl, c, narrow, g[kProjWeight], g[kProjBias]);
  AttentionBackward(acts.qkv, acts.att, narrow, local, wide, datt);
  Conv1DBackward(acts.ln1, p[kAttnWeight], wide, n, c, 3 * cl, narrow, g[kAttnWeight],
                 g[kAttnBias]);
  ZS_RETURN_IF_ERROR(SumOverGroup(narrow, n * c, tp_group));  // d ln1 over the heads
  LayerNormBackward(x, p[kLn1Weight], acts.ln1_mean, acts.ln1_rstd, narrow, n, c, dx, g[kLn1Weight],
                    g[kLn1Bias]);
  AddInPlace(dres1, n * c, dx);
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace gpt
}  // namespace zeroshard
