// The Walsh–Hadamard transform of rows, block-diagonal over power-of-two blocks: the rotation
// QuaRot (Ashkboos et al. 2024, §3 and §4.1) applies online to the down-projection input and folds
// into the weights elsewhere.
//
//   H_1 = [1],  H_2b = [[H_b, H_b], [H_b, −H_b]]  (Sylvester; (H_b)_ij = (−1)^popcount(i & j))
//   R_n = I_{n/b} ⊗ (H_b / √b)  for a row of width n, with b = hadamard_block(n)
//
// H_b / √b is orthogonal and symmetric, so R_n is its own inverse: y = W·x = (W·R_n)·(R_n·x). A
// width that is not a power of two gets the block-diagonal rotation of its largest power-of-two
// divisor (1536 = 3 × 512: three 512-wide Hadamards), still orthogonal and exact; it spreads an
// outlier over b channels instead of n. The fast transform (log2 b butterfly passes, b·log2 b
// additions per block) runs in FP32; each output is a ±-sum of b inputs, rounded at every pass.
#pragma once

#include <cstdint>

namespace sq::ops {

/// The block b of R_n: the largest power of two dividing n, at most `max_block` (a power of two).
/// Throws std::invalid_argument when n <= 0 or max_block is not a power of two.
int64_t hadamard_block(int64_t n, int64_t max_block = int64_t(1) << 15);

/// Throws std::invalid_argument "<what>: Hadamard block B is not a power of two dividing N" unless
/// `block` is a power of two that divides n.
void check_hadamard_block(int64_t n, int64_t block, const char* what);

/// In place: every row of x [rows, n] (row-major FP32) becomes R_n·row with blocks of `block`
/// (consecutive channels [k·b, (k+1)·b) transformed together), scaled by 1/√block; rows split over
/// OpenMP threads when there are many (the same result for any thread count). Throws
/// std::invalid_argument when block is not a power of two or does not divide n.
void hadamard_rows(float* x, int64_t rows, int64_t n, int64_t block);
/// Out of place: y [rows, n] = the rows of x rotated as hadamard_rows does (x is not modified; y
/// may be x). Same bits as copying x to y and rotating y in place.
void hadamard_rows(const float* x, float* y, int64_t rows, int64_t n, int64_t block);

/// One row: y [n] = R_n·x as hadamard_rows computes it (y may be x), on the calling thread, without
/// checks: the caller guarantees that block is a power of two dividing n (check_hadamard_block).
/// For callers that transform rows inside their own parallel loops (quant/int8_quantize.h).
void hadamard_row(const float* x, float* y, int64_t n, int64_t block);

/// In place, in double: every row of x [rows, n] (row-major) becomes R·row as above, by the
/// textbook butterflies (no vector paths; for the converter's Hessians, calib/hessian.h). Rows
/// split over OpenMP threads (the same result for any thread count). Throws as hadamard_rows.
void hadamard_rows(double* x, int64_t rows, int64_t n, int64_t block);

/// In place on the columns: every column of a [rows, cols] row-major matrix becomes R·column with
/// blocks of `block` consecutive rows (W ← R·W: the rows of a linear whose outputs are rotated).
/// Throws std::invalid_argument as hadamard_rows (block must divide rows).
void hadamard_columns(float* x, int64_t rows, int64_t cols, int64_t block);

}  // namespace sq::ops
