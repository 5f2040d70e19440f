// W4A16 linear layer on a CUDA device (host: model/w4a16_linear.h; group-wise INT4 weights of
// GPTQ [Frantar et al. 2022] / AWQ, layouts in quant/int4_quantize.h), FP32 activations and output:
//
//   y[i, r] = Σ_c x[i, c] · W'[r, c],   W'[r, c] = Δ[r, c/g] · (q[r, c] − z[r, c/g])   (z = 0 symmetric)
//                                        or Δ[r, c/g] · q[r, c] + m[r, c/g]         (float minimum: Q4_1 / Q4_K)
//
// The weights are uploaded exactly as stored — packed [out, in/2] bytes (low nibble = even column),
// FP16 scales [out, ⌈in/g⌉], flat-packed U4 zero points (asymmetric) or FP16 minimums [out, ⌈in/g⌉]
// (float minimum; a K-quant file's Δ and m as expanded from its super-block heads at load,
// quant/q4k_layout.h) — and are never expanded to
// FP32/FP16 in global memory; each kernel decodes the elements it needs with the functions of
// cuda/quant_element.h (W' is exact in FP32). A ragged last group (g ∤ in) needs no padding: the
// group of column c is c / g.
//   - n == 1 (decode) — GEMV: one warp per output row; lane l accumulates bytes l, l + 32, … of the
//     row (two columns each, fma in column order, qe::int4_row_partial_dot), then a butterfly
//     warp reduction. 8 rows per 256-thread block.
//   - n > 1 — tiled GEMM: a block computes 64 output rows × 16 tokens; per chunk of 64 input
//     columns it dequantizes the W' tile [64 × 64] into shared memory (FP32) and stages the X tile
//     [16 × 64], then each thread accumulates 4 rows × 1 token with fmaf in column order. Written to
//     be obviously correct, not fast; every output is the sequential fma dot product over c = 0 … in−1,
//     i.e. qe::int4_row_partial_dot(first = 0, stride = 1).
// Both orders are replayed bit-exactly on the CPU by the tests.
#pragma once

#include <memory>
#include <string>

#include "cuda/cuda_linear.h"
#include "quant/int4_quantize.h"

namespace sq::cuda {

/// Uploads group-wise INT4 weights (validated by validate_int4; g ∈ {32, 64, 128}, in even) as a
/// device linear whose format() is `format` (the host layer's, e.g. "w4a16-g128-sym").
/// Throws std::invalid_argument for inconsistent weights; UnsupportedError without CUDA or device;
/// CudaError when the device runs out of memory.
std::unique_ptr<DeviceLinear> make_w4a16_device_linear(const Int4Weights& w, const std::string& format);

}  // namespace sq::cuda
