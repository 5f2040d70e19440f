// CUDA implementation of cuda/cuda_int8_gemm.h: cuBLASLt INT8 GEMM in the TN form.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/cuda_int8_gemm.h"

namespace sq::cuda {

using cuda_detail::check;
using cuda_detail::stream_of;

namespace {

/// One cuBLASLt handle per host thread (created on first use, destroyed at thread exit).
cublasLtHandle_t lt_handle() {
  struct Handle {
    cublasLtHandle_t h = nullptr;
    ~Handle() {
      if (h) cublasLtDestroy(h);
    }
  };
  thread_local Handle handle;
  if (!handle.h) check(cublasLtCreate(&handle.h), "cublasLtCreate");
  return handle.h;
}

/// RAII cublasLtMatrixLayout_t.
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, const std::string& what) {
    check(cublasLtMatrixLayoutCreate(&d, type, uint64_t(rows), uint64_t(cols), ld),
          "cublasLtMatrixLayoutCreate(" + what + " [" + std::to_string(rows) + " x " + std::to_string(cols) + "], ld " +
              std::to_string(ld) + ")");
    // Column-major is cuBLASLt's default order (CUBLASLT_ORDER_COL); no attribute needed.
  }
  ~Layout() {
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

std::string shape_name(int64_t m, int64_t n, int64_t k) {
  return "INT8 GEMM m=" + std::to_string(m) + " (padded out) n=" + std::to_string(n) + " (tokens) k=" + std::to_string(k) +
         " (padded in)";
}

}  // namespace

/// The matmul descriptor (shared by every n) and, per (n, workspace bytes), the layouts and the
/// heuristic's algorithm.
struct CublasLtInt8Gemm::Impl {
  struct Plan {
    std::unique_ptr<Layout> a, b, c;
    cublasLtMatmulAlgo_t algo{};
  };
  cublasLtMatmulDesc_t op = nullptr;
  std::map<std::pair<int64_t, size_t>, Plan> plans;

  ~Impl() {
    if (op) cublasLtMatmulDescDestroy(op);
  }

  const Plan& plan(int64_t m, int64_t k, int64_t n, size_t workspace_bytes) {
    const auto key = std::make_pair(n, workspace_bytes);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p;
    // A = Wq as column-major [k, m] (row-major [m, k]), used transposed; B = Xq as column-major
    // [k, n]; C = accᵀ column-major [m, n] (row-major acc [n, m]).
    p.a = std::make_unique<Layout>(CUDA_R_8I, k, m, k, "A = Wq");
    p.b = std::make_unique<Layout>(CUDA_R_8I, k, n, k, "B = Xq");
    p.c = std::make_unique<Layout>(CUDA_R_32I, m, n, m, "C = acc");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t st1 = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                    &workspace_bytes, sizeof workspace_bytes);
    const cublasStatus_t st2 =
        st1 != CUBLAS_STATUS_SUCCESS
            ? st1
            : cublasLtMatmulAlgoGetHeuristic(lt_handle(), op, p.a->d, p.b->d, p.c->d, p.c->d, pref, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    check(st1, "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    check(st2, "cublasLtMatmulAlgoGetHeuristic(" + shape_name(m, n, k) + ")");
    if (returned < 1 || result.state != CUBLAS_STATUS_SUCCESS)
      throw CudaError("cublasLtMatmulAlgoGetHeuristic(" + shape_name(m, n, k) + ", workspace " + std::to_string(workspace_bytes) +
                      " bytes): no INT8 algorithm (compute 32I, TN); cuBLASLt needs m, k and the leading dimensions to be "
                      "multiples of 4");
    p.algo = result.algo;
    return plans.emplace(key, std::move(p)).first->second;
  }
};

CublasLtInt8Gemm::CublasLtInt8Gemm(int64_t m_pad, int64_t k_pad) : m_pad_(m_pad), k_pad_(k_pad) {
  if (m_pad <= 0 || k_pad <= 0 || m_pad % kInt8GemmAlign != 0 || k_pad % kInt8GemmAlign != 0 || k_pad > 131072 ||
      m_pad > INT32_MAX)
    throw std::invalid_argument("CublasLtInt8Gemm: m_pad = " + std::to_string(m_pad) + " and k_pad = " + std::to_string(k_pad) +
                                " must be positive multiples of " + std::to_string(kInt8GemmAlign) + " with k_pad <= 131072");
  require_cuda("CublasLtInt8Gemm");
  impl_ = std::make_unique<Impl>();
  check(cublasLtMatmulDescCreate(&impl_->op, CUBLAS_COMPUTE_32I, CUDA_R_32I), "cublasLtMatmulDescCreate(COMPUTE_32I, R_32I)");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(impl_->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
        "cublasLtMatmulDescSetAttribute(TRANSA = T)");
  check(cublasLtMatmulDescSetAttribute(impl_->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
        "cublasLtMatmulDescSetAttribute(TRANSB = N)");
}

CublasLtInt8Gemm::~CublasLtInt8Gemm() = default;
CublasLtInt8Gemm::CublasLtInt8Gemm(CublasLtInt8Gemm&&) noexcept = default;
CublasLtInt8Gemm& CublasLtInt8Gemm::operator=(CublasLtInt8Gemm&&) noexcept = default;

void CublasLtInt8Gemm::run(const int8_t* wq, const int8_t* xq, int64_t n, int32_t* acc, void* workspace, size_t workspace_bytes,
                           Stream stream) {
  if (n < 0 || n > INT32_MAX) throw std::invalid_argument("CublasLtInt8Gemm::run: bad row count n = " + std::to_string(n));
  if (n == 0) return;
  if (!impl_) throw std::logic_error("CublasLtInt8Gemm::run on a moved-from object");
  const Impl::Plan& p = impl_->plan(m_pad_, k_pad_, n, workspace_bytes);
  const int32_t alpha = 1, beta = 0;
  check(cublasLtMatmul(lt_handle(), impl_->op, &alpha, wq, p.a->d, xq, p.b->d, &beta, acc, p.c->d, acc, p.c->d, &p.algo, workspace,
                       workspace_bytes, stream_of(stream)),
        "cublasLtMatmul(" + shape_name(m_pad_, n, k_pad_) + ")");
}

}  // namespace sq::cuda
