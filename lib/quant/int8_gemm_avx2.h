// The INT8 GEMM of CPUs with AVX2 but no INT8 dot-product instruction (Int8Backend::Avx2 of
// quant/int8_gemm.h): C[m, n] = A[m, k] · B[n, k]ᵀ with exact INT32 accumulation.
//
// Why not vpmaddubsw (what oneDNN uses on such CPUs): it adds two u8·s8 products into a saturating
// INT16, which is wrong near ±127 (docs/reliability.md). Here both operands are sign-extended to
// INT16 (vpmovsxbw; biased u8 activations a + 128 are zero-extended and 128 is subtracted) and
// multiplied with vpmaddwd, whose INT16·INT16 products are summed in pairs into INT32: |a|, |b| ≤ 128
// gives pair sums ≤ 2·128² = 32,768, far inside INT32, so every step is exact.
//
// Micro-kernel: 3 rows of A × 4 rows of B per call, 16 columns of k per step: 3 + 4 widened loads
// and 12 vpmaddwd + 12 vpaddd (12 accumulators of 8 INT32 lanes + 3 A registers + 1 B register =
// the 16 ymm registers); each accumulator is reduced horizontally once at the end, the k mod 16 tail
// added in scalar code. Blocks of 64 rows of B (≤ 64·k bytes, L2-resident) are spread over the
// OpenMP threads (dynamic), each running every row of A against its block.
// Threading as the other backends: products of at least gemm::kParallelMinMacs multiply-adds use
// omp_get_max_threads() threads unless called inside a parallel region; integer sums make the
// result independent of the split.
#pragma once

#include <cstdint>

#include "quant/int8_gemm.h"

namespace sq::int8_avx2 {

/// Whether this build was compiled with AVX2 and the CPU reports it.
bool available();

/// C[m, n] (s32) = A[m, k] · B[n, k]ᵀ, A row stride lda ≥ k (s8, values in [−127, 127]), B row-major
/// [n, k]. Exact. Throws std::logic_error when !available().
void gemm_s32(const int8_t* A, int64_t lda, const int8_t* B, int64_t m, int64_t n, int64_t k, int32_t* C);

/// y[m, n] (f32) = dq(A · Bᵀ) with dq evaluated as int8_dequant_one (bit-identical to every backend).
void gemm_f32(const int8_t* A, int64_t lda, const int8_t* B, int64_t m, int64_t n, int64_t k, const Int8Dequant& dq, float* y);

/// As gemm_f32 with A in the biased unsigned form Au = A + 128 (u8), row stride lda ≥ k.
void gemm_f32_biased(const uint8_t* Au, int64_t lda, const int8_t* B, int64_t m, int64_t n, int64_t k, const Int8Dequant& dq,
                     float* y);

}  // namespace sq::int8_avx2
