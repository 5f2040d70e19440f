// Q4_K quantization (the two-level 4-bit layout of GGML's Q4_K, quant/q4k_layout.h) with an
// importance-weighted search, in three steps per row and super-block of 8 groups of 32 columns:
//
//  1. each group's continuous (Δ_j, m_j) of w ≈ Δ·u + m, u ∈ [0, 15], m ≤ 0: the min/max rule
//     (lo = min(min w, 0), Δ = (max w − lo)/15, m = lo) and the candidates of calib/gptq.h's
//     asymmetric search (each end of the range pulled in by 0 … 25 % in steps of 5 %), each followed
//     by the weighted least-squares fit of (Δ, m) to its codes; the lowest importance-weighted error
//     E = Σ_k a_k (w_k − ŵ_k)² wins;
//  2. the super-block's d and dmin from the largest Δ_j and −m_j: d = max Δ_j / t, dmin = max(−m_j) / t',
//     t, t' ∈ {63, 62, …, 59}, each kept to 5 significant bits and stored as FP16 (so every d · sc
//     with sc < 64 is an exact FP16 value, which sqkit's FP16-scale kernels need; quant/q4k_layout.h);
//     sc_j = round(Δ_j / d), mi_j = round(−m_j / dmin), clamped to [0, 63]; the codes
//     u = clamp(round((w − m_j) / Δ_j), 0, 15) with the quantized Δ_j = d·sc_j, m_j = −dmin·mi_j; the
//     (t, t') pair with the lowest E over the super-block wins;
//  3. each group's (sc_j, mi_j) is then moved by ±1 where that lowers its E (the codes recomputed).
//
// Steps 2–3 run once from the min/max rule's (Δ_j, m_j) and once from the searched ones; the
// super-block keeps the lower E, so the result is never worse than the plain min/max Q4_K rule.
// Peers: llama.cpp's quantize_row_q4_K with an imatrix (make_qkx3_quants; its d and dmin are
// FP16 without the 5-bit restriction), which this follows in spirit, not in code.
#pragma once

#include <cstdint>
#include <string>

#include "quant/int4_quantize.h"

namespace sq {

/// Quantizes W [out, in] (row-major FP32, nn.Linear layout) to K-quant Int4Weights (g = 32, float
/// minimum, superblock_scales; the last super-block of a row is shorter when 256 ∤ in) by the
/// file comment's search. `importance` [in] (per input column a_k ≥ 0, e.g. the calibration's Σx²)
/// or null for uniform weights; a group whose importance is all zero uses uniform weights. Rows run
/// in parallel (OpenMP); the result does not depend on the thread count.
/// Throws std::invalid_argument naming `name` for a bad shape (check_int4_shape with g = 32), NaN/inf
/// weights or importance, or a range too large for FP16 (|w| ≳ 2·10⁶).
Int4Weights quantize_q4k(const float* W, int64_t out, int64_t in, const double* importance, const std::string& name);

/// Σ_k a_k (W − Ŵ)² over all of W [out, in] with Ŵ = dequantize_int4(q) (a = importance, uniform when
/// null), in double: the objective quantize_q4k minimizes (tests, reports).
double weighted_squared_error(const float* W, const Int4Weights& q, const double* importance);

}  // namespace sq
