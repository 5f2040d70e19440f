#include "ops/sgemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include "ops/library_threads.h"
#include "core/immintrin_quiet.h"
#include "runtime/thread_governor.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>

namespace sq::ops {

namespace {

/// One library call, planned for one thread (ops/library_threads.h): OpenBLAS below kOneDnnMinMacs
/// multiply-adds, else oneDNN (file comment of the header).
void gemm_call(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda, const float* B,
               int64_t ldb, float beta, float* C, int64_t ldc) {
  const OneLibraryThread one;
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

/// One single-threaded OpenBLAS dgemm (oneDNN has no FP64 product).
void gemm_call(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* A, int64_t lda, const double* B,
               int64_t ldb, double beta, double* C, int64_t ldc) {
  const OneLibraryThread one;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, A, static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta,
              C, static_cast<blasint>(ldc));
}

/// Σ_k w[k] · x[k] in FP32 in one fixed order: four vector accumulators over blocks of 4 vectors,
/// then single vectors into the first, summed a0 + a1 + a2 + a3, reduced across lanes, plus the
/// scalar tail. The decode step's dot products (linear_sgemv): a row's bits do not depend on which
/// thread or block computes it. Four independent FMA chains keep the loads in flight (one chain,
/// an `omp simd` reduction, decoded SmolLM2 FP32 at 33.7–35.3 tok/s against 37–41).
float dot_f32(const float* w, const float* x, int64_t n) {
  int64_t k = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  for (; k + 64 <= n; k += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
  }
  for (; k + 16 <= n; k += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
  s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; k + 32 <= n; k += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
  }
  for (; k + 8 <= n; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
  const __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
  s = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
#endif
  float tail = 0.0f;
  for (; k < n; ++k) tail += w[k] * x[k];
  return s + tail;
}

/// Runs block(b) for b = 0 … blocks−1 over the OpenMP threads, one block at a time (dynamic: a
/// descheduled thread's blocks go to the others; in parallel only when `parallel`). The blocks'
/// library calls each plan for one thread (gemm_call), so results depend on the partition alone,
/// never on which thread runs a block. The first exception thrown by a block is rethrown on the
/// caller's thread.
template <typename Block>
void for_each_block(int64_t blocks, bool parallel, const Block& block) {
  std::exception_ptr error;
#pragma omp parallel if (parallel)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      try {
        block(b);
      } catch (...) {
#pragma omp critical(sq_sgemm_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

/// sgemm / dgemm: one call on small products or inside parallel regions, else blocks of
/// kSgemmBlock rows or columns of C (along the longer side), each one single-threaded library call:
/// oneDNN's own threading gives results that depend on the thread count (seen at 1 vs 3 threads,
/// 96 x 4096 x 576), and the team size changes with the load.
template <typename T>
void blocked_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                  T beta, T* C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  threads::adapt();  // outside parallel regions only (runtime/thread_governor.h)
  if (m * n * k < kOneDnnMinMacs || omp_get_level() > 0) {
    gemm_call(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool rows = m >= n;
  const int64_t len = rows ? m : n, blocks = (len + kSgemmBlock - 1) / kSgemmBlock;
  for_each_block(blocks, true, [&](int64_t b) {
    const int64_t at = b * kSgemmBlock, len_b = std::min(kSgemmBlock, len - at);
    if (rows)  // C[at .. at+len_b, :] = op(A)[at .. , :] · op(B)
      gemm_call(trans_a, trans_b, len_b, n, k, alpha, trans_a ? A + at : A + at * lda, lda, B, ldb, beta, C + at * ldc, ldc);
    else  // C[:, at .. at+len_b] = op(A) · op(B)[:, at ..]
      gemm_call(trans_a, trans_b, m, len_b, k, alpha, A, lda, trans_b ? B + at * ldb : B + at, ldb, beta, C + at, ldc);
  });
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float beta, float* C, int64_t ldc) {
  blocked_gemm(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* A, int64_t lda, const double* B,
           int64_t ldb, double beta, double* C, int64_t ldc) {
  blocked_gemm(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void linear_sgemm(const float* x, int64_t n, const float* W, int64_t out, int64_t in, float* y) {
  if (n <= 0 || out <= 0) return;
  threads::adapt();
  const int64_t blocks = (out + kLinearBlockRows - 1) / kLinearBlockRows;
  // Inside the region (active or not) each sgemm runs on its own thread: the library's threading
  // does not nest into an active region, and an inactive one has a single thread.
  for_each_block(blocks, n * out * in >= kOneDnnMinMacs, [&](int64_t b) {
    const int64_t o0 = b * kLinearBlockRows, m = std::min(kLinearBlockRows, out - o0);
    gemm_call(false, true, n, m, in, 1.0f, x, in, W + o0 * in, in, 0.0f, y + o0, out);
  });
}

void linear_sgemv(const float* x, const float* W, int64_t out, int64_t in, float* y) {
  if (out <= 0) return;
  threads::adapt();
  // One contiguous range of rows per thread (each thread streams its part of W in order); every
  // row is one dot_f32, so the partition does not change any bit.
#pragma omp parallel for schedule(static) if (out * in >= kOneDnnMinMacs && omp_get_level() == 0)
  for (int64_t j = 0; j < out; ++j) y[j] = dot_f32(W + j * in, x, in);
}

void ssyrk_upper(int64_t d, int64_t rows, float alpha, const float* X, int64_t ldx, float beta, float* C, int64_t ldc) {
  if (d <= 0) return;
  threads::adapt();
  const int64_t blocks = (d + kSyrkBlock - 1) / kSyrkBlock;
  for_each_block(blocks, d * d * rows / 2 >= kOneDnnMinMacs && omp_get_level() == 0, [&](int64_t i) {
    const int64_t b = blocks - 1 - i;  // the widest blocks (most rows above the diagonal) first
    const int64_t j0 = b * kSyrkBlock, w = std::min(kSyrkBlock, d - j0);
    // C[0, j0) × [j0, j0 + w) = alpha · X[:, 0:j0]ᵀ · X[:, j0:j0+w] + beta · C
    if (j0 > 0) gemm_call(true, false, j0, w, rows, alpha, X, ldx, X + j0, ldx, beta, C + j0, ldc);
    const OneLibraryThread one;
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<blasint>(w), static_cast<blasint>(rows), alpha, X + j0,
                static_cast<blasint>(ldx), beta, C + j0 * ldc + j0, static_cast<blasint>(ldc));
  });
}

}  // namespace sq::ops
