#include "ops/sgemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <stdexcept>
#include <string>

namespace sq::ops {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (m * n * k < kOneDnnMinMacs) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(k), alpha, A, static_cast<blasint>(lda), B, static_cast<blasint>(ldb),
                beta, C, static_cast<blasint>(ldc));
    return;
  }
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw std::runtime_error("sgemm: oneDNN failed (status " + std::to_string(static_cast<int>(st)) + ") on m=" + std::to_string(m) +
                             " n=" + std::to_string(n) + " k=" + std::to_string(k) + " lda=" + std::to_string(lda) +
                             " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc));
}

}  // namespace sq::ops
