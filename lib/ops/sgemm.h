// FP32 (and FP64) matrix products for attention, the backward pass, GPTQ, Hessians, the dense
// linears' fallback and their decode step (CPU), with results that depend on the shapes alone.
// The dense linears' multi-row products run oneDNN's matmul primitive on a fixed weight matrix
// instead (ops/weight_matmul.h, through DenseLinear), which outpaces dnnl_sgemm at their shapes.
//
// Two libraries, chosen by size, both Debian packages:
//   - oneDNN's dnnl_sgemm for products of at least kOneDnnMinMacs multiply-adds. It picks its
//     kernels from CPUID at run time (AVX-512 where the CPU has it), so its speed does not depend on
//     how OpenBLAS was told to dispatch: an environment with OPENBLAS_CORETYPE=Haswell on an AVX-512
//     CPU runs OpenBLAS's AVX2 kernels (measured on a 2-core AMD EPYC Zen 5 at SmolLM2-135M's
//     prefill shapes, m = 512: OpenBLAS 214–256 GFLOP/s, oneDNN 396–493 GFLOP/s; docs/benchmarks.md).
//   - OpenBLAS cblas_sgemm below that size, where oneDNN's per-call dispatch (≈ 1.8 µs) costs more
//     than the product (decode-step attention: a 1 × 64 query against a few hundred keys).
// Threading: products of at least kOneDnnMinMacs called outside a parallel region are cut into
// blocks of kSgemmBlock rows or columns of C (the longer side), spread over the OpenMP threads, each
// block one single-threaded library call; called inside a parallel region they run on the calling
// thread. Every library call plans for one thread (ops/library_threads.h: OpenBLAS and oneDNN give
// bits that depend on the thread count they plan for). The partition depends on the shape alone, so
// the result does not depend on the thread count (the thread governor changes it with the load,
// runtime/thread_governor.h; users pick -t). Results may
// differ in the last bits between the two libraries and between sizes (summation order), never
// beyond FP32 rounding of the same sum.
#pragma once

#include <cstdint>

namespace sq::ops {

/// Products below this many multiply-adds (m·n·k) go to OpenBLAS, the rest to oneDNN (file comment).
inline constexpr int64_t kOneDnnMinMacs = int64_t(1) << 16;

/// C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C[m, n], all row-major FP32, where op(A) = A
/// ([m, k], leading dimension lda ≥ k) or Aᵀ (A stored [k, m], lda ≥ m), likewise op(B) = B ([k, n],
/// ldb ≥ n) or Bᵀ (B stored [n, k], ldb ≥ k); ldc ≥ n. beta = 0 ignores C's previous contents (NaN
/// included). m, n or k = 0 is a no-op apart from C = beta·C when k = 0. Throws std::runtime_error
/// naming the shape when the library reports a failure (bad leading dimension).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float beta, float* C, int64_t ldc);

/// Rows or columns of C per block of sgemm outside parallel regions (file comment).
inline constexpr int64_t kSgemmBlock = 128;

/// Output rows of W per block of linear_sgemm: balanced over 2 threads at small widths (SmolLM2's
/// 192-row k/v projections: 3 blocks) and as fast as one whole call at Gemma 3's LM head shape
/// (x[128, 640] · W[262144, 640]ᵀ, one thread, AVX2: 53.5 vs 47.6 GFLOP/s, a scratch program).
inline constexpr int64_t kLinearBlockRows = 64;

/// y[n, out] = x[n, in] · W[out, in]ᵀ, all row-major FP32 (y overwritten): a linear layer's product on
/// the plain weights. Split into blocks of kLinearBlockRows rows of W (columns of y), spread over the
/// threads (dynamic: a descheduled thread's blocks go to the others), each block one single-threaded
/// sgemm above. The partition depends on the shape alone and every block runs on one thread, so the
/// result does not depend on the thread count or on whether the caller is inside a parallel region.
/// Products below kOneDnnMinMacs run on the calling thread. Throws as sgemm.
void linear_sgemm(const float* x, int64_t n, const float* W, int64_t out, int64_t in, float* y);

/// y[out] = W[out, in] · x[in], all FP32 (y overwritten): a linear layer's decode step (one token).
/// Each output is one dot product in a fixed order (AVX-512 or AVX2 with four accumulators, else
/// scalar), the rows split into one contiguous range per thread, so the result depends on out and
/// in alone (OpenBLAS's own threading of one sgemv gave other bits at 3 threads than at 1 for
/// 640-wide rows). Products below kOneDnnMinMacs, and calls inside a parallel region, run on the
/// calling thread. SmolLM2 FP32 decode, quiet, 2 threads, sq-bench tg64 (2026-11-30): one
/// OpenBLAS-threaded sgemv 38.3–41.4 tok/s; 64-row blocks of single-threaded OpenBLAS sgemv calls
/// 37.3–38.7; this kernel: see docs/benchmarks.md "Under load, 2026-11-30".
void linear_sgemv(const float* x, const float* W, int64_t out, int64_t in, float* y);

/// The FP64 product of sgemm's contract (C[m, n] = alpha · op(A) · op(B) + beta · C, row-major), on
/// OpenBLAS's dgemm: outside parallel regions cut into blocks of kSgemmBlock rows or columns of C,
/// each one single-threaded call, so that the result depends on the shape alone. For GPTQ's
/// Hessian-weighted error and the backward pass's FP64 products. Never throws.
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* A, int64_t lda, const double* B,
           int64_t ldb, double beta, double* C, int64_t ldc);

/// Columns of C per block of ssyrk_upper.
inline constexpr int64_t kSyrkBlock = 128;

/// The upper triangle (j ≥ i) of C[d, d] = alpha · Xᵀ X + beta · C for X[rows, d] row-major (ldx ≥ d),
/// C row-major (ldc ≥ d), in FP32; the strict lower triangle is not touched. Column blocks of
/// kSyrkBlock: block [j0, j1) computes C[0, j0) × [j0, j1) by one sgemm and its diagonal block by one
/// ssyrk, each a single-threaded call, the blocks spread over the threads (dynamic, largest first),
/// so that the result depends on (rows, d) alone (OpenBLAS's threaded dsyrk gave other bits at 2
/// threads than at 1 for d = 64). The Hessians' block products of calib/hessian.h, which adds them
/// into FP64 sums (FP32 runs at twice FP64's rate with AVX-512). Never throws.
void ssyrk_upper(int64_t d, int64_t rows, float alpha, const float* X, int64_t ldx, float beta, float* C, int64_t ldc);

}  // namespace sq::ops
