#include "examples/mlp/cuda/cublaslt_gemm.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "examples/mlp/cuda/cuda_status.h"
#include "examples/mlp/cuda/internal/column_major.h"

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

// The cuBLASLt layout of one stored column-major matrix.
absl::StatusOr<Layout> MakeLayout(cudaDataType_t type, const internal::ColumnMajorMatrix& m) {
  cublasLtMatrixLayout_t raw = nullptr;
  ZS_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(m.rows),
                                                       static_cast<uint64_t>(m.cols), m.ld));
  return Layout(raw);
}

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
  // cuBLASLt is column-major: internal/column_major.h maps the row-major
  // product onto it (B first, A second, m and n swapped; no data moves).
  const internal::ColumnMajorGemm cm =
      internal::ToColumnMajor(g.trans_a == Transpose::kYes, g.trans_b == Transpose::kYes, g.m, g.n,
                              g.k, g.lda, g.ldb, g.ldc);
  const cudaDataType_t in_type = g.input_type == GemmInputType::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t op_first = cm.first.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = cm.second.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;

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

  absl::StatusOr<Layout> first = MakeLayout(in_type, cm.first);
  ZS_RETURN_IF_ERROR(WithContext(first.status(), what));
  absl::StatusOr<Layout> second = MakeLayout(in_type, cm.second);
  ZS_RETURN_IF_ERROR(WithContext(second.status(), what));
  absl::StatusOr<Layout> out = MakeLayout(CUDA_R_32F, cm.out);
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
  // The heuristic assumes 256-byte aligned operands unless told otherwise;
  // an engine view at another offset would then get a kernel it cannot run.
  auto alignment = [](const void* p) {
    uint32_t a = 256;
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
    return a;
  };
  // cuBLASLt's A is our B (first), its B our A (second); C and D are g.c.
  const uint32_t aligned[4] = {alignment(g.b), alignment(g.a), alignment(g.c), alignment(g.c)};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    ZS_RETURN_IF_ERROR(
        WithContext(CublasCallStatus(cublasLtMatmulPreferenceSetAttribute(
                                         pref.get(), which[i], &aligned[i], sizeof(aligned[i])),
                                     "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)"),
                    what));
  }

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
