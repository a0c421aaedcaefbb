#include "examples/mlp/cuda/cublaslt_gemm.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "examples/mlp/cuda/cuda_status.h"

namespace zeroshard {
namespace mlp {
namespace gpu {
namespace {

// RAII for the three cuBLASLt descriptors a product needs.
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

absl::Status WithContext(absl::Status status, absl::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("CublasLtGemm (", what, "): ", status.message()));
}

// A column-major layout of `rows` x `cols` stored with leading dimension ld.
absl::StatusOr<Layout> MakeLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  ZS_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows),
                                                       static_cast<uint64_t>(cols), ld));
  return Layout(raw);
}

cublasOperation_t ToCublas(Transpose t) { return t == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N; }

absl::Status CheckArgs(const RowMajorGemmArgs& g) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sizes m=", g.m, " n=", g.n, " k=", g.k, " must be positive"));
  }
  if (g.a == nullptr || g.b == nullptr || g.c == nullptr) {
    return absl::InvalidArgumentError("A, B and C must be device pointers, not null");
  }
  // Row-major: a stored row holds the second dimension of the stored matrix.
  const int64_t a_row = g.trans_a == Transpose::kNo ? g.k : g.m;
  const int64_t b_row = g.trans_b == Transpose::kNo ? g.n : g.k;
  if (g.lda < a_row || g.ldb < b_row || g.ldc < g.n) {
    return absl::InvalidArgumentError(absl::StrCat("leading dimensions lda=", g.lda, " ldb=", g.ldb,
                                                   " ldc=", g.ldc, " are below the rows (", a_row,
                                                   ", ", b_row, ", ", g.n, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CublasLtGemm>> CublasLtGemm::Create(size_t workspace_bytes) {
  cublasLtHandle_t handle = nullptr;
  ZS_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    const absl::Status alloc =
        CudaCallStatus(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc (cuBLASLt workspace)");
    if (!alloc.ok()) {
      cublasLtDestroy(handle);
      return alloc;
    }
  }
  return std::unique_ptr<CublasLtGemm>(new CublasLtGemm(handle, workspace, workspace_bytes));
}

CublasLtGemm::~CublasLtGemm() {
  // cudaFree synchronizes the device, so no enqueued product still uses the
  // workspace when it is returned.
  if (workspace_ != nullptr) cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

absl::Status CublasLtGemm::RowMajor(const RowMajorGemmArgs& g, cudaStream_t stream,
                                    absl::string_view what) {
  ZS_RETURN_IF_ERROR(WithContext(CheckArgs(g), what));
  // cuBLASLt is column-major. A row-major [r, c] matrix with leading
  // dimension ld is, read column-major, its transpose [c, r] with the same
  // ld. So row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
  // pass B as cuBLASLt's first operand and A as its second, with the same
  // transpose flags and the sizes m and n swapped. No data moves.
  const cudaDataType_t in_type = g.input_type == GemmInputType::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t op_first = ToCublas(g.trans_b);
  const cublasOperation_t op_second = ToCublas(g.trans_a);

  cublasLtMatmulDesc_t raw_desc = nullptr;
  ZS_RETURN_IF_ERROR(WithContext(
      CublasCallStatus(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                       "cublasLtMatmulDescCreate"),
      what));
  const MatmulDesc desc(raw_desc);
  ZS_RETURN_IF_ERROR(WithContext(
      CublasCallStatus(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA,
                                                      &op_first, sizeof(op_first)),
                       "cublasLtMatmulDescSetAttribute(TRANSA)"),
      what));
  ZS_RETURN_IF_ERROR(WithContext(
      CublasCallStatus(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB,
                                                      &op_second, sizeof(op_second)),
                       "cublasLtMatmulDescSetAttribute(TRANSB)"),
      what));

  // Column-major view: first operand op(.) is [n, k], second [k, m], C [n, m].
  // A stored matrix's column-major shape is its row-major shape reversed.
  const int64_t first_rows = g.trans_b == Transpose::kNo ? g.n : g.k;
  const int64_t first_cols = g.trans_b == Transpose::kNo ? g.k : g.n;
  const int64_t second_rows = g.trans_a == Transpose::kNo ? g.k : g.m;
  const int64_t second_cols = g.trans_a == Transpose::kNo ? g.m : g.k;
  absl::StatusOr<Layout> first = MakeLayout(in_type, first_rows, first_cols, g.ldb);
  ZS_RETURN_IF_ERROR(WithContext(first.status(), what));
  absl::StatusOr<Layout> second = MakeLayout(in_type, second_rows, second_cols, g.lda);
  ZS_RETURN_IF_ERROR(WithContext(second.status(), what));
  absl::StatusOr<Layout> out = MakeLayout(CUDA_R_32F, g.n, g.m, g.ldc);
  ZS_RETURN_IF_ERROR(WithContext(out.status(), what));

  cublasLtMatmulPreference_t raw_pref = nullptr;
  ZS_RETURN_IF_ERROR(WithContext(
      CublasCallStatus(cublasLtMatmulPreferenceCreate(&raw_pref), "cublasLtMatmulPreferenceCreate"),
      what));
  const Preference pref(raw_pref);
  ZS_RETURN_IF_ERROR(WithContext(
      CublasCallStatus(
          cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace_bytes_, sizeof(workspace_bytes_)),
          "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)"),
      what));

  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  ZS_RETURN_IF_ERROR(WithContext(
      CublasCallStatus(
          cublasLtMatmulAlgoGetHeuristic(handle_, desc.get(), first->get(), second->get(),
                                         out->get(), out->get(), pref.get(), 1, &heuristic, &found),
          "cublasLtMatmulAlgoGetHeuristic"),
      what));
  if (found == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(absl::StrCat(
        "CublasLtGemm (", what, "): cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k,
        g.input_type == GemmInputType::kBf16 ? " bf16" : " fp32", " inputs with ", workspace_bytes_,
        " bytes of workspace; try a larger workspace"));
  }

  const float alpha = 1.0f;
  const float beta = 0.0f;
  // beta = 0: C is only written (cuBLASLt does not read C when beta is 0).
  return WithContext(
      CublasCallStatus(cublasLtMatmul(handle_, desc.get(), &alpha, g.b, first->get(), g.a,
                                      second->get(), &beta, g.c, out->get(), g.c, out->get(),
                                      &heuristic.algo, workspace_, workspace_bytes_, stream),
                       "cublasLtMatmul"),
      what);
}

}  // namespace gpu
}  // namespace mlp
}  // namespace zeroshard
